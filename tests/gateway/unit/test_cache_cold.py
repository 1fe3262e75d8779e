"""Which lookups a cold cache still sends: every one until a context has missed
``COLD_AFTER`` times in a row, then one object in ``cache_cold_probe`` (and every object
this gateway computed lately); a hit makes the context warm again. Driven by generated
sequences of requests and outcomes against a store that lists and serves packs."""

from __future__ import annotations

import asyncio
import hashlib
import math
from unittest import mock

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hapi.gateway import ClientKey, GatewaySettings
from hapi.gateway._store import StoreClient
from hapi.gateway.pushdown import _cache
from hapi.gateway.pushdown._cache import COLD_AFTER, MAC_HEADER, FeatureCache
from hapi.protocol import Credentials, ObjectIdentity, encode_pack, pack_path
from tests.gateway.support import listing
from tests.planner.synthetic import manifest as synthetic_manifest

MANIFEST = synthetic_manifest(freeze=4)
ROWS = np.arange(12, dtype=np.float32).reshape(1, 12)


class _Store:
    """Another gateway's packs, one an entry planted (each with a valid MAC): listings of a
    context's prefix, and ranged GETs of them; 404 for any other object."""

    def __init__(self) -> None:
        self.packs: dict[str, tuple[bytes, str]] = {}  # key -> (body, MAC)
        self.cache: FeatureCache | None = None
        self.reads = 0

    def plant(self, context: str, path: str) -> None:
        assert self.cache is not None
        key = pack_path(context, stamp_ms=len(self.packs), nonce="planted")
        body, index = encode_pack([(path, _cache.encode_entry(ROWS, "float32", None, ["x"], None))])
        self.packs[key] = (body, self.cache._mac(key, hashlib.sha256(index).digest()))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method != "GET":
            return httpx.Response(200)
        self.reads += 1
        if "list-type" in request.url.params:
            sizes = {key: len(body) for key, (body, _) in self.packs.items()}
            return listing(sizes, request.url.params["prefix"])
        found = self.packs.get(request.url.path.split("/", 2)[2])
        if found is None:
            return httpx.Response(404)
        body, mac = found
        first, _, last = request.headers["range"].removeprefix("bytes=").partition("-")
        part = body[int(first) : int(last) + 1]
        return httpx.Response(206, content=part, headers={MAC_HEADER: mac})


def _cache_over(store: _Store, **changes: object) -> FeatureCache:
    config = GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        clients={"K": ClientKey("s")},
        **changes,
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(store))
    cache = FeatureCache(config, StoreClient.of(config, lambda: client))
    store.cache = cache
    return cache


def _identity(bucket: str, key: str) -> ObjectIdentity:
    return ObjectIdentity(bucket=bucket, key=key, etag=f"etag-{key}", size=1)


def _plant(store: _Store, identity: ObjectIdentity, split: int = 1) -> None:
    """An entry another gateway wrote, in a pack of its own."""
    context = _cache._context_digest(
        _cache._context(identity.bucket, MANIFEST, split, "float32", None)
    )
    store.plant(context, _cache.entry_path(_cache._key(identity, MANIFEST, split, "float32")))


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 24), st.one_of(st.none(), st.integers(0, 23))),
        min_size=1,
        max_size=14,
    ),
    probe=st.integers(1, 12),
)
def test_a_context_is_sampled_only_after_a_run_of_misses(steps, probe) -> None:
    # Each step: a request of n new objects, and which asked one (if any) another gateway
    # has an entry for. What must hold of every step, whatever came before it:
    store = _Store()
    cache = _cache_over(store, cache_cold_probe=probe)

    async def main() -> None:
        run, passed_cold, asked_cold, serial = 0, 0, 0, 0
        for count, hit_at in steps:
            keys = [f"k{serial + i}" for i in range(count)]
            serial += count
            asked = cache.worth_asking("b", keys, MANIFEST, 1, "float32")
            assert set(asked) <= set(keys) and asked == [k for k in keys if k in asked]
            if run < COLD_AFTER or probe == 1:
                assert asked == keys  # warm (or sampling off): everything is looked up
            else:
                passed_cold += count
                asked_cold += len(asked)
                # at most one object in `probe` since the context went cold
                assert asked_cold <= math.ceil(passed_cold / probe)
                assert asked_cold >= passed_cold // probe
            for index, key in enumerate(asked):
                planted = hit_at is not None and index == hit_at % len(asked)
                if planted:
                    _plant(store, _identity("b", key))
                found = await cache.lookup(_identity("b", key), MANIFEST, 1, "float32")
                assert (found is not None) == planted  # another gateway's entry is found
                run = 0 if found is not None else run + 1
                if run == 0:
                    passed_cold = asked_cold = 0

    # every miss lists the context again, so a pack planted since is seen
    with mock.patch.object(_cache, "INDEX_TTL_S", 0.0):
        asyncio.run(main())


def test_objects_this_gateway_computed_are_always_looked_up() -> None:
    store = _Store()
    cache = _cache_over(store)
    entry = _cache.encode_entry(ROWS, "float32", None, ["x"], None)

    async def main() -> None:
        for index in range(COLD_AFTER):
            assert await cache.lookup(_identity("b", f"m{index}"), MANIFEST, 1, "float32") is None
        assert cache.cold("b", MANIFEST, 1, "float32")
        assert cache.store(_identity("b", "mine"), MANIFEST, 1, "float32", entry)
        keys = [f"n{index}" for index in range(30)] + ["mine"]
        asked = cache.worth_asking("b", keys, MANIFEST, 1, "float32")
        assert "mine" in asked and len(asked) <= 30 // 8 + 1
        assert await cache.lookup(_identity("b", "mine"), MANIFEST, 1, "float32") is not None
        assert not cache.cold("b", MANIFEST, 1, "float32")  # its hit warmed the context

    asyncio.run(main())


def test_a_miss_on_an_object_computed_here_forgets_the_buckets_others() -> None:
    # The cache was emptied (or evicted) behind this gateway: the objects it computed are
    # no likelier to hit than any other, and looking each up would cost a cold epoch
    # what the sampling saves.
    store = _Store()  # no copy in memory: the store's is the only one
    cache = _cache_over(store, cache_write_defer_s=0.0, cache_memory_bytes=0)
    entry = _cache.encode_entry(ROWS, "float32", None, ["x"], None)
    mine = [f"mine{index}" for index in range(20)]

    async def main() -> list[str]:
        async with cache.running():
            for key in mine:
                assert await cache.lookup(_identity("b", key), MANIFEST, 1, "float32") is None
                assert cache.store(_identity("b", key), MANIFEST, 1, "float32", entry)
            assert cache.store(_identity("c", "kept"), MANIFEST, 1, "float32", entry)
            await cache.drain()  # written: no longer waiting in the queue
        assert cache.cold("b", MANIFEST, 1, "float32")
        assert cache.worth_asking("b", mine, MANIFEST, 1, "float32") == mine
        # the store lost their packs (it kept none): the first miss forgets the rest
        assert await cache.lookup(_identity("b", mine[0]), MANIFEST, 1, "float32") is None
        for index in range(COLD_AFTER):  # bucket c goes cold too; its own object stays known
            await cache.lookup(_identity("c", f"other{index}"), MANIFEST, 1, "float32")
        assert cache.worth_asking("c", ["kept"], MANIFEST, 1, "float32") == ["kept"]
        return cache.worth_asking("b", mine, MANIFEST, 1, "float32")

    asked = asyncio.run(main())
    assert len(asked) <= len(mine) // 8 + 1


@pytest.mark.parametrize(
    "other",
    [
        ("c", 1, "float32", None),
        ("b", 2, "float32", None),
        ("b", 1, "float16", None),
        ("b", 1, "float32", {"augment": "flip", "seed": 0, "view": 1}),
    ],
    ids=["bucket", "split", "dtype", "view"],
)
def test_contexts_go_cold_on_their_own(other) -> None:
    bucket, split, dtype, view = other
    store = _Store()
    cache = _cache_over(store)

    async def main() -> None:
        for index in range(COLD_AFTER):
            assert await cache.lookup(_identity("b", f"m{index}"), MANIFEST, 1, "float32") is None
        assert cache.cold("b", MANIFEST, 1, "float32")
        assert not cache.cold(bucket, MANIFEST, split, dtype, view)
        keys = [f"o{index}" for index in range(20)]
        assert cache.worth_asking(bucket, keys, MANIFEST, split, dtype, view) == keys

    asyncio.run(main())


def test_a_probe_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="cache_cold_probe"):
        GatewaySettings(
            backend_url="http://store.internal:8333",
            backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
            clients={"K": ClientKey("s")},
            cache_cold_probe=0,
        )


def test_the_contexts_counted_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(_cache, "CONTEXTS", 4)
    store = _Store()
    cache = _cache_over(store)

    async def main() -> None:
        for bucket in "abcdef":
            await cache.lookup(_identity(bucket, "k"), MANIFEST, 1, "float32")
        assert len(cache._streaks) == 4

    asyncio.run(main())
