"""Bandwidth probe and the gateway's view, against httpx.MockTransport (no network)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from hapi.planner import (
    GatewayProfile,
    ProbeError,
    fetch_gateway_profile,
    plan,
    probe_bandwidth,
)
from tests.planner.synthetic import manifest, r18

GATEWAY = "http://gateway.test"


def _slow_zeros(size: int, seconds: float) -> Iterator[bytes]:
    chunks = 10
    for index in range(chunks):
        time.sleep(seconds / chunks)
        yield bytes(size // chunks + (size % chunks if index == chunks - 1 else 0))


def test_probe_times_parallel_streams() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/_hapi/probe"
        size = int(request.url.params["bytes"])
        with lock:
            seen.append(size)
        # 1 MB per stream in 0.2 s: 4 streams in parallel carry 4 MB in 0.2 s = 160 Mbit/s.
        body = _slow_zeros(size, 0.2 if size > 1 else 0.0)
        return httpx.Response(200, content=body)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        bits = probe_bandwidth(GATEWAY, bytes=4_000_000, streams=4, client=client)
    assert sorted(seen) == [1, 1, 1, 1, 1_000_000, 1_000_000, 1_000_000, 1_000_000]
    assert 60e6 < bits < 170e6  # one stream after another would be 40 Mbit/s


def _paced(size: int, bytes_per_s: float) -> Iterator[bytes]:
    step = 64 * 1024
    for offset in range(0, size, step):
        chunk = min(step, size - offset)
        time.sleep(chunk / bytes_per_s)
        yield bytes(chunk)


def test_probe_sizes_itself_to_the_link() -> None:
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        size = int(request.url.params["bytes"])
        sizes.append(size)
        return httpx.Response(200, content=_paced(size, 5e6))  # 5 MB/s per stream

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        bits = probe_bandwidth(GATEWAY, client=client, seconds=0.25)
    # Connections, then 512 KiB to size the real probe of about 0.25 s at 4 x 5 MB/s.
    assert sizes[:4] == [1] * 4 and sizes[4:8] == [128 * 1024] * 4
    assert 2e6 / 4 < sizes[8] < 6e6 / 4 and len(sizes) == 12
    assert 80e6 < bits < 170e6


def test_probe_cut_short_is_an_error() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=b"\0"))
    with httpx.Client(transport=transport) as client, pytest.raises(ProbeError, match="sent 1 "):
        probe_bandwidth(GATEWAY, bytes=1000, streams=2, client=client)


def test_probe_of_something_else_says_so() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(403, content=b"<Error/>"))
    with (
        httpx.Client(transport=transport) as client,
        pytest.raises(ProbeError, match=r"HTTP 403 \(is it a hapi gateway\?\)"),
    ):
        probe_bandwidth(GATEWAY, client=client)


def test_probe_of_nothing_says_so() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with (
        httpx.Client(transport=httpx.MockTransport(refuse)) as client,
        pytest.raises(ProbeError, match=r"bandwidth probe at http://gateway\.test: Connect"),
    ):
        probe_bandwidth(GATEWAY, client=client)


def _model_json(served: list[dict]) -> dict:
    """What ``GET /_hapi/models/synthetic`` answers (``hapi.models.ModelProfile``)."""
    model = manifest(freeze=4)
    return {
        "name": "synthetic",
        "version": 1,
        "ref": "synthetic@1",
        "family": "custom",
        "freeze": 4,
        "blocks": [dataclasses.asdict(block) for block in model.blocks],
        "bytes": model.size,
        "parent": None,
        "created": "",
        "preprocess": model.preprocess.to_dict(),
        "served": served,
    }


def _tenant(served_as: list[str], ms: float | None, samples: int, queued: int = 0) -> dict:
    return {
        "blocks": served_as[0].replace(":", "[0:") + "]",
        "served_as": [
            {"model": ref, "split": int(split)} for ref, split in (s.split(":") for s in served_as)
        ],
        "weights_bytes": 1000,
        "per_sample_bytes": 2000,
        "max_batch_size": 64,
        "queue_depth": queued,
        "batches": 3,
        "samples": samples,
        "oom_events": 0,
        "samples_per_s": 10.0,
        "ms_per_sample": ms,
        "recent_batch_sizes": [4],
        "mean_batch_size": 4.0,
    }


def _stats(tenants: list[dict], active: int) -> dict:
    return {
        "memory_budget": {
            "total_bytes": 1_000_000_000,
            "weights_bytes": 100_000_000,
            "source": "configured",
            "active_tenants": active,
            "share_bytes": 900_000_000 // max(1, active),
        },
        "tenants": tenants,
    }


def _transport(model: dict, stats: dict) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/_hapi/models/synthetic":
            return httpx.Response(200, json=model)
        if request.url.path == "/_hapi/stats":
            return httpx.Response(200, json=stats)
        return httpx.Response(404, content=b"<Error><Code>NoSuchModel</Code></Error>")

    return httpx.MockTransport(handler)


def test_gateway_view_is_calibrated_on_real_traffic() -> None:
    # The manifest says blocks [0, 2) take 7 ms and [0, 3) 11 ms per sample; real traffic
    # took twice that: 14 ms over 100 samples and 22 ms over 300.
    ours = [_tenant(["synthetic@1:2"], 14.0, 100), _tenant(["synthetic@1:3"], 22.0, 300)]
    other = _tenant(["other@1:5"], 3.0, 50, queued=7)
    model = _model_json(ours)
    stats = _stats([*ours, other], active=2)
    with httpx.Client(transport=_transport(model, stats)) as client:
        view = fetch_gateway_profile(GATEWAY, "synthetic", client=client)
    assert view.model == "synthetic@1"
    assert view.served == {2: (14.0, 100), 3: (22.0, 300)}
    assert view.calibration == pytest.approx(2.0)
    assert view.storage_ms[:3] == pytest.approx((6.0, 8.0, 8.0))
    assert view.memory_bytes == 900_000_000 // 3
    assert view.busy_tenants == 1 and view.storage_load == 2.0

    synthetic, profile = r18()
    applied = view.apply(profile)
    assert applied.storage_ms == pytest.approx(tuple(2 * ms for ms in profile.client_ms))
    assert applied.client_ms == profile.client_ms
    assert applied.storage_memory_bytes == 300_000_000 and applied.storage_load == 2.0
    assert plan(synthetic, applied, 1e9).profile is applied


def test_gateway_view_of_an_unserved_model_is_the_manifest() -> None:
    model = _model_json([])
    with httpx.Client(transport=_transport(model, _stats([], active=0))) as client:
        view = fetch_gateway_profile(GATEWAY, "synthetic", client=client)
    assert view.calibration == 1.0 and view.served == {}
    assert view.storage_ms == tuple(block["cpu_ms"] for block in model["blocks"])
    assert view.busy_tenants == 0 and view.storage_load == 1.0
    assert view.memory_bytes == 900_000_000


def test_gateway_view_errors() -> None:
    with (
        httpx.Client(transport=_transport({}, {})) as client,
        pytest.raises(ProbeError, match="HTTP 404"),
    ):
        fetch_gateway_profile(GATEWAY, "unknown", client=client)
    broken = httpx.MockTransport(lambda request: httpx.Response(200, json={"no": "ref"}))
    with (
        httpx.Client(transport=broken) as client,
        pytest.raises(ProbeError, match="unexpected answer"),
    ):
        fetch_gateway_profile(GATEWAY, "synthetic", client=client)


def test_gateway_profile_is_a_value() -> None:
    view = GatewayProfile(model="m@1", cpu_ms=(1.0,), served={}, memory_bytes=None, busy_tenants=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.busy_tenants = 3  # type: ignore[misc]
