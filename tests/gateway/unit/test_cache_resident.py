"""Packs this gateway wrote, kept in memory (``cache_memory_bytes``): their entries' hits
read nothing from the store while the store was seen holding the pack less than
``INDEX_TTL_S`` ago (then one hit reads its entry from the store again, and a pack found
gone leaves memory), the memory holds at most its bytes (the least recently written go
first, and are then read from the store), and a pack deleted from the store leaves memory
when this gateway evicts it, lists its context without it, or touches it and finds it
gone. Against a store (a mock transport) that keeps what is PUT, as a store does."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np
import pytest

from hapi.gateway import ClientKey, GatewaySettings
from hapi.gateway._store import StoreClient
from hapi.gateway.pushdown import _cache
from hapi.gateway.pushdown._cache import FeatureCache
from hapi.protocol import Credentials, ObjectIdentity
from tests.gateway.support import listing
from tests.planner.synthetic import manifest as synthetic_manifest

MANIFEST = synthetic_manifest(freeze=4)
ROWS = np.arange(12, dtype=np.float32).reshape(1, 12)
ENTRY = _cache.encode_entry(ROWS, "float32", None, ["x"], None)


class _Store:
    """Objects by key, kept as PUT; counts the GETs of entries (ranges past a pack's
    head, or whole objects)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.entry_reads = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.split("/", 2)
        key = parts[2] if len(parts) > 2 else ""
        if request.method == "HEAD":
            return httpx.Response(200)
        if request.method == "DELETE":
            self.objects.pop(key, None)
            return httpx.Response(204)
        if request.method == "PUT":
            if "x-amz-copy-source" in request.headers:  # a touch: a copy onto itself
                return httpx.Response(200 if key in self.objects else 404)
            if key:
                self.objects[key] = request.content
            return httpx.Response(200)
        if "list-type" in request.url.params:
            sizes = {key: len(body) for key, body in self.objects.items()}
            return listing(sizes, request.url.params["prefix"])
        if key not in self.objects:
            return httpx.Response(404)
        body = self.objects[key]
        first, _, last = request.headers["range"].removeprefix("bytes=").partition("-")
        if first != "0":
            self.entry_reads += 1
        return httpx.Response(206, content=body[int(first) : int(last) + 1])


def _cache_over(store: _Store, **changes: object) -> FeatureCache:
    config = GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        clients={"K": ClientKey("s")},
        cache_write_defer_s=0.0,
    ).with_changes(**changes)
    client = httpx.AsyncClient(transport=httpx.MockTransport(store))
    return FeatureCache(config, StoreClient.of(config, lambda: client))


def _identity(name: str, bucket: str = "b") -> ObjectIdentity:
    return ObjectIdentity(bucket=bucket, key=name, etag=name, size=1)


async def _written(cache: FeatureCache, names: list[str], bucket: str = "b") -> None:
    """``names``' entries queued and written (one pack for them)."""
    for name in names:
        assert cache.store(_identity(name, bucket), MANIFEST, 1, "float32", ENTRY)
    await cache.drain()


def _hits(cache: FeatureCache, names: list[str], bucket: str = "b") -> list[bool]:
    async def main() -> list[bool]:
        found = [await cache.lookup(_identity(n, bucket), MANIFEST, 1, "float32") for n in names]
        return [f is not None and np.array_equal(f.features, ROWS) for f in found]

    return asyncio.run(main())


@pytest.mark.parametrize("memory", [0, 1 << 20])
def test_hits_on_a_pack_written_here_read_the_store_only_without_memory(memory: int) -> None:
    store = _Store()
    cache = _cache_over(store, cache_memory_bytes=memory)
    names = [f"n{index}" for index in range(5)]

    async def main() -> None:
        async with cache.running():
            await _written(cache, names)

    asyncio.run(main())
    assert _hits(cache, names) == [True] * 5
    assert store.entry_reads == (0 if memory else 5)
    assert cache.resident_bytes == (sum(map(len, store.objects.values())) if memory else 0)


def _age(cache: FeatureCache) -> None:
    """Every copy in memory last seen in the store longer ago than ``INDEX_TTL_S``."""
    for held in cache._resident.values():
        held.seen -= _cache.INDEX_TTL_S + 1


def test_an_old_copy_is_seen_in_the_store_again_by_one_read_and_dropped_once_gone() -> None:
    store = _Store()
    cache = _cache_over(store)
    names = [f"n{index}" for index in range(4)]

    async def main() -> None:
        async with cache.running():
            await _written(cache, names)

    asyncio.run(main())
    _age(cache)
    assert _hits(cache, names) == [True] * 4
    assert store.entry_reads == 1  # the first hit saw the pack still there; the rest: memory
    store.objects.clear()  # deleted behind this gateway
    _age(cache)
    assert _hits(cache, names) == [False] * 4  # the first found it gone, and the index forgot it
    assert cache.resident_bytes == 0 and store.entry_reads == 1


def test_memory_holds_its_bytes_and_the_least_recently_written_go_first() -> None:
    store = _Store()
    probe = _cache_over(store)

    async def pack_size() -> int:
        async with probe.running():
            await _written(probe, ["p"], bucket="probe")
        return probe.resident_bytes

    size = asyncio.run(pack_size())
    cache = _cache_over(store, cache_memory_bytes=2 * size)  # two one-entry packs fit

    async def main() -> None:
        async with cache.running():
            for bucket in ("b1", "b2", "b3"):  # one context, so one pack, a bucket
                await _written(cache, ["x"], bucket=bucket)
                assert cache.resident_bytes <= 2 * size

    asyncio.run(main())
    assert cache.resident_bytes == 2 * size
    assert _hits(cache, ["x"], bucket="b2") + _hits(cache, ["x"], bucket="b3") == [True, True]
    assert store.entry_reads == 0
    assert _hits(cache, ["x"], bucket="b1") == [True]  # dropped from memory: read from the store
    assert store.entry_reads == 1


def test_a_pack_larger_than_the_memory_is_not_held() -> None:
    store = _Store()
    cache = _cache_over(store, cache_memory_bytes=64)  # less than any pack

    async def main() -> None:
        async with cache.running():
            await _written(cache, ["a", "b"])

    asyncio.run(main())
    assert cache.resident_bytes == 0
    assert _hits(cache, ["a", "b"]) == [True, True] and store.entry_reads == 2


def test_a_pack_this_gateway_evicts_is_not_served_from_memory() -> None:
    store = _Store()
    cache = _cache_over(store, cache_max_bytes=1)  # any pack is over the cap

    async def main() -> int:
        async with cache.running():
            await _written(cache, ["a"])
        return await cache.evict()

    assert asyncio.run(main()) == 1 and not store.objects
    assert cache.resident_bytes == 0
    assert _hits(cache, ["a"]) == [False]


def test_a_listing_without_the_pack_drops_it_from_memory(monkeypatch) -> None:
    store = _Store()
    cache = _cache_over(store)

    async def main() -> None:
        async with cache.running():
            await _written(cache, ["a"])

    asyncio.run(main())
    store.objects.clear()  # deleted behind this gateway (another gateway, the CLI)
    monkeypatch.setattr(_cache, "INDEX_TTL_S", 0.0)
    assert _hits(cache, ["unknown"]) == [False]  # a miss lists the context again
    assert cache.resident_bytes == 0
    assert _hits(cache, ["a"]) == [False]


def test_a_touch_that_finds_the_pack_gone_drops_it_from_memory() -> None:
    store = _Store()
    cache = _cache_over(store, cache_touch_s=1.0)

    async def main() -> list[bool]:
        async with cache.running():
            await _written(cache, ["a"])
            for index in cache._indexes.values():  # last used long ago: a hit touches it
                for pack in index.packs.values():
                    pack.last_used = datetime.now(UTC) - timedelta(hours=1)
            store.objects.clear()
            first = await cache.lookup(_identity("a"), MANIFEST, 1, "float32")
            await cache.drain()  # the touch ran, and found the pack gone
            second = await cache.lookup(_identity("a"), MANIFEST, 1, "float32")
            return [first is not None, second is not None]

    assert asyncio.run(main()) == [True, False]  # served once from memory, then no more
    assert cache.resident_bytes == 0


def test_settings_refuse_negative_memory() -> None:
    with pytest.raises(ValueError, match="cache_memory_bytes"):
        _cache_over(_Store(), cache_memory_bytes=-1)
