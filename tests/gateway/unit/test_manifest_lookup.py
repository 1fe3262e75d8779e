"""Resolving a model's name: requests that find the latest version stale share one
registry read, and one that goes away does not take the others' answer with it."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from hapi.gateway._errors import NoSuchModel
from hapi.gateway.pushdown._batcher import MemoryBudget
from hapi.gateway.pushdown._tenants import Tenants
from hapi.models import Manifest
from tests.gateway.support import MemoryRegistry
from tests.planner.synthetic import manifest as synthetic_manifest


class SlowRegistry(MemoryRegistry):
    """A registry whose reads take a while, counted."""

    def __init__(self, *manifests: Manifest) -> None:
        super().__init__(*manifests)
        self.reads = 0
        self.release = asyncio.Event()

    async def get_manifest(self, ref: str) -> Manifest:
        self.reads += 1
        await self.release.wait()
        return await super().get_manifest(ref)


def _tenants(registry: MemoryRegistry, pool: ThreadPoolExecutor) -> Tenants:
    return Tenants(registry, MemoryBudget(10**9), pool, latest_ttl_s=60)


@pytest.mark.parametrize("waiting", [2, 8, 64])
def test_requests_that_find_a_name_unresolved_share_one_read(waiting: int) -> None:
    manifest = synthetic_manifest(freeze=2)

    async def scenario() -> tuple[int, list[Manifest]]:
        registry = SlowRegistry(manifest)
        with ThreadPoolExecutor(1) as pool:
            tenants = _tenants(registry, pool)
            asking = [
                asyncio.ensure_future(tenants.manifest(manifest.name)) for _ in range(waiting)
            ]
            await asyncio.sleep(0)
            registry.release.set()
            found = await asyncio.gather(*asking)
            return registry.reads, found

    reads, found = asyncio.run(scenario())
    assert reads == 1 and all(m is found[0] for m in found) and found[0].ref == manifest.ref


def test_a_waiter_that_goes_away_leaves_the_read_to_the_others() -> None:
    manifest = synthetic_manifest(freeze=2)

    async def scenario() -> Manifest:
        registry = SlowRegistry(manifest)
        with ThreadPoolExecutor(1) as pool:
            tenants = _tenants(registry, pool)
            first = asyncio.ensure_future(tenants.manifest(manifest.name))
            second = asyncio.ensure_future(tenants.manifest(manifest.name))
            await asyncio.sleep(0)
            first.cancel()
            registry.release.set()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert registry.reads == 1
            return await second

    assert asyncio.run(scenario()).ref == manifest.ref


def test_a_failed_read_fails_every_waiter_and_is_not_kept() -> None:
    async def scenario() -> int:
        registry = SlowRegistry()  # no model at all
        with ThreadPoolExecutor(1) as pool:
            tenants = _tenants(registry, pool)
            asking = [asyncio.ensure_future(tenants.manifest("ghost")) for _ in range(3)]
            await asyncio.sleep(0)
            registry.release.set()
            outcomes = await asyncio.gather(*asking, return_exceptions=True)
            assert all(isinstance(o, NoSuchModel) for o in outcomes)
            with pytest.raises(NoSuchModel):
                await tenants.manifest("ghost")  # asked again: read again
            return registry.reads

    assert asyncio.run(scenario()) == 2
