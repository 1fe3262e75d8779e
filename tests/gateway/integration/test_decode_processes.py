"""A gateway decoding in worker processes (``--decode-processes 2``) beside the session's
gateway, which decodes in threads, in front of the same store: the same features at every
split of both models, a worker killed mid-request fails that request with a clear 503 and
nothing else, the next request is served, and no shared-memory segment outlives it."""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from skimage import data as samples

from hapi.protocol import decode_features
from tests.support import (
    RunningGateway,
    encode_image,
    kill_the_busy_one,
    signed_headers,
    store_gateway,
)

SHM = Path("/dev/shm")


def _workers(pid: int) -> list[int]:
    """The gateway's decode workers: its spawned children (not the resource tracker)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline:
                found.append(int(child))
    return found


def _slots() -> set[str]:
    return {p.name for p in SHM.iterdir() if p.name.startswith("psm_")}


@pytest.fixture(scope="module")
def process_gateway(store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with store_gateway(
        store,
        tmp_path_factory.mktemp("process-gateway"),
        extra_args=("--decode-processes", "2", "--no-cache-enabled"),
    ) as running:
        yield running


def _get(gw: RunningGateway, bucket: str, key: str, model: str, split: int) -> httpx.Response:
    path = f"/{bucket}/{key}?hapi-model={model}&hapi-split={split}&hapi-cache=bypass"
    return httpx.get(
        gw.endpoint_url + path, headers=signed_headers(gw, "GET", path, body=b""), timeout=300
    )


def _features(reply: httpx.Response) -> np.ndarray:
    assert reply.status_code == 200, reply.text
    tensors, _ = decode_features(reply.content)
    return np.asarray(tensors["features"])


def test_features_equal_the_threads_at_every_split(
    gateway, process_gateway, registered, backend_s3, unique_bucket
) -> None:
    backend_s3.put_object(
        Bucket=unique_bucket, Key="cat.jpg", Body=encode_image(samples.chelsea(), "JPEG")
    )
    backend_s3.put_object(
        Bucket=unique_bucket, Key="coffee.png", Body=encode_image(samples.coffee(), "PNG")
    )
    assert len(_workers(process_gateway.pid)) == 2  # the workers run
    for model, manifest in (("r18", registered["r18"]), ("enl0", registered["enl0"])):
        for split in range(manifest.freeze + 1):
            for key in ("cat.jpg", "coffee.png"):
                threads = _features(_get(gateway, unique_bucket, key, model, split))
                processes = _features(_get(process_gateway, unique_bucket, key, model, split))
                np.testing.assert_array_equal(processes, threads, err_msg=f"{model} {split}")


def test_a_worker_killed_mid_request_fails_that_request_only(
    gateway, process_gateway, registered, backend_s3, unique_bucket
) -> None:
    rng = np.random.default_rng(0)
    big = rng.integers(0, 255, (3000, 4000, 3), dtype=np.uint8)  # a PNG slow to decode
    backend_s3.put_object(Bucket=unique_bucket, Key="big.png", Body=encode_image(big, "PNG"))
    backend_s3.put_object(
        Bucket=unique_bucket, Key="cat.jpg", Body=encode_image(samples.chelsea(), "JPEG")
    )
    for _ in range(4):  # every worker past its start-up
        _features(_get(process_gateway, unique_bucket, "cat.jpg", "r18", 0))
    workers = _workers(process_gateway.pid)
    replies: dict[str, httpx.Response] = {}
    slow = threading.Thread(
        target=lambda: replies.update(big=_get(process_gateway, unique_bucket, "big.png", "r18", 2))
    )
    slow.start()
    busy = kill_the_busy_one(workers, slow, ticks=5, polls=6000)  # it decodes the big one
    slow.join(300)
    failed = replies["big"]
    assert failed.status_code == 503 and failed.headers["retry-after"] == "1"
    error = ET.fromstring(failed.content)
    assert error.findtext("Code") == "ServiceUnavailable"
    assert "decode worker" in (error.findtext("Message") or "")
    assert "big.png" in (error.findtext("Message") or "")
    # the pool recovered: the same request is served, and equals the threads' answer
    again = _features(_get(process_gateway, unique_bucket, "cat.jpg", "r18", 2))
    np.testing.assert_array_equal(
        again, _features(_get(gateway, unique_bucket, "cat.jpg", "r18", 2))
    )
    retried = _features(_get(process_gateway, unique_bucket, "big.png", "r18", 2))
    assert retried.shape[0] == 1
    assert busy not in _workers(process_gateway.pid)
    assert len(_workers(process_gateway.pid)) == 2


def test_no_segment_outlives_the_gateway(store, tmp_path_factory) -> None:
    before = _slots()
    with store_gateway(
        store, tmp_path_factory.mktemp("short-gateway"), extra_args=("--decode-processes", "3")
    ) as running:
        assert len(_workers(running.pid)) == 3
        assert len(_slots() - before) == 3  # a slot per worker
    assert not _slots() - before


def test_the_workers_decode_below_the_requests(process_gateway) -> None:
    def nice(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])

    workers = _workers(process_gateway.pid)
    assert len(workers) == 2
    # compute_niceness and decode_niceness at their defaults: 10 and 5 steps further.
    assert {nice(w) for w in workers} == {min(19, nice(process_gateway.pid) + 10 + 5)}
