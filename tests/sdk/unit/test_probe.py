"""Bandwidth probe and the gateway's view, against httpx.MockTransport (no network)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from hapi.planner import GatewayProfile, InvalidInput, plan, profile_from_manifest
from hapi.protocol import StorageProfile
from hapi.sdk import ProbeError, fetch_gateway_profile, probe_bandwidth
from tests.planner.synthetic import manifest, r18

GATEWAY = "http://gateway.test"


class _Link:
    """A virtual link of ``bytes_per_s`` shared by every stream: each chunk served moves
    the clock on by its transfer time, so the probe's figures do not depend on how busy
    the machine running the test is."""

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s, self.now = bytes_per_s, 0.0
        self._lock = threading.Lock()

    def clock(self) -> float:
        with self._lock:
            return self.now

    def carry(self, size: int) -> Iterator[bytes]:
        step = 64 * 1024
        for offset in range(0, size, step):
            chunk = min(step, size - offset)
            with self._lock:
                self.now += chunk / self.bytes_per_s
            yield bytes(chunk)


def test_probe_runs_its_streams_in_parallel() -> None:
    seen: list[int] = []
    lock = threading.Lock()
    # every big stream waits here until all four are open: one after another, it breaks
    together = threading.Barrier(4, timeout=30)

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/_hapi/probe"
        size = int(request.url.params["bytes"])
        with lock:
            seen.append(size)
        if size > 1:
            together.wait()
        return httpx.Response(200, content=link.carry(size))

    link = _Link(20e6)
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        bits = probe_bandwidth(GATEWAY, bytes=4_000_000, streams=4, client=client, clock=link.clock)
    assert sorted(seen) == [1, 1, 1, 1, 1_000_000, 1_000_000, 1_000_000, 1_000_000]
    assert bits == pytest.approx(160e6)  # 4 MB over a 20 MB/s link


def test_probe_is_sized_in_time_never_in_bytes() -> None:
    asked: list[int] = []
    carried = [0]
    link = _Link(20e6)  # 160 Mbit/s

    def handler(request: httpx.Request) -> httpx.Response:
        size = int(request.url.params["bytes"])
        asked.append(size)

        def counted() -> Iterator[bytes]:
            for chunk in link.carry(size):
                carried[0] += len(chunk)
                yield chunk

        return httpx.Response(200, content=counted())

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        bits = probe_bandwidth(GATEWAY, client=client, seconds=0.25, clock=link.clock)
    # Connections, then four streams that may run to the gateway's cap but hang up after
    # 0.25 s of the link: 5 MB at 20 MB/s, give or take a chunk per stream.
    assert asked[:4] == [1] * 4 and len(asked) == 8
    assert 5_000_000 <= carried[0] - 4 <= 5_000_000 + 4 * 64 * 1024
    assert bits == pytest.approx(160e6, rel=0.06)


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


def _model_json(served: list[dict], storage: dict | None = None) -> dict:
    """What ``GET /_hapi/models/synthetic`` answers (``hapi.protocol.ModelProfile``)."""
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
        "storage": storage or _storage({}, None),
    }


def _storage(measured: dict[int, float], decode_ms: float | None, available: float = 1.0) -> dict:
    """A served storage profile: ``measured`` block ms by index, the rest the manifest's."""
    cpu_ms = [block.cpu_ms for block in manifest(freeze=4).blocks[:4]]

    def block(index: int) -> dict:
        if index in measured:
            figure = {"ms": measured[index], "source": "measured", "samples": 64, "age_s": 3.0}
            return {"block": index, "device": "cpu", "batch": 0, "clock": "cpu", **figure}
        return {"block": index, "device": "cpu", "ms": cpu_ms[index], "source": "manifest"}

    decode = None
    if decode_ms is not None:
        decode = {"ms": decode_ms, "source": "measured", "samples": 64, "age_s": 2.0}
    load = {"available": 1.0, "source": "manifest"}
    if available != 1.0:
        load = {"available": available, "source": "measured", "samples": 12, "age_s": 1.0}
    return {"blocks": [block(i) for i in range(4)], "decode": decode, "load": load}


def _tenant(
    served_as: list[str], ms: float | None, samples: int, queued: int = 0, busy: float = 0.0
) -> dict:
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
        "busy_share": busy,
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


def test_gateway_view_takes_measured_blocks_and_scales_the_others() -> None:
    # The manifest says blocks 0 and 1 take 3 and 4 ms per sample; they were measured at
    # twice that. Blocks 2 and 3 never ran: the manifest's figure, scaled by the same 2x.
    ours = [_tenant(["synthetic@1:2"], 30.0, 100)]
    other = _tenant(["other@1:5"], 3.0, 50, queued=7)
    model = _model_json(ours, _storage({0: 6.0, 1: 8.0}, decode_ms=4.5, available=0.5))
    stats = _stats([*ours, other], active=2)
    with httpx.Client(transport=_transport(model, stats)) as client:
        view = fetch_gateway_profile(GATEWAY, "synthetic", client=client)
    assert view.model == "synthetic@1"
    assert view.scale == pytest.approx(2.0)
    assert view.storage_ms == pytest.approx((6.0, 8.0, 8.0, 6.0))
    assert view.memory_bytes == 900_000_000 // 3
    assert view.busy_tenants == 1 and view.storage_load == 2.0

    synthetic = manifest(freeze=4)
    profile = profile_from_manifest(synthetic)
    applied = view.apply(profile)
    assert applied.storage_ms == pytest.approx((6.0, 8.0, 8.0, 6.0))
    assert applied.storage_decode_ms == 4.5
    assert applied.storage_available == 0.5
    assert applied.storage_memory_bytes == 300_000_000 and applied.storage_load == 2.0
    origin = applied.storage_origin
    assert "blocks 0-1 measured on cpu (at least 64 samples each, 3 s old)" in origin
    assert "blocks 2-3 from the manifest (x2.00" in origin
    assert "decode 4.50 ms measured (64 samples, 2 s old)" in origin
    assert "50% of a core available (measured, 1 s old)" in origin
    assert origin in plan(synthetic, applied, 1e9).explain()


@pytest.mark.parametrize(
    ("change", "factor"),
    [
        ({"storage_available": 0.5}, 2.0),  # half a core for the gateway's host
        ({"storage_load": 1.9}, 1.9),  # another job's work on the device
    ],
)
def test_a_loaded_storage_side_is_slower_and_its_pick_moves_to_the_client(change, factor) -> None:
    synthetic, profile = r18()
    quiet = plan(synthetic, profile, 1e9, batch_size=8)
    loaded = plan(synthetic, replace(profile, **change), 1e9, batch_size=8)
    for a, b in zip(quiet.candidates, loaded.candidates, strict=True):
        assert b.storage_ms == pytest.approx(factor * a.storage_ms)
        assert b.client_ms == a.client_ms
    assert (loaded.split or 0) <= (quiet.split or 0)  # never more blocks on the storage side


def test_no_availability_is_refused() -> None:
    _, profile = r18()
    with pytest.raises(InvalidInput, match="storage_available"):
        replace(profile, storage_available=0.0)


def test_another_job_of_the_same_model_is_a_busy_tenant() -> None:
    # A second training job of this very model keeps the batcher queued: a new job
    # shares the storage side with it (its view is taken before it sends anything).
    # Counting only other models' queues showed the planner an idle storage side.
    ours = [_tenant(["synthetic@1:2"], 30.0, 100, queued=16)]
    model = _model_json(ours, _storage({0: 6.0, 1: 8.0}, decode_ms=4.5, available=1.0))
    with httpx.Client(transport=_transport(model, _stats(ours, active=1))) as client:
        view = fetch_gateway_profile(GATEWAY, "synthetic", client=client)
    assert view.busy_tenants == 1 and view.storage_load == 2.0


def test_a_job_keeping_the_device_busy_between_requests_is_a_busy_tenant() -> None:
    # A second job that sends its next request when its last is answered leaves the
    # queue empty at most reads of it, while its batches fill 80% of the device's time.
    # A queue-only view showed the planner an idle storage side under that job.
    ours = [_tenant(["synthetic@1:2"], 30.0, 100, busy=0.8)]
    idle = _tenant(["other@1:5"], 3.0, 50, busy=0.01)
    queued = _tenant(["other@1:3"], 3.0, 50, queued=2, busy=0.3)
    model = _model_json(ours, _storage({0: 6.0, 1: 8.0}, decode_ms=4.5, available=1.0))
    for tenants, busy, load in (
        ([*ours, idle], 1, 1.8),  # the idle tenant's 1% is noise, not a job
        ([*ours, idle, queued], 2, 2.8),  # a queued tenant takes a turn at every batch
        ([idle], 0, 1.0),
    ):
        with httpx.Client(transport=_transport(model, _stats(tenants, active=1))) as client:
            view = fetch_gateway_profile(GATEWAY, "synthetic", client=client)
        assert view.busy_tenants == busy
        assert view.storage_load == pytest.approx(load)
        applied = view.apply(profile_from_manifest(manifest(freeze=4)))
        assert applied.storage_load == pytest.approx(load)
        assert (f"priced x{load:.2f}" in view.origin()) == (busy > 0)


def test_gateway_view_of_an_unserved_model_is_the_manifest() -> None:
    model = _model_json([])
    with httpx.Client(transport=_transport(model, _stats([], active=0))) as client:
        view = fetch_gateway_profile(GATEWAY, "synthetic", client=client)
    assert view.scale == 1.0
    assert view.storage_ms == tuple(block["cpu_ms"] for block in model["blocks"][:4])
    assert view.busy_tenants == 0 and view.storage_load == 1.0
    assert view.memory_bytes == 900_000_000
    profile = profile_from_manifest(manifest(freeze=4))
    assert view.apply(profile).storage_decode_ms == profile.storage_decode_ms  # not measured
    assert "decode not measured" in view.origin() and "unscaled" in view.origin()


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
    storage = StorageProfile.model_validate(_storage({}, None))
    view = GatewayProfile(
        model="m@1", cpu_ms=(1.0,), storage=storage, memory_bytes=None, busy_tenants=0
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.busy_tenants = 3  # type: ignore[misc]
