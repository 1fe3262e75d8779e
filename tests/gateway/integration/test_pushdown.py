"""Pushdown through the real gateway: features computed next to the data equal torch's."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import xml.etree.ElementTree as ET

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data as samples

from hapi import models
from hapi.models import testing
from hapi.protocol import decode_features as decode
from tests.support import control_get, encode_image, signed_headers

IMAGES = {
    "cat.jpg": samples.chelsea(),
    "astronaut.png": samples.astronaut(),
    "coffee.webp": samples.coffee(),
}


@pytest.fixture(scope="module")
def images(backend_s3, store):
    bucket = "pushdown-data"
    backend_s3.create_bucket(Bucket=bucket)
    blobs = {}
    for key, array in IMAGES.items():
        fmt = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[key.rsplit(".", 1)[1]]
        blobs[key] = encode_image(array, fmt)
        backend_s3.put_object(Bucket=bucket, Key=key, Body=blobs[key])
    backend_s3.put_object(Bucket=bucket, Key="shard-000.tar", Body=_shard(blobs))
    backend_s3.put_object(Bucket=bucket, Key="notes.txt", Body=b"not an image at all")
    return bucket, blobs


def _shard(blobs: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for label, (key, blob) in enumerate(blobs.items()):
            stem, ext = key.rsplit(".", 1)
            for name, payload in (
                (f"s/{stem}.{ext}", blob),
                (f"s/{stem}.cls", str(label).encode()),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _get(gateway, bucket: str, key: str, **params: object) -> httpx.Response:
    query = "&".join(f"hapi-{k}={v}" for k, v in params.items())
    path = f"/{bucket}/{key}" + (f"?{query}" if query else "")
    headers = signed_headers(gateway, "GET", path)
    return httpx.get(gateway.endpoint_url + path, headers=headers, timeout=60)


def _torch_features(
    family: str, manifest, blob: bytes, split: int, freeze: int | None = None
) -> np.ndarray:
    decomposition = testing.build(family)
    x = torch.from_numpy(models.preprocess(Image.open(io.BytesIO(blob)), manifest.preprocess)[None])
    with torch.no_grad():
        for block in decomposition.blocks[:split]:
            x = block(x)
    return x.numpy()


@pytest.mark.parametrize(("name", "family"), [("r18", "resnet18"), ("enl0", "efficientnet_lite0")])
def test_every_split_matches_torch(gateway, registered, images, name, family):
    bucket, blobs = images
    manifest = registered[name]
    for split in range(manifest.freeze + 1):
        reply = _get(gateway, bucket, "cat.jpg", model=name, split=split)
        assert reply.status_code == 200, reply.text
        tensors, meta = decode(reply.content)
        want = _torch_features(family, manifest, blobs["cat.jpg"], split)
        assert tensors["features"].shape == want.shape
        # 1e-4 absolute, scaled for activations above 1 in magnitude (EfficientNet's reach
        # ~15 by block 4, where float32 rounding across blocks alone is ~1e-5 relative).
        tolerance = 1e-4 * max(1.0, float(np.abs(want).max()))
        assert np.abs(tensors["features"] - want).max() <= tolerance, (name, split)
        assert reply.headers["x-hapi-shape"] == ",".join(map(str, want.shape))
        assert reply.headers["x-hapi-model"] == manifest.ref and reply.headers[
            "x-hapi-split"
        ] == str(split)
        assert meta["keys"] == '["cat.jpg"]' and meta["split"] == str(split)
        timings = {p.split(";")[0] for p in reply.headers["server-timing"].split(", ")}
        computed = reply.headers["x-hapi-cache"] == "miss"  # a hit fetches and runs nothing
        stages = {"cache", "fetch", "decode", "infer"} if computed else {"cache"}
        assert timings == stages | {"total"}


def test_half_precision_halves_the_bytes(gateway, registered, images):
    bucket, _blobs = images
    full = decode(_get(gateway, bucket, "astronaut.png", model="r18", split=4).content)[0][
        "features"
    ]
    for dtype, tolerance in (("float16", 1e-2), ("bfloat16", 2e-2)):
        reply = _get(gateway, bucket, "astronaut.png", model="r18", split=4, dtype=dtype)
        assert reply.headers["x-hapi-dtype"] == dtype
        half = decode(reply.content)[0]["features"]
        assert len(reply.content) < 0.51 * full.nbytes + 4096
        relative = np.abs(half - full).max() / np.abs(full).max()
        assert relative <= tolerance, (dtype, relative)


def test_shard_returns_every_sample_with_labels(gateway, registered, images):
    bucket, _blobs = images
    reply = _get(gateway, bucket, "shard-000.tar", model="r18", split=5)
    assert reply.status_code == 200, reply.text
    tensors, meta = decode(reply.content)
    assert tensors["features"].shape[0] == 3
    assert tensors["labels"].tolist() == [0, 1, 2]
    assert json.loads(meta["keys"]) == [
        "shard-000.tar#s/cat",
        "shard-000.tar#s/astronaut",
        "shard-000.tar#s/coffee",
    ]
    single = decode(_get(gateway, bucket, "coffee.webp", model="r18", split=5).content)[0][
        "features"
    ]
    assert np.abs(tensors["features"][2] - single[0]).max() <= 1e-4


def test_batch_post_stacks_in_order_and_lists_errors(gateway, registered, images):
    bucket, _ = images
    body = json.dumps(
        {"keys": ["coffee.webp", "missing.jpg", "cat.jpg", "notes.txt"], "model": "r18", "split": 3}
    ).encode()
    path = f"/{bucket}?hapi-batch"
    headers = signed_headers(gateway, "POST", path, body=body)
    reply = httpx.post(gateway.endpoint_url + path, content=body, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text
    tensors, meta = decode(reply.content)
    assert json.loads(meta["keys"]) == ["coffee.webp", "cat.jpg"]
    errors = json.loads(meta["errors"])
    assert set(errors) == {"missing.jpg", "notes.txt"}
    assert errors["missing.jpg"].startswith("NoSuchKey") and errors["notes.txt"].startswith(
        "UnprocessableObject"
    )
    one = decode(_get(gateway, bucket, "cat.jpg", model="r18", split=3).content)[0]["features"]
    assert np.abs(tensors["features"][1] - one[0]).max() <= 1e-4


def test_json_summary_for_curl(gateway, registered, images):
    bucket, _ = images
    reply = _get(gateway, bucket, "cat.jpg", model="enl0", split=2, format="json")
    summary = reply.json()
    assert reply.headers["content-type"] == "application/json"
    assert summary["shape"][0] == 1 and summary["model"] == "enl0" and summary["split"] == "2"
    assert summary["min"] <= summary["mean"] <= summary["max"] and len(summary["first_values"]) == 8


@pytest.mark.parametrize(
    ("key", "params", "status", "code"),
    [
        ("cat.jpg", {"model": "no-such-model", "split": 1}, 404, "NoSuchModel"),
        ("cat.jpg", {"model": "r18", "split": 7}, 400, "InvalidArgument"),
        ("cat.jpg", {"model": "r18", "split": -1}, 400, "InvalidArgument"),
        ("cat.jpg", {"model": "r18", "split": "two"}, 400, "InvalidArgument"),
        ("cat.jpg", {"model": "r18", "split": 1, "dtype": "int8"}, 400, "InvalidArgument"),
        ("cat.jpg", {"model": "r18"}, 400, "InvalidArgument"),
        ("notes.txt", {"model": "r18", "split": 2}, 422, "UnprocessableObject"),
        ("missing.jpg", {"model": "r18", "split": 2}, 404, "NoSuchKey"),
    ],
)
def test_bad_input_is_s3_xml(gateway, registered, images, key, params, status, code):
    bucket, _ = images
    reply = _get(gateway, bucket, key, **params)
    assert reply.status_code == status, reply.text
    error = ET.fromstring(reply.content)
    assert error.findtext("Code") == code
    if code == "UnprocessableObject":
        assert key in error.findtext("Message") and error.findtext("Resource") == f"/{bucket}/{key}"


def test_decompression_bomb_is_refused_before_decoding(gateway, registered, backend_s3, images):
    bucket, _ = images
    buf = io.BytesIO()
    Image.new("L", (12000, 12000)).save(buf, "PNG")  # 144 Mpixel, a few hundred KB compressed
    backend_s3.put_object(Bucket=bucket, Key="bomb.png", Body=buf.getvalue())
    reply = _get(gateway, bucket, "bomb.png", model="r18", split=1)
    assert reply.status_code == 422 and "exceeds the limit" in reply.text


def test_plain_get_is_untouched(gateway, registered, images):
    bucket, blobs = images
    reply = _get(gateway, bucket, "cat.jpg")
    assert reply.status_code == 200 and reply.content == blobs["cat.jpg"]


def test_model_registered_while_running_is_servable(gateway, backend_s3, images):
    bucket, _ = images
    assert _get(gateway, bucket, "cat.jpg", model="late-r18", split=1).status_code == 404
    registry = models.Registry(backend_s3)
    registry.register("late-r18", models.export_model("resnet18", freeze=2))
    reply = _get(gateway, bucket, "cat.jpg", model="late-r18", split=2)
    assert reply.status_code == 200, reply.text


def test_concurrent_clients_with_different_models(gateway, registered, images):
    bucket, _blobs = images
    expected = {
        (name, split): decode(_get(gateway, bucket, "cat.jpg", model=name, split=split).content)[0][
            "features"
        ]
        for name, split in (("r18", 3), ("r18", 6), ("enl0", 4))
    }

    async def one(
        client: httpx.AsyncClient, name: str, split: int
    ) -> tuple[tuple[str, int], np.ndarray]:
        path = f"/{bucket}/cat.jpg?hapi-model={name}&hapi-split={split}"
        reply = await client.get(
            gateway.endpoint_url + path, headers=signed_headers(gateway, "GET", path)
        )
        assert reply.status_code == 200, reply.text
        return (name, split), decode(reply.content)[0]["features"]

    async def main() -> list[tuple[tuple[str, int], np.ndarray]]:
        async with httpx.AsyncClient(timeout=120) as client:
            jobs = [one(client, *key) for key in expected for _ in range(8)]
            return await asyncio.gather(*jobs)

    results = asyncio.run(main())
    assert len(results) == 24
    for key, features in results:
        assert np.abs(features - expected[key]).max() <= 1e-4, key
    stats = control_get(gateway, "/_hapi/stats").json()
    assert (
        max(max(t["recent_batch_sizes"] or [0]) for t in stats["tenants"]) > 1
    )  # requests were batched together


def test_split_auto_uses_the_planner(gateway, registered, images):
    bucket, _ = images
    slow = _get(gateway, bucket, "cat.jpg", model="r18", split="auto", bandwidth="20mbit")
    assert slow.status_code == 200, slow.text
    split = int(slow.headers["x-hapi-split"])
    manifest = registered["r18"]
    # On a slow link the planner sends the smallest output the frozen blocks offer.
    smallest = min(range(1, manifest.freeze + 1), key=lambda k: manifest.blocks[k - 1].output_bytes)
    assert manifest.blocks[split - 1].output_bytes == manifest.blocks[smallest - 1].output_bytes
    assert decode(slow.content)[0]["features"].shape[1:] == tuple(
        manifest.blocks[split - 1].output_shape
    )
    bad = _get(gateway, bucket, "cat.jpg", model="r18", split="auto", bandwidth="fast")
    assert bad.status_code == 400 and "bandwidth" in bad.text
