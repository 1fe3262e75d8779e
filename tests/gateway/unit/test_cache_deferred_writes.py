"""The feature cache's entry writes wait for the pushdown requests being served to end, so
that a cold epoch's PUTs take the storage side's idle time: at most
``cache_write_defer_s``, and not once the write queue is three quarters full."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from hapi.gateway import ClientKey, GatewaySettings
from hapi.gateway._metrics import Metrics
from hapi.gateway._store import StoreClient
from hapi.gateway.pushdown import _cache
from hapi.gateway.pushdown._cache import FeatureCache
from hapi.protocol import (
    PACK_HEAD,
    Credentials,
    ObjectIdentity,
    pack_index_length,
    pack_prefix,
    parse_pack_index,
)
from tests.planner.synthetic import manifest as synthetic_manifest

_NO_PACKS = b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"/>'


class _Store:
    """A store that records when each entry arrives, in the pack PUT that holds it (the
    event loop's clock), and lists no pack."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, float]] = []  # (entry path, when its pack came)
        self.packs = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT" and "/packs/" in request.url.path:
            body, at = request.content, time.monotonic()
            index = body[PACK_HEAD : PACK_HEAD + pack_index_length(body)]
            self.puts += [(path, at) for path in parse_pack_index(index)]
            self.packs += 1
        if request.method == "GET" and "list-type" in request.url.params:
            return httpx.Response(200, content=_NO_PACKS)
        return httpx.Response(200)


def _cache_with(
    store: Callable[[httpx.Request], httpx.Response],
    busy: Callable[[], bool],
    metrics: Metrics | None = None,
    **changes: Any,
) -> FeatureCache:
    settings = GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        clients={"K": ClientKey("s")},
        **changes,
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(store))
    return FeatureCache(settings, StoreClient.of(settings, lambda: client), metrics, busy=busy)


def _queue_and_stop(cache: FeatureCache, names: dict[int, str]) -> None:
    """Queue a 100-byte entry of each named object at its split (while requests are being
    served, so they wait), then stop the cache: it writes what waits, packed."""
    manifest = synthetic_manifest(freeze=4)

    async def main() -> None:
        async with cache.running():
            for split, keys in names.items():
                for name in keys:
                    identity = ObjectIdentity(bucket="b", key=name, etag=name, size=1)
                    assert cache.store(identity, manifest, split, "float32", b"x" * 100)

    asyncio.run(main())


def _queue(cache: FeatureCache, name: str) -> bool:
    identity = ObjectIdentity(bucket="b", key=name, etag=name, size=1)
    return cache.store(identity, synthetic_manifest(freeze=4), 1, "float32", b"x" * 100)


def test_a_write_waits_for_the_requests_being_served_to_end(monkeypatch) -> None:
    monkeypatch.setattr(_cache, "IDLE_POLL_S", 0.005)
    store, serving = _Store(), [True]

    async def main() -> tuple[float, float]:
        cache = _cache_with(store, lambda: serving[0])
        async with cache.running():
            assert _queue(cache, "a") and _queue(cache, "b")
            await asyncio.sleep(0.2)
            assert store.puts == []  # requests are being served: nothing written
            ended = time.monotonic()
            serving[0] = False
            await asyncio.wait_for(cache.drain(), 5)
            return ended, cache.deferred_writes

    ended, deferred = asyncio.run(main())
    assert len(store.puts) == 2 and all(at >= ended for _, at in store.puts)
    assert store.packs == 1  # the two waited together: one PUT
    assert deferred >= 1


def test_a_write_goes_ahead_after_its_longest_wait(monkeypatch) -> None:
    monkeypatch.setattr(_cache, "IDLE_POLL_S", 0.005)
    store = _Store()

    async def main() -> float:
        cache = _cache_with(store, lambda: True, cache_write_defer_s=0.15)
        async with cache.running():
            queued = time.monotonic()
            assert _queue(cache, "a")
            await asyncio.wait_for(cache.drain(), 5)
            return queued

    queued = asyncio.run(main())
    (_, at), *_ = store.puts
    assert at - queued >= 0.15


def test_a_queue_three_quarters_full_writes_at_once(monkeypatch) -> None:
    # Deferring further would make the next writes be skipped: entries are worth more
    # written under load than computed again next epoch.
    monkeypatch.setattr(_cache, "IDLE_POLL_S", 0.005)
    store = _Store()

    async def main() -> tuple[list[bool], int]:
        cache = _cache_with(store, lambda: True, cache_write_queue=4, cache_write_defer_s=60.0)
        async with cache.running():
            queued = [_queue(cache, name) for name in "abcd"]
            await asyncio.sleep(0.3)
            return queued, len(store.puts)

    queued, written = asyncio.run(main())
    assert queued == [True, True, True, True]
    # The writer took "a" off the queue (3 left = three quarters of 4), so it was written
    # at once, with the three waiting behind it in its pack.
    assert written == 4 and len(store.puts) == 4 and store.packs == 1


@pytest.mark.parametrize("defer", [0.0, 30.0])
def test_no_wait_when_nothing_is_served_or_waiting_is_off(monkeypatch, defer) -> None:
    store = _Store()
    busy = defer == 0.0  # with 0, even a busy gateway writes at once

    async def main() -> None:
        cache = _cache_with(store, lambda: busy, cache_write_defer_s=defer)
        async with cache.running():
            assert _queue(cache, "a")
            await asyncio.wait_for(cache.drain(), 1)

    asyncio.run(main())
    assert len(store.puts) == 1


def test_a_negative_wait_is_refused() -> None:
    with pytest.raises(ValueError, match="cache_write_defer_s"):
        GatewaySettings(
            backend_url="http://store.internal:8333",
            backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
            clients={"K": ClientKey("s")},
            cache_write_defer_s=-1.0,
        )


def test_the_gateway_is_idle_only_after_a_quiet_spell(monkeypatch) -> None:
    # The gaps between one job's requests are not idle time: writing an entry there would
    # take the storage core from the job's next request.
    from concurrent.futures import ThreadPoolExecutor

    from hapi.gateway.pushdown import _tenants
    from hapi.gateway.pushdown._batcher import MemoryBudget

    clock = [100.0]
    monkeypatch.setattr(_tenants.time, "monotonic", lambda: clock[0])
    with ThreadPoolExecutor(1) as pool:
        tenants = _tenants.Tenants(None, MemoryBudget(10**9), pool)  # type: ignore[arg-type]
        clock[0] += 1.0
        assert not tenants.is_serving()  # never served: idle
        with tenants.serving_one():
            with tenants.serving_one():
                assert tenants.is_serving()
            assert tenants.is_serving()  # one still served
        clock[0] += _tenants.QUIET_S / 2
        assert tenants.is_serving()  # a gap between requests
        clock[0] += _tenants.QUIET_S
        assert not tenants.is_serving()
        with pytest.raises(RuntimeError), tenants.serving_one():
            raise RuntimeError("a request that fails still ends")
        assert tenants.serving == 0 and tenants.is_serving()


def test_a_queued_entry_answers_lookups_before_it_is_written() -> None:
    # An epoch that follows at once finds its entries still waiting to be written: it must
    # not compute them again (nor ask the store for them).
    import numpy as np

    store, gets = _Store(), []

    def transport(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            gets.append(str(request.url))
        return store(request)

    cache = _cache_with(transport, lambda: True)
    manifest = synthetic_manifest(freeze=4)
    identity = ObjectIdentity(bucket="b", key="a.jpg", etag="e1", size=1)
    rows = np.arange(12, dtype=np.float32).reshape(1, 12)
    entry = _cache.encode_entry(rows, "float32", None, ["a.jpg"], None)

    async def main() -> tuple[Any, Any]:
        async with cache.running():
            missed = await cache.lookup(identity, manifest, 1, "float32")
            assert cache.store(identity, manifest, 1, "float32", entry)
            found = await cache.lookup(identity, manifest, 1, "float32")
            other = ObjectIdentity(bucket="b", key="a.jpg", etag="e2", size=1)  # overwritten
            assert await cache.lookup(other, manifest, 1, "float32") is None
            assert store.puts == []  # still waiting: requests are being served
            return missed, found

    missed, found = asyncio.run(main())
    assert missed is None and found is not None
    assert found.keys == ["a.jpg"] and np.array_equal(found.features, rows)
    # the first miss lists the context's packs (none); the hit and the overwritten
    # object's miss, within INDEX_TTL_S of it, ask the store nothing
    assert len(gets) == 1 and "list-type=2" in gets[0]
    assert len(store.puts) == 1  # a stopping cache writes what still waits


def test_a_stopping_cache_writes_what_waits_for_idle_time(monkeypatch) -> None:
    store = _Store()

    async def main() -> None:
        cache = _cache_with(store, lambda: True)
        async with cache.running():
            assert _queue(cache, "a") and _queue(cache, "b")
            await asyncio.sleep(0.1)
            assert store.puts == []

    asyncio.run(main())
    assert len(store.puts) == 2


@pytest.mark.parametrize("bound", [150, 250, 10_000])
def test_the_entries_waiting_together_go_in_one_pack_a_context_within_its_bound(
    monkeypatch, bound
) -> None:
    # Five entries of 100 bytes for split 1 and three for split 2 (another context): each
    # context's entries in packs of their own, none over the byte bound but for an entry
    # alone, and every entry written once.
    monkeypatch.setattr(_cache, "PACK_BYTES", bound)
    requests: list[httpx.Request] = []
    store = _Store()

    def transport(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            requests.append(request)
        return store(request)

    _queue_and_stop(_cache_with(transport, lambda: True), {1: "abcde", 2: "xyz"})
    packs = [r for r in requests if "/packs/" in r.url.path]
    prefixes = {r.url.path.rsplit("/", 1)[0] for r in packs}
    assert len(prefixes) == 2  # a prefix a context
    assert len(store.puts) == 8 and len({path for path, _ in store.puts}) == 8
    for request in packs:
        members = len(
            parse_pack_index(request.content[PACK_HEAD:][: pack_index_length(request.content)])
        )
        assert members == 1 or 100 * members <= bound
    per_pack = max(1, bound // 100)
    assert len(packs) == -(-5 // per_pack) + -(-3 // per_pack)


@pytest.mark.parametrize("refusal", ["HTTP 500", "connection dropped"])
def test_a_pack_that_fails_counts_its_entries_failed_and_the_others_written(refusal) -> None:
    store = _Store()
    refused_split: dict[str, str] = {}

    def transport(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT" and request.url.path.startswith(refused_split["prefix"]):
            if refusal == "HTTP 500":
                return httpx.Response(500)
            raise httpx.ReadError("the store went away mid-reply", request=request)
        return store(request)

    manifest, metrics = synthetic_manifest(freeze=4), Metrics()
    cache = _cache_with(transport, lambda: True, metrics)
    context = _cache._context("b", manifest, 2, "float32", None)
    bucket = GatewaySettings.cache_bucket  # the default
    refused_split["prefix"] = f"/{bucket}/{pack_prefix(_cache._context_digest(context))}"

    _queue_and_stop(cache, {1: "ab", 2: "xyz"})
    counted = {
        outcome: metrics.cache_writes.labels(manifest.name, outcome)._value.get()
        for outcome in ("written", "failed")
    }
    assert counted == {"written": 2, "failed": 3}  # split 1's pack in, split 2's refused
    assert len(store.puts) == 2
