"""A client that goes away mid-shard cancels its work.

Before: after a client disconnected mid-shard, the batcher still ran the remaining 666
samples and decoding went on for 11.6 s. Asserted here from the gateway's own counters
(samples decoded, abandoned, run), not from timings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import RunningGateway, signed_headers, store_gateway

from ._pushdown_support import png_shard, put_many, signed_get, stats, tiny_png

BUCKET = "adversarial-disconnect"
MEMBERS = 600


@pytest.fixture(scope="module")
def gateway(
    store: Any, registered: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    with store_gateway(store, tmp_path_factory.mktemp("gateway-disconnect")) as running:
        yield running


@pytest.fixture(scope="module")
def bucket(backend_s3: Any) -> str:
    backend_s3.create_bucket(Bucket=BUCKET)
    put_many(backend_s3, BUCKET, {"shard.tar": png_shard(MEMBERS), "one.png": tiny_png()})
    return BUCKET


def _wait_for(condition: Any, what: str, limit_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        current = condition()
        if current:
            return current  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def _run_samples(figures: dict[str, Any]) -> int:
    return sum(t["samples"] for t in figures["tenants"])


def test_a_client_leaving_mid_shard_cancels_its_samples(gateway, bucket):
    warm = signed_get(gateway, f"/{bucket}/one.png?hapi-model=r18&hapi-split=6")
    assert warm.status_code == 200, warm.text
    before = stats(gateway)
    path = f"/{bucket}/shard.tar?hapi-model=r18&hapi-split=6"
    url, headers = gateway.endpoint_url + path, signed_headers(gateway, "GET", path)
    with httpx.Client(timeout=120) as client, client.stream("GET", url, headers=headers) as reply:
        assert reply.status_code == 200
        next(reply.iter_raw())  # the first window's rows are on their way: leave now

    def counted(figures: dict[str, Any], name: str) -> int:
        return int(figures["requests"][name] - before["requests"][name])

    # A sample whose decoding had started when the client left is counted decoded when its
    # thread finishes, which may be after the cancellation is counted: wait until every
    # sample is counted one way or the other (a sample lost never gets there; one counted
    # twice fails the equality below).
    after = _wait_for(
        lambda: (
            counted(s := stats(gateway), "requests_cancelled") > 0
            and all(t["queue_depth"] == 0 for t in s["tenants"])
            and counted(s, "samples_decoded") + counted(s, "samples_abandoned") >= MEMBERS
            and s
        ),
        "the gateway to notice the disconnect and count every sample",
    )
    decoded = counted(after, "samples_decoded")
    abandoned = counted(after, "samples_abandoned")
    assert 0 < decoded < MEMBERS / 2  # decoding stopped at the next sample
    assert abandoned == MEMBERS - decoded  # the rest were never decoded
    # What the batcher ran for this request is at most what was decoded, and nothing of
    # it is still queued; another request is served next.
    assert _run_samples(after) - _run_samples(before) <= decoded
    again = signed_get(gateway, f"/{bucket}/one.png?hapi-model=r18&hapi-split=6")
    assert again.status_code == 200, again.text
    assert _run_samples(stats(gateway)) - _run_samples(before) <= decoded + 1
