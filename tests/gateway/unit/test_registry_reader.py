"""The gateway reads the model registry itself, async, over its upstream client.

The whole app in-process over a mock store that holds a registry bucket: manifests and
blocks must come through the injected upstream transport, signed with the backend's
credentials, and a missing or unreadable model must map to the same S3 errors as ever.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Callable
from urllib.parse import parse_qs

import httpx
import numpy as np
import pytest
from asgi_lifespan import LifespanManager
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials
from PIL import Image

from hapi.gateway import ClientKey, GatewaySettings, create_app
from hapi.models import Manifest
from hapi.protocol import Credentials, ModelSummary, block_key, latest_key, manifest_key
from tests.planner.synthetic import manifest as synthetic_manifest

CLIENT = ("CLIENTKEY", "client-secret")
GATEWAY = "http://gw.test"
REGISTRY = "/hapi-models/"
S3 = "http://s3.amazonaws.com/doc/2006-03-01/"


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (10, 200, 30)).save(out, "PNG")
    return out.getvalue()


class Store:
    """A mock backend: objects by path, ListObjectsV2 on a bucket, every request kept."""

    def __init__(self, *manifests: Manifest, latest: bool = True) -> None:
        self.objects: dict[str, bytes] = {"/data/cat.png": _png()}
        for m in manifests:
            self.objects[REGISTRY + manifest_key(m.name, m.version)] = m.to_json().encode()
            if latest:
                self.objects[REGISTRY + latest_key(m.name)] = str(m.version).encode()
        self.requests: list[httpx.Request] = []
        self.failing = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.failing:
            return httpx.Response(500, content=b"<Error><Code>InternalError</Code></Error>")
        if request.url.path == REGISTRY.rstrip("/") and request.url.params.get("list-type"):
            return self._list(parse_qs(request.url.query.decode())["prefix"][0])
        body = self.objects.get(request.url.path)
        if body is None:
            return httpx.Response(404, content=b"<Error><Code>NoSuchKey</Code></Error>")
        return httpx.Response(200, content=body, headers={"etag": '"e"'})

    def _list(self, prefix: str) -> httpx.Response:
        keys = sorted(
            path[len(REGISTRY) :] for path in self.objects if path.startswith(REGISTRY + prefix)
        )
        contents = "".join(f"<Contents><Key>{k}</Key><Size>1</Size></Contents>" for k in keys)
        body = (
            f'<ListBucketResult xmlns="{S3}"><IsTruncated>false</IsTruncated>'
            f"{contents}</ListBucketResult>"
        )
        return httpx.Response(200, content=body.encode())

    def registry_reads(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path.startswith(REGISTRY.rstrip("/"))]


def _runner(manifest: Manifest, split: int) -> Callable[[np.ndarray], np.ndarray]:
    shape = tuple(manifest.blocks[split - 1].output_shape)
    return lambda batch: np.full((len(batch), *shape), float(split), dtype=np.float32)


def _signed(url: str) -> dict[str, str]:
    request = AWSRequest(
        method="GET", url=url, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}
    )
    S3SigV4Auth(BotoCredentials(*CLIENT), "s3", "us-east-1").add_auth(request)
    return dict(request.headers.items())


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def no_boto3(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any boto3 client made while the test runs fails it."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the gateway made a boto3 client")

    monkeypatch.setattr("boto3.client", refuse)
    monkeypatch.setattr("boto3.session.Session.client", refuse)


@contextlib.asynccontextmanager
async def _serve(store: Store, *, fake_runner: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    settings = GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        clients={CLIENT[0]: ClientKey(CLIENT[1])},
        device="cpu",
    )
    app = create_app(
        settings,
        upstream=httpx.AsyncClient(transport=httpx.MockTransport(store)),
        runner=_runner if fake_runner else None,
    )
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app)) as http,
    ):
        yield http


async def _get(http: httpx.AsyncClient, path: str, **query: str) -> httpx.Response:
    url = httpx.URL(GATEWAY + path, params={f"hapi-{k}": v for k, v in query.items()})
    return await http.get(url, headers=_signed(str(url)))


def _error(reply: httpx.Response) -> tuple[int, str | None, str | None]:
    root = ET.fromstring(reply.content)
    return reply.status_code, root.findtext("Code"), root.findtext("Message")


@pytest.mark.anyio
async def test_manifests_are_read_over_the_upstream_client_signed_for_the_backend(
    no_boto3: None,
) -> None:
    store = Store(synthetic_manifest(freeze=4))
    async with _serve(store) as http:
        reply = await _get(http, "/data/cat.png", model="synthetic", split="2")
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-hapi-model"] == "synthetic@1"
    reads = store.registry_reads()
    assert [r.url.path for r in reads] == [
        REGISTRY + latest_key("synthetic"),
        REGISTRY + manifest_key("synthetic", 1),
    ]
    assert all("Credential=BACKENDKEY/" in r.headers["authorization"] for r in reads)


@pytest.mark.anyio
async def test_a_missing_model_is_no_such_model_with_its_message(no_boto3: None) -> None:
    store = Store(synthetic_manifest(freeze=4))
    async with _serve(store) as http:
        missing = await _get(http, "/data/cat.png", model="absent", split="1")
    async with _serve(store) as http:
        no_version = await _get(http, "/data/cat.png", model="synthetic@7", split="1")
    assert _error(missing) == (
        404,
        "NoSuchModel",
        "the registry has no model 'absent'; `hapi models ls` lists them",
    )
    assert _error(no_version)[:2] == (404, "NoSuchModel")


@pytest.mark.anyio
async def test_without_a_latest_pointer_the_highest_version_is_served(no_boto3: None) -> None:
    first, second = synthetic_manifest(freeze=4), synthetic_manifest(freeze=3)
    store = Store(first, dataclasses.replace(second, version=2), latest=False)
    async with _serve(store) as http:
        reply = await _get(http, "/data/cat.png", model="synthetic", split="1")
        listed = await http.get(
            GATEWAY + "/_hapi/models", headers=_signed(GATEWAY + "/_hapi/models")
        )
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-hapi-model"] == "synthetic@2"
    assert listed.status_code == 200, listed.text
    assert [ModelSummary.model_validate(m).ref for m in listed.json()] == ["synthetic@2"]


@pytest.mark.anyio
async def test_an_unreadable_registry_is_service_unavailable(no_boto3: None) -> None:
    store = Store(synthetic_manifest(freeze=4))
    store.failing = True
    async with _serve(store) as http:
        reply = await _get(http, "/data/cat.png", model="synthetic", split="1")
        listed = await http.get(
            GATEWAY + "/_hapi/models", headers=_signed(GATEWAY + "/_hapi/models")
        )
    status, code, message = _error(reply)
    assert (status, code) == (503, "ServiceUnavailable")
    assert "InternalError" in (message or "")
    assert _error(listed)[:2] == (503, "ServiceUnavailable")


@pytest.mark.anyio
async def test_blocks_are_fetched_over_the_upstream_client_and_verified(no_boto3: None) -> None:
    manifest = synthetic_manifest(freeze=4)
    store = Store(manifest)
    for block in manifest.blocks:  # bytes that do not hash to the manifest's digests
        store.objects[REGISTRY + block_key(block.hash)] = b"not the block"
    async with _serve(store, fake_runner=False) as http:
        reply = await _get(http, "/data/cat.png", model="synthetic", split="2")
    status, code, message = _error(reply)
    assert (status, code) == (503, "ServiceUnavailable")
    assert "cannot load synthetic@1 blocks [0, 2)" in (message or "")
    fetched = [r.url.path for r in store.registry_reads() if "/blocks/" in r.url.path]
    assert sorted(fetched) == sorted(REGISTRY + block_key(b.hash) for b in manifest.blocks[:2])
