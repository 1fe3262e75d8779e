"""How a pushdown sample reaches its decoder, against the real store: a single GET's image
goes to the decoding pool once (its header read where it is decoded), and the gateway
refuses exactly the objects the model layer refuses, with the same words."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from skimage import data as samples

from hapi import models
from hapi.gateway import ClientKey, GatewaySettings
from hapi.gateway._store import StoreClient
from hapi.gateway.edge._transport import UpstreamTransport
from hapi.gateway.pushdown._fetch import ObjectLister
from hapi.gateway.pushdown._locality import FetchMeter
from hapi.protocol import Credentials, decode_features
from tests.support import encode_image, signed_headers

BUCKET = "pushdown-hops"
CAT = encode_image(samples.chelsea(), "JPEG")


class CountingPool(ThreadPoolExecutor):
    """A thread pool that counts the jobs handed to it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.jobs = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


def _shard() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, payload in (("s/cat.jpg", CAT), ("s/cat.cls", b"3")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


@pytest.fixture(scope="module")
def objects(backend_s3: Any) -> dict[str, bytes]:
    backend_s3.create_bucket(Bucket=BUCKET)
    blobs = {"cat.jpg": CAT, "cat2.jpg": CAT, "shard.tar": _shard(), "notes.txt": b"not an image"}
    for key, blob in blobs.items():
        backend_s3.put_object(Bucket=BUCKET, Key=key, Body=blob)
    return blobs


def _listed(
    store: Any, manifest: models.Manifest, keys: list[str], *, batch: bool, then: Any = None
) -> Any:
    """List ``keys`` the way pushdown does, over the lean transport; returns the listing
    and the jobs the decoding pool was handed."""
    config = GatewaySettings(
        backend_url=store.endpoint_url,
        backend_credentials=Credentials(
            store.credentials.access_key_id, store.credentials.secret_access_key
        ),
        clients={"k": ClientKey("s")},
    )

    async def scenario() -> Any:
        transport = UpstreamTransport()
        async with httpx.AsyncClient(transport=transport) as client:
            client_store = StoreClient.of(config, lambda: client, transport.exchange)
            with CountingPool() as pool:
                lister = ObjectLister(config, pool, FetchMeter(None))
                listing = await lister.list_all(
                    client_store, BUCKET, keys, manifest, batch, then=then
                )
                return listing, pool.jobs

    return asyncio.run(scenario())


def test_an_image_is_listed_and_decoded_in_one_pool_job(store, registered, objects):
    manifest = registered["r18"]
    decoded: dict[str, Any] = {}

    def then(key: str, samples: list[Any]) -> None:  # what pushdown decodes there
        decoded[key] = (threading.current_thread(), samples[0].decode(manifest.preprocess))

    listing, jobs = _listed(store, manifest, ["cat.jpg"], batch=False, then=then)
    assert jobs == 1 and not listing.errors
    thread, array = decoded["cat.jpg"]
    assert thread is not threading.main_thread()
    # Decoded where it was listed, it is exactly what the model layer makes of the object.
    want = models.decode_object(CAT, manifest.preprocess, key="cat.jpg")[0].array
    assert np.array_equal(array, want)
    identity = listing.identities["cat.jpg"]
    assert identity.size == len(CAT) and identity.etag


@pytest.mark.parametrize(
    ("keys", "batch", "jobs"),
    [
        (["cat.jpg"], False, 1),  # a single GET's image is listed in the pool
        (["shard.tar"], False, 1),  # a shard's members are listed in the pool
        (["cat.jpg"], True, 1),  # a batch checks each key as it lists it
        (["cat.jpg", "shard.tar"], True, 2),
    ],
)
def test_shards_and_batches_are_listed_in_the_pool(store, registered, objects, keys, batch, jobs):
    listing, handed = _listed(store, registered["r18"], keys, batch=batch)
    assert handed == jobs
    assert sorted(listing.samples) == sorted(keys)


def test_a_batch_still_fails_a_bad_key_alone(store, registered, objects):
    listing, _ = _listed(store, registered["r18"], ["cat.jpg", "notes.txt"], batch=True)
    assert list(listing.samples) == ["cat.jpg"]
    assert listing.errors["notes.txt"].code == "UnprocessableObject"


def _model_layers_refusal(blob: bytes, manifest: models.Manifest, key: str) -> str | None:
    """What ``hapi.models`` says of ``blob`` (``None``: it decodes)."""
    try:
        models.decode_object(blob, manifest.preprocess, key=key)
    except models.UndecodableObject as exc:
        return f"{exc} (model {manifest.ref} needs an image or a tar shard)"
    return None


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """Bytes that may or may not be an image: a real JPEG cut short or with a byte
    changed, a PNG claiming too many pixels, or no image at all."""
    kind = draw(st.sampled_from(["cut", "flipped", "bomb", "noise"]))
    if kind == "cut":
        return CAT[: draw(st.integers(0, len(CAT) - 1))]
    if kind == "flipped":
        at = draw(st.integers(0, 600))  # the header and the first scan bytes
        return CAT[:at] + bytes([CAT[at] ^ draw(st.integers(1, 255))]) + CAT[at + 1 :]
    if kind == "bomb":
        side = draw(st.integers(8001, 9000))  # over the 64 Mpixel limit (both defaults)
        buf = io.BytesIO()
        Image.new("1", (side, side)).save(buf, "PNG")
        return buf.getvalue()
    return draw(st.binary(max_size=256))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(blob=damaged())
def test_a_single_get_refuses_what_the_model_layer_refuses(
    gateway, backend_s3, registered, objects, blob
):
    manifest, key = registered["r18"], "damaged.jpg"
    backend_s3.put_object(Bucket=BUCKET, Key=key, Body=blob)
    path = f"/{BUCKET}/{key}?hapi-model=r18&hapi-split=1"
    reply = httpx.get(
        gateway.endpoint_url + path, headers=signed_headers(gateway, "GET", path), timeout=60
    )
    refusal = _model_layers_refusal(blob, manifest, key)
    if refusal is None:
        assert reply.status_code == 200, reply.text
        return
    assert reply.status_code == 422, reply.text
    error = ET.fromstring(reply.content)
    assert error.findtext("Code") == "UnprocessableObject"
    assert error.findtext("Message") == refusal
    assert error.findtext("Resource") == f"/{BUCKET}/{key}"
    # Refused, and the store holds what it held.
    assert backend_s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == blob


def _jobs_per_request(
    store, monkeypatch, requests: list[tuple[str, str, bytes | None]]
) -> list[int]:
    """The jobs each request hands the decoding pool, the whole gateway in-process (its
    lean transport to the real store, the real blocks), one request after another."""
    from asgi_lifespan import LifespanManager

    from hapi.gateway import create_app
    from hapi.gateway.pushdown._fairness import FairPool
    from tests.gateway.support import CLIENT, client_signed

    handed: list[str] = []
    submit = FairPool.submit

    def counting(self: FairPool, identity: str, fn: Callable[..., Any], *args: Any, **kw: Any):
        handed.append(identity)
        return submit(self, identity, fn, *args, **kw)

    monkeypatch.setattr(FairPool, "submit", counting)
    config = GatewaySettings(
        backend_url=store.endpoint_url,
        backend_credentials=Credentials(
            store.credentials.access_key_id, store.credentials.secret_access_key
        ),
        clients={CLIENT[0]: ClientKey(CLIENT[1])},
        cache_enabled=False,
        device="cpu",
    )
    url = "http://gateway.test"

    async def scenario() -> list[int]:
        app = create_app(config)
        counts = []
        async with (
            LifespanManager(app) as running,
            httpx.AsyncClient(transport=httpx.ASGITransport(running.app), timeout=60) as client,
        ):
            for method, path, body in requests:
                handed.clear()
                headers = client_signed(method, url + path, body)
                reply = await client.request(method, url + path, headers=headers, content=body)
                assert reply.status_code == 200, reply.text
                counts.append(len(handed))
        return counts

    return asyncio.run(scenario())


def test_each_sample_crosses_one_hop_to_the_pool(store, registered, objects, monkeypatch):
    batch = json.dumps({"keys": ["cat.jpg", "cat2.jpg"], "model": "r18", "split": 1}).encode()
    counts = _jobs_per_request(
        store,
        monkeypatch,
        [
            ("GET", f"/{BUCKET}/cat.jpg?hapi-model=r18&hapi-split=1", None),
            ("GET", f"/{BUCKET}/cat.jpg?hapi-model=r18&hapi-split=0", None),
            ("POST", f"/{BUCKET}?hapi-batch", batch),
            ("GET", f"/{BUCKET}/shard.tar?hapi-model=r18&hapi-split=1", None),
        ],
    )
    # An image: one job that reads its header and decodes it. A batch of two images: one
    # each. A shard: its listing, then its one member's decode.
    assert counts == [1, 1, 2, 2]


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.9])
def test_a_batch_fails_an_image_that_breaks_in_its_decode_alone(
    gateway, backend_s3, registered, objects, cut
):
    """Its header reads as an image, its pixels do not: decoded as it is listed, the key
    fails alone, as one whose header is wrong does."""
    key = f"cut-{cut}.jpg"
    backend_s3.put_object(Bucket=BUCKET, Key=key, Body=CAT[: int(len(CAT) * cut)])
    body = json.dumps({"keys": ["cat.jpg", key], "model": "r18", "split": 1}).encode()
    path = f"/{BUCKET}?hapi-batch"
    reply = httpx.post(
        gateway.endpoint_url + path,
        content=body,
        headers=signed_headers(gateway, "POST", path, body=body),
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    tensors, meta = decode_features(reply.content)
    assert json.loads(meta["keys"]) == ["cat.jpg"] and tensors["features"].shape[0] == 1
    refusal = _model_layers_refusal(CAT[: int(len(CAT) * cut)], registered["r18"], key)
    assert json.loads(meta["errors"]) == {key: f"UnprocessableObject: {refusal}"}
    single = f"/{BUCKET}/cat.jpg?hapi-model=r18&hapi-split=1"
    alone = httpx.get(
        gateway.endpoint_url + single, headers=signed_headers(gateway, "GET", single), timeout=60
    )
    assert np.array_equal(decode_features(alone.content)[0]["features"], tensors["features"])
