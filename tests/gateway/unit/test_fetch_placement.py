"""Pushdown's object fetches counted by placement: local, remote or unknown, from an injected
placement lookup; a slow lookup never delays a fetch, a failing one never fails it."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from asgi_lifespan import LifespanManager

from hapi.gateway import ClientKey, GatewaySettings, create_app
from hapi.gateway._metrics import Metrics
from hapi.gateway._server import startup_block
from hapi.gateway.pushdown._locality import FetchMeter, node_hosts, placement_of
from hapi.models import Manifest
from hapi.protocol import Credentials
from tests.gateway.support import (
    CLIENT,
    GATEWAY,
    OBJECTS,
    MemoryRegistry,
    client_signed,
    memory_store,
)
from tests.planner.synthetic import manifest as synthetic_manifest

NODE = "10.0.0.11:8080"  # this gateway's node, as its volume server advertises it


class FakePlacement:
    """Hosts per key; ``gate`` (when given) holds every lookup until it is set."""

    def __init__(
        self, hosts: dict[str, tuple[str, ...]], gate: threading.Event | None = None
    ) -> None:
        self.hosts = hosts
        self.gate = gate
        self.asked: list[str] = []
        self.closed = False

    def locate(self, bucket: str, key: str) -> tuple[str, ...]:
        if self.gate is not None:
            assert self.gate.wait(10), "the test never let the lookup answer"
        self.asked.append(key)
        return self.hosts.get(key, ())

    def forget(self, bucket: str, key: str) -> None:
        self.hosts.pop(key, None)

    def close(self) -> None:
        self.closed = True


class BrokenPlacement(FakePlacement):
    def locate(self, bucket: str, key: str) -> tuple[str, ...]:
        raise RuntimeError("the filer fell over")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _count(metrics: Metrics, placement: str, name: str = "hapi_pushdown_object_fetches") -> float:
    value = metrics.registry.get_sample_value(f"{name}_total", {"placement": placement})
    assert value is not None, f"no {name} series for placement {placement}"
    return value


def _counts(metrics: Metrics) -> dict[str, float]:
    return {where: _count(metrics, where) for where in ("local", "remote", "unknown")}


def test_node_hosts_take_hosts_addresses_and_urls() -> None:
    assert node_hosts("10.0.0.11:8080, http://Node-1.example:8080,10.0.0.12") == {
        "10.0.0.11",
        "node-1.example",
        "10.0.0.12",
    }
    assert node_hosts("") == frozenset()


@pytest.mark.parametrize(
    ("hosts", "node", "where"),
    [
        (("10.0.0.11",), {"10.0.0.11"}, "local"),
        (("10.0.0.12", "10.0.0.11"), {"10.0.0.11"}, "local"),  # a replica here is local
        (("10.0.0.12",), {"10.0.0.11"}, "remote"),
        ((), {"10.0.0.11"}, "unknown"),  # the lookup has no answer
        (("10.0.0.12",), set(), "unknown"),  # this node's address is not configured
    ],
)
def test_a_fetch_is_placed_by_the_hosts_of_its_object(
    hosts: tuple[str, ...], node: set[str], where: str
) -> None:
    assert placement_of(hosts, frozenset(node)) == where


async def _fetch(meter: FetchMeter, key: str, size: int) -> None:
    """What pushdown's fetch does: look up beside the read, count once the body is in."""
    located = meter.locate("data", key)
    await asyncio.sleep(0)  # the body is read meanwhile
    meter.fetched(located, size)


async def _settled(metrics: Metrics, total: float) -> None:
    for _ in range(500):
        if sum(_counts(metrics).values()) >= total:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fetches counted: {_counts(metrics)}, expected {total}")


@pytest.mark.anyio
async def test_fetches_and_their_bytes_are_counted_by_placement() -> None:
    metrics = Metrics()
    placement = FakePlacement({"here.jpg": ("10.0.0.11",), "there.jpg": ("10.0.0.12",)})
    meter = FetchMeter(metrics, placement, NODE)
    for key, size in (("here.jpg", 100), ("there.jpg", 30), ("there.jpg", 30), ("new.jpg", 5)):
        await _fetch(meter, key, size)
    await _settled(metrics, 4)
    assert _counts(metrics) == {"local": 1, "remote": 2, "unknown": 1}
    bytes_ = "hapi_pushdown_object_fetch_bytes"
    assert [_count(metrics, w, bytes_) for w in ("local", "remote", "unknown")] == [100, 60, 5]


@pytest.mark.anyio
@pytest.mark.parametrize("configured", ["no placement", "no node address"])
async def test_without_a_placement_or_a_node_address_every_fetch_is_unknown(
    configured: str,
) -> None:
    metrics = Metrics()
    placement = FakePlacement({"there.jpg": ("10.0.0.12",)})
    if configured == "no placement":
        meter = FetchMeter(metrics, None, NODE)
    else:
        meter = FetchMeter(metrics, placement, "")
    await _fetch(meter, "there.jpg", 7)
    assert _counts(metrics) == {"local": 0, "remote": 0, "unknown": 1}  # counted at once
    assert placement.asked == []  # nothing to compare with: the store is not asked


@pytest.mark.anyio
async def test_a_slow_lookup_never_delays_the_fetch() -> None:
    metrics = Metrics()
    gate = threading.Event()
    meter = FetchMeter(metrics, FakePlacement({"there.jpg": ("10.0.0.12",)}, gate), NODE)
    try:
        await asyncio.wait_for(_fetch(meter, "there.jpg", 9), timeout=2)
        assert sum(_counts(metrics).values()) == 0  # not yet: the lookup has not answered
    finally:
        gate.set()
    await _settled(metrics, 1)
    assert _counts(metrics)["remote"] == 1


@pytest.mark.anyio
async def test_a_failing_lookup_counts_unknown_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    meter = FetchMeter(metrics, BrokenPlacement({}), NODE)
    with caplog.at_level(logging.WARNING, logger="hapi.gateway"):
        for _ in range(3):
            await _fetch(meter, "there.jpg", 1)
        await _settled(metrics, 3)
    assert _counts(metrics) == {"local": 0, "remote": 0, "unknown": 3}
    assert [r.getMessage() for r in caplog.records if "placement" in r.getMessage()] == [
        "placement lookup failed (RuntimeError('the filer fell over')); its fetches count "
        "as unknown"
    ]


def _runner(manifest: Manifest, split: int) -> Callable[[np.ndarray], np.ndarray]:
    shape = tuple(manifest.blocks[split - 1].output_shape)
    return lambda batch: np.zeros((len(batch), *shape), dtype=np.float32)


def _settings(**changes: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "backend_url": "http://store.internal:8333",
        "backend_credentials": Credentials("BACKENDKEY", "backend-secret"),
        "clients": {CLIENT[0]: ClientKey(CLIENT[1])},
        "device": "cpu",
    }
    return GatewaySettings(**{**values, **changes})


@pytest.mark.anyio
@pytest.mark.parametrize(("holder", "where"), [("10.0.0.11", "local"), ("10.0.0.12", "remote")])
async def test_the_gateway_counts_a_pushdown_fetch_where_its_object_is(
    holder: str, where: str
) -> None:
    placement = FakePlacement({"cat.png": (holder,)})
    app = create_app(
        _settings(node_address=NODE),
        upstream=httpx.AsyncClient(transport=httpx.MockTransport(memory_store)),
        registry=MemoryRegistry(synthetic_manifest(freeze=4)),
        runner=_runner,
        placement=placement,
    )
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app)) as http,
    ):
        url = GATEWAY + "/data/cat.png?hapi-model=synthetic&hapi-split=2"
        reply = await http.get(url, headers=client_signed("GET", url))
        assert reply.status_code == 200, reply.text
        await _settled(app.metrics, 1)
    assert _counts(app.metrics) == {**dict.fromkeys(("local", "remote", "unknown"), 0), where: 1}
    size = _count(app.metrics, where, "hapi_pushdown_object_fetch_bytes")
    assert size == len(OBJECTS["/data/cat.png"])
    assert placement.asked == ["cat.png"] and not placement.closed  # the caller's to close


def test_a_bad_placement_spec_stops_the_settings_naming_it() -> None:
    with pytest.raises(ValueError, match=r"placement 'ceph:x=1' \(HAPI_PLACEMENT\): unknown"):
        _settings(placement="ceph:x=1")
    with pytest.raises(ValueError, match=r"HAPI_PLACEMENT.*needs master=URL"):
        _settings(placement="seaweedfs:filer=http://filer:8888")
    settings = _settings(placement="seaweedfs:filer=http://f:8888,master=http://m:9333")
    assert settings.placement.startswith("seaweedfs:")


def test_the_startup_block_says_the_placement_and_this_node() -> None:
    spec = "seaweedfs:filer=http://f:8888,master=http://m:9333"
    closed = "http://127.0.0.1:9"  # the block asks the backend: a port nothing listens on

    def block(**changes: Any) -> str:
        return startup_block(_settings(backend_url=closed, **changes), "http://gw:8080")

    assert (
        f"  placement:       {spec} (this node: {NODE})"
        in block(placement=spec, node_address=NODE).splitlines()
    )
    assert "no node address: every fetch counts as unknown" in block(placement=spec)
    assert "placement:" not in block()
