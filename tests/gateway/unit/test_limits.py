"""Per-identity bounds: work in progress (InFlight) and the cache-write queue's bytes."""

from __future__ import annotations

import httpx
import pytest

from hapi.gateway import ClientKey, GatewaySettings
from hapi.gateway._errors import SlowDown
from hapi.gateway._limits import InFlight
from hapi.gateway._metrics import Metrics
from hapi.gateway._store import StoreClient
from hapi.gateway.pushdown._cache import FeatureCache
from hapi.protocol import Credentials, ObjectIdentity
from tests.planner.synthetic import manifest as synthetic_manifest


def test_in_flight_refuses_one_identity_at_its_bound_and_not_another() -> None:
    metrics = Metrics()
    bound = InFlight(2, bound="upstream", setting="HAPI_X", metrics=metrics)
    with bound.hold("alice"), bound.hold("alice"):
        with pytest.raises(SlowDown) as refused, bound.hold("alice"):
            pass
        assert refused.value.retry_after == 1 and "HAPI_X" in refused.value.message
        with bound.hold("bob"):
            assert bound.in_progress("bob") == 1
        assert bound.in_progress("alice") == 2
    assert bound.in_progress("alice") == 0
    with bound.hold("alice"):  # released, whatever left the blocks
        pass
    page = metrics.render()[0].decode()
    assert 'hapi_identity_limited_total{bound="upstream",identity="alice"} 1.0' in page


def test_no_bound_is_zero() -> None:
    bound = InFlight(0, bound="pushdown", setting="HAPI_Y")
    with bound.hold("alice"), bound.hold("alice"), bound.hold("alice"):
        assert bound.in_progress("alice") == 3


def _cache(**changes: int) -> FeatureCache:
    settings = GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        clients={"K": ClientKey("s")},
        **changes,
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    return FeatureCache(settings, StoreClient.of(settings, lambda: client))


def _store(cache: FeatureCache, name: str, size: int, owner: str) -> bool:
    identity = ObjectIdentity(bucket="b", key=name, etag=name, size=1)
    return cache.store(
        identity, synthetic_manifest(freeze=4), 1, "float32", b"x" * size, owner=owner
    )


def test_one_identity_cannot_fill_the_cache_write_queue_for_the_others() -> None:
    cache = _cache(cache_write_queue_bytes=1000, identity_cache_write_bytes=400)
    assert _store(cache, "a1", 300, "alice")
    assert not _store(cache, "a2", 200, "alice")  # over alice's share: skipped
    assert _store(cache, "b1", 400, "bob")  # bob still has his
    assert cache.queued_bytes == 700
    assert not _store(cache, "c1", 400, "carol")  # over the queue's bytes: skipped
    assert _store(cache, "c2", 300, "carol")
    assert cache.queued_bytes == 1000 and cache.skipped_writes == 2
