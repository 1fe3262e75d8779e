"""The storage side's served profile, in-process: per block, with sources and ages.

The whole app (``create_app``) over a mock store, an in-memory registry and a fake
per-block runner: after one pushdown request, ``/_hapi/models/{name}`` must say, per
frozen block, the inference time measured on that traffic (or the manifest's for a block
that never ran), the decode time apart, and the host's availability.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import numpy as np
import pytest
from asgi_lifespan import LifespanManager

from hapi.gateway import ClientKey, GatewaySettings, create_app
from hapi.gateway.pushdown import _profiles
from hapi.models import Manifest
from hapi.protocol import Credentials, ModelProfile
from tests.gateway.support import (
    CLIENT,
    GATEWAY,
    MemoryRegistry,
    client_signed,
    fake_probes,
    memory_store,
)
from tests.planner.synthetic import manifest as synthetic_manifest

MODEL = synthetic_manifest(freeze=4)


def _runner(manifest: Manifest, split: int) -> Callable[[np.ndarray], np.ndarray]:
    shape = tuple(manifest.blocks[split - 1].output_shape)
    work = np.ones((64, 64), np.float32)

    def run(batch: np.ndarray) -> np.ndarray:
        for _ in range(50):  # some CPU time in this thread
            work @ work
        return np.zeros((len(batch), *shape), np.float32)

    return run


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        clients={CLIENT[0]: ClientKey(CLIENT[1])},
        device="cpu",
        intra_op_threads=1,
    )
    app = create_app(
        settings,
        upstream=httpx.AsyncClient(transport=httpx.MockTransport(memory_store)),
        registry=MemoryRegistry(MODEL),
        runner=_runner,
    )
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app)) as http,
    ):
        yield http


async def _profile(http: httpx.AsyncClient) -> ModelProfile:
    url = f"{GATEWAY}/_hapi/models/{MODEL.name}"
    reply = await http.get(url, headers=client_signed("GET", url))
    assert reply.status_code == 200, reply.text
    return ModelProfile.model_validate_json(reply.content)


@pytest.mark.anyio
async def test_before_traffic_every_block_figure_is_the_manifests(client) -> None:
    storage = (await _profile(client)).storage
    assert [(b.block, b.source, b.ms) for b in storage.blocks] == [
        (i, "manifest", MODEL.blocks[i].cpu_ms) for i in range(MODEL.freeze)
    ]
    assert all(b.samples == 0 and b.age_s is None for b in storage.blocks)
    assert storage.batches == [] and storage.decode is None
    # The share of a core is probed, not assumed (a busy node must say so at once).
    assert storage.load.source == "probed" and 0 < storage.load.available <= 1


@pytest.mark.anyio
async def test_split_auto_on_a_fresh_gateway_probes_the_load_first(
    client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gateway's own split=auto plans on the same view as /_hapi/models: before any
    # block ran, a busy core must show there too (it read a whole core before).
    probes = fake_probes(monkeypatch)
    url = httpx.URL(
        GATEWAY + "/data/cat.png", params={"hapi-model": "synthetic", "hapi-split": "auto"}
    )
    reply = await client.get(url, headers=client_signed("GET", str(url)))
    assert reply.status_code == 200, reply.text
    assert probes == [_profiles.PROBE_S]


@pytest.mark.anyio
async def test_served_profile_is_per_block_with_sources_and_ages(client) -> None:
    params = {"hapi-model": "synthetic", "hapi-split": "2", "hapi-cache": "bypass"}
    url = httpx.URL(GATEWAY + "/data/cat.png", params=params)
    for _ in range(4):  # each one computed (the cache would answer the repeats)
        reply = await client.get(url, headers=client_signed("GET", str(url)))
        assert reply.status_code == 200, reply.text

    storage = (await _profile(client)).storage
    # The session's first (cold) run is not counted; decoding has no cold run.
    ran, never = storage.blocks[:2], storage.blocks[2:]
    for figure in ran:  # blocks [0, 2) ran, timed on this thread's CPU clock
        assert (figure.source, figure.device, figure.clock) == ("measured", "cpu", "cpu")
        assert figure.samples == 3 and figure.ms > 0
        assert figure.age_s is not None and figure.age_s >= 0
        # A fake runner has no onnxruntime profile: the manifest divides the run's time.
        assert figure.split_by == "manifest"
    manifest_ratio = MODEL.blocks[1].cpu_ms / MODEL.blocks[0].cpu_ms
    assert ran[1].ms / ran[0].ms == pytest.approx(manifest_ratio, rel=1e-2)
    for figure in never:
        assert (figure.source, figure.samples, figure.age_s) == ("manifest", 0, None)
        assert figure.ms == MODEL.blocks[figure.block].cpu_ms
    # One sample per request: the batch-size bucket of 1, per block.
    assert [(b.block, b.batch, b.samples) for b in storage.batches] == [(0, 1, 3), (1, 1, 3)]
    decode = storage.decode
    assert decode is not None and decode.source == "measured" and decode.samples == 4
    assert decode.ms > 0 and decode.age_s is not None
    assert storage.load.source == "measured" and 0 < storage.load.available <= 1
