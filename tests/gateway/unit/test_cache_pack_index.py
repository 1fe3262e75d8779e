"""The index of a context's packs: what a listing finds is read once, a pack that could not
be read now is read on the next listing, and a pack whose MAC fails is never read again.
Against a store (a mock transport) that lists and serves packs, failing as told."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import numpy as np
import pytest

from hapi.gateway import ClientKey, GatewaySettings
from hapi.gateway._store import StoreClient
from hapi.gateway.pushdown import _cache
from hapi.gateway.pushdown._cache import MAC_HEADER, FeatureCache
from hapi.protocol import Credentials, ObjectIdentity, encode_pack, pack_path
from tests.gateway.support import listing
from tests.planner.synthetic import manifest as synthetic_manifest

MANIFEST = synthetic_manifest(freeze=4)
ROWS = np.arange(12, dtype=np.float32).reshape(1, 12)


class _Store:
    """Packs by key, each with the MAC header it was given; a pack's head GETs answer
    ``failing`` first (as many as listed) before its bytes."""

    def __init__(self) -> None:
        self.packs: dict[str, tuple[bytes, str]] = {}
        self.failing: dict[str, list[int]] = {}
        self.heads: dict[str, int] = {}  # head GETs (ranges from 0) per pack
        self.listings = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method != "GET":
            return httpx.Response(200)
        if "list-type" in request.url.params:
            self.listings += 1
            sizes = {key: len(body) for key, (body, _) in self.packs.items()}
            return listing(sizes, request.url.params["prefix"])
        key = request.url.path.split("/", 2)[2]
        first, _, last = request.headers["range"].removeprefix("bytes=").partition("-")
        if first == "0":
            self.heads[key] = self.heads.get(key, 0) + 1
            if self.failing.get(key):
                return httpx.Response(self.failing[key].pop(0))
        if key not in self.packs:
            return httpx.Response(404)
        body, mac = self.packs[key]
        return httpx.Response(
            206, content=body[int(first) : int(last) + 1], headers={MAC_HEADER: mac}
        )


def _cache_over(store: _Store) -> FeatureCache:
    config = GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        clients={"K": ClientKey("s")},
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(store))
    return FeatureCache(config, StoreClient.of(config, lambda: client))


def _plant(store: _Store, cache: FeatureCache, name: str, *, valid: bool) -> ObjectIdentity:
    """A pack another gateway wrote holding ``name``'s entry (its MAC forged unless
    ``valid``)."""
    identity = ObjectIdentity(bucket="b", key=name, etag=name, size=1)
    context = _cache._context_digest(_cache._context("b", MANIFEST, 1, "float32", None))
    path = _cache.entry_path(_cache._key(identity, MANIFEST, 1, "float32"))
    key = pack_path(context, stamp_ms=len(store.packs), nonce=name)
    body, index = encode_pack([(path, _cache.encode_entry(ROWS, "float32", None, [name], None))])
    mac = cache._mac(key, hashlib.sha256(index).digest()) if valid else "0" * 64
    store.packs[key] = (body, mac)
    return identity


@pytest.mark.parametrize("status", [503, 500])
def test_a_pack_that_could_not_be_read_now_is_read_on_the_next_listing(monkeypatch, status) -> None:
    monkeypatch.setattr(_cache, "INDEX_TTL_S", 0.0)  # every miss lists again
    store = _Store()
    cache = _cache_over(store)
    identity = _plant(store, cache, "a", valid=True)
    (key,) = store.packs
    store.failing[key] = [status]

    async def main() -> tuple[object, object]:
        first = await cache.lookup(identity, MANIFEST, 1, "float32")
        return first, await cache.lookup(identity, MANIFEST, 1, "float32")

    first, second = asyncio.run(main())
    assert first is None  # the head failed: a miss, this once
    assert second is not None and np.array_equal(second.features, ROWS)  # type: ignore[attr-defined]
    assert store.heads[key] == 2


def test_a_pack_whose_mac_fails_is_never_read_again(monkeypatch) -> None:
    monkeypatch.setattr(_cache, "INDEX_TTL_S", 0.0)
    store = _Store()
    cache = _cache_over(store)
    forged = _plant(store, cache, "a", valid=False)
    genuine = _plant(store, cache, "b", valid=True)
    forged_key, genuine_key = store.packs

    async def main() -> list[object]:
        return [await cache.lookup(forged, MANIFEST, 1, "float32") for _ in range(3)] + [
            await cache.lookup(genuine, MANIFEST, 1, "float32")
        ]

    found = asyncio.run(main())
    assert found[:3] == [None, None, None] and found[3] is not None
    assert store.heads == {forged_key: 1, genuine_key: 1}  # each head read once


def test_a_hit_in_the_index_lists_nothing_and_a_pack_gone_is_forgotten() -> None:
    store = _Store()
    cache = _cache_over(store)
    identity = _plant(store, cache, "a", valid=True)
    (key,) = store.packs

    async def main() -> list[object]:
        hits = [await cache.lookup(identity, MANIFEST, 1, "float32") for _ in range(3)]
        del store.packs[key]  # evicted behind this gateway
        return [*hits, await cache.lookup(identity, MANIFEST, 1, "float32")]

    found = asyncio.run(main())
    assert all(hit is not None for hit in found[:3]) and found[3] is None
    assert store.listings == 1  # the first lookup's; the hits after it asked the index
    assert cache._indexed == 0  # the pack found gone left the index
