"""The whole gateway in-process, lifespan included: an in-memory registry, a fake runner.

No store, no ONNX, no subprocess: pushdown, ``split=auto``, the error mapping and the
control plane's typed answers, through ``create_app``'s seams.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import numpy as np
import pytest
from asgi_lifespan import LifespanManager

from hapi import planner
from hapi.gateway import ClientKey, GatewaySettings, create_app
from hapi.models import Manifest
from hapi.protocol import Credentials, GatewayStats, ModelProfile, decode_features
from tests.gateway.support import (
    CLIENT,
    GATEWAY,
    OBJECTS,
    MemoryRegistry,
    client_signed,
    memory_store,
)
from tests.planner.synthetic import manifest as synthetic_manifest


def fake_runner(
    seen: list[tuple[int, tuple[int, ...]]],
) -> Callable[..., Callable[..., np.ndarray]]:
    """Runs blocks ``[0, split)`` as: block ``split - 1``'s output shape, every value equal
    to ``split`` (a streamed answer's header names that shape before any row is run)."""

    def make(manifest: Manifest, split: int) -> Callable[[np.ndarray], np.ndarray]:
        shape = tuple(manifest.blocks[split - 1].output_shape)

        def run(batch: np.ndarray) -> np.ndarray:
            seen.append((split, batch.shape))
            return np.full((len(batch), *shape), float(split), dtype=np.float32)

        return run

    return make


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def seen() -> list[tuple[int, tuple[int, ...]]]:
    return []


def _app(seen: list[tuple[int, tuple[int, ...]]], *, freeze: int) -> Any:
    """The gateway over the mock store, a one-model registry and the fake runner."""
    settings = GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        clients={CLIENT[0]: ClientKey(CLIENT[1])},
        device="cpu",
    )
    return create_app(
        settings,
        upstream=httpx.AsyncClient(transport=httpx.MockTransport(memory_store)),
        registry=MemoryRegistry(synthetic_manifest(freeze=freeze)),
        runner=fake_runner(seen),
    )


@pytest.fixture
async def client(seen: list[tuple[int, tuple[int, ...]]]) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        LifespanManager(_app(seen, freeze=4)) as manager,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app)) as http,
    ):
        yield http


async def _get(http: httpx.AsyncClient, path: str, **query: str) -> httpx.Response:
    url = httpx.URL(GATEWAY + path, params={f"hapi-{k}": v for k, v in query.items()})
    return await http.get(url, headers=client_signed("GET", str(url)))


def _code(reply: httpx.Response) -> str | None:
    return ET.fromstring(reply.content).findtext("Code")


@pytest.mark.anyio
async def test_pushdown_get_returns_the_runners_features(client, seen) -> None:
    reply = await _get(client, "/data/cat.png", model="synthetic", split="2")
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-hapi-model"] == "synthetic@1" and reply.headers["x-hapi-split"] == "2"
    tensors, _meta = decode_features(reply.content)
    assert tensors["features"].shape == (1, 200_704) and np.all(tensors["features"] == 2.0)
    assert seen == [(2, (1, 3, 224, 224))]  # the preprocessed image went to the runner


@pytest.mark.anyio
async def test_split_auto_plans_for_the_clients_link(client, seen) -> None:
    reply = await _get(client, "/data/cat.png", model="synthetic", split="auto", bandwidth="20mbit")
    assert reply.status_code == 200, reply.text
    # On a slow link the planner sends the smallest output among the frozen blocks [0, 4).
    assert reply.headers["x-hapi-split"] == "4"
    features = decode_features(reply.content)[0]["features"]
    assert features.shape == (1, 100_352) and np.all(features == 4.0)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("path", "query", "status", "code"),
    [
        ("/data/cat.png", {"model": "missing", "split": "1"}, 404, "NoSuchModel"),
        ("/data/cat.png", {"model": "synthetic@7", "split": "1"}, 404, "NoSuchModel"),
        ("/data/cat.png", {"model": "synthetic", "split": "9"}, 400, "InvalidArgument"),
        ("/data/cat.png", {"model": "synthetic", "split": "one"}, 400, "InvalidArgument"),
        (
            "/data/cat.png",
            {"model": "synthetic", "split": "1", "dtype": "int8"},
            400,
            "InvalidArgument",
        ),
        ("/data/notes.bin", {"model": "synthetic", "split": "1"}, 422, "UnprocessableObject"),
    ],
)
async def test_errors_map_to_s3_codes(client, seen, path, query, status, code) -> None:
    reply = await _get(client, path, **query)
    assert (reply.status_code, _code(reply)) == (status, code), reply.text
    assert seen == []  # nothing ran


@pytest.mark.anyio
async def test_control_plane_answers_with_the_shared_schema(client) -> None:
    assert (await _get(client, "/data/cat.png", model="synthetic", split="3")).status_code == 200
    stats = GatewayStats.model_validate_json(
        (
            await client.get(
                GATEWAY + "/_hapi/stats", headers=client_signed("GET", GATEWAY + "/_hapi/stats")
            )
        ).content
    )
    (tenant,) = stats.tenants
    assert tenant.serves("synthetic@1") == [3] and tenant.samples == 1
    url = GATEWAY + "/_hapi/models/synthetic"
    profile = ModelProfile.model_validate_json(
        (await client.get(url, headers=client_signed("GET", url))).content
    )
    assert profile.ref == "synthetic@1" and [t.blocks for t in profile.served] == [tenant.blocks]


@pytest.mark.anyio
async def test_control_plane_refuses_unsigned_calls_in_process(client) -> None:
    for path in ("/_hapi/stats", "/_hapi/models", "/_hapi/openapi.json", "/metrics"):
        reply = await client.get(GATEWAY + path)
        assert (reply.status_code, _code(reply)) == (403, "AccessDenied"), path
    assert (await client.get(GATEWAY + "/_hapi/live")).json() == {"status": "alive"}


@pytest.mark.anyio
@pytest.mark.parametrize("address", ["127.0.0.1", "192.0.2.5"])
async def test_split_auto_for_a_client_on_this_machine_saves_bytes(address, seen) -> None:
    # The same request at loopback speed: a client on this machine shares the gateway's
    # cores, so nothing is gained by an early split that sends more than a raw object;
    # a client elsewhere gets the split that balances the two machines' work.
    app = _app(seen, freeze=10)
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    async with LifespanManager(app), httpx.AsyncClient(transport=transport) as http:
        reply = await _get(
            http, "/data/cat.png", model="synthetic", split="auto", bandwidth="100gbit"
        )
    assert reply.status_code == 200, reply.text
    split = int(reply.headers["x-hapi-split"])
    sent = synthetic_manifest().blocks[split - 1].output_bytes
    raw = planner.DEFAULT_RAW_BYTES
    assert (sent <= raw) if address == "127.0.0.1" else (sent > raw)


@pytest.mark.anyio
async def test_each_request_gets_its_own_state_whatever_the_server(client, seen) -> None:
    """A server may hand every request the same lifespan ``scope["state"]`` (asgi-lifespan
    does; uvicorn copies it): one request's signature or principal must never be seen by
    the next."""
    plain = await _get(client, "/data/cat.png")
    assert plain.status_code == 200 and plain.content == OBJECTS["/data/cat.png"]
    pushed = await _get(client, "/data/cat.png", model="synthetic", split="2")
    assert pushed.status_code == 200, pushed.text
    assert pushed.headers["x-hapi-split"] == "2"


@pytest.mark.anyio
async def test_metrics_show_each_model_and_splits_efficiency(client, seen) -> None:
    for split in ("2", "2", "3"):  # every one computed: the second is no cache hit
        reply = await _get(client, "/data/cat.png", model="synthetic", split=split, cache="bypass")
        assert reply.status_code == 200, reply.text
    url = GATEWAY + "/metrics"
    text = (await client.get(url, headers=client_signed("GET", url))).text

    def value(name: str, split: str) -> float:
        found = re.search(
            rf'^{name}\{{model="synthetic@1",split="{split}"\}} (\S+)$', text, re.MULTILINE
        )
        assert found, f"{name} for split {split} is missing"
        return float(found.group(1))

    assert value("hapi_pushdown_model_requests_total", "2") == 2
    assert value("hapi_pushdown_model_samples_total", "3") == 1
    assert value("hapi_pushdown_batch_size_count", "2") == 2  # two batches of one sample
    assert value("hapi_pushdown_batch_size_sum", "2") == 2
    assert value("hapi_pushdown_queue_wait_seconds_count", "3") == 1
    assert value("hapi_pushdown_inference_seconds_total", "2") > 0
    assert value("hapi_pushdown_decode_seconds_total", "2") > 0
    assert "hapi_device_memory_used_bytes 0.0" in text  # a CPU-only gateway
