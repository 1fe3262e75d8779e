"""The ``zeros`` encoding through the real gateway: the dense answer's bytes exactly, fewer of
them where a ReLU left zeros, in every path an answer takes (a GET, a batch sent whole, a
batch streamed, the cache), and refused where it cannot mean anything."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import httpx
import numpy as np
import pytest
from skimage import data as samples

from hapi import sdk
from hapi.gateway.pushdown._stream import WHOLE_RESPONSE_BYTES
from hapi.protocol import decode_features, decode_zeros
from tests.support import encode_image, signed_headers

PHOTOS = ("chelsea", "astronaut", "coffee", "rocket")  # scikit-image's sample photos
IMAGES = [f"{name}.jpg" for name in PHOTOS]


@pytest.fixture(scope="module")
def images(backend_s3, store):
    bucket = "zeros-data"
    backend_s3.create_bucket(Bucket=bucket)
    for name, key in zip(PHOTOS, IMAGES, strict=True):
        photo = encode_image(getattr(samples, name)(), "JPEG")
        backend_s3.put_object(Bucket=bucket, Key=key, Body=photo)
    backend_s3.put_object(Bucket=bucket, Key="notes.txt", Body=b"not an image")
    return bucket


def _get(gateway, bucket: str, key: str, **params: object) -> httpx.Response:
    query = "&".join(f"hapi-{k}={v}" for k, v in params.items())
    path = f"/{bucket}/{key}?{query}"
    headers = signed_headers(gateway, "GET", path)
    return httpx.get(gateway.endpoint_url + path, headers=headers, timeout=120)


def _post(gateway, bucket: str, spec: dict[str, object]) -> httpx.Response:
    body = json.dumps(spec).encode()
    path = f"/{bucket}?hapi-batch"
    headers = signed_headers(gateway, "POST", path, body=body)
    return httpx.post(gateway.endpoint_url + path, content=body, headers=headers, timeout=120)


def _dense_of(reply: httpx.Response) -> bytes:
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-hapi-encoding"] == "zeros"
    return decode_zeros(reply.content)


@pytest.mark.parametrize("name", ["r18", "enl0"])
def test_every_split_decodes_to_the_dense_answer_byte_for_byte(gateway, registered, images, name):
    for split in range(registered[name].freeze + 1):
        # The same rows both times: the first request computes them, the second reads
        # them back from the cache, so the bytes can be compared exactly.
        encoded = _get(gateway, images, "chelsea.jpg", model=name, split=split, encoding="zeros")
        dense = _get(gateway, images, "chelsea.jpg", model=name, split=split)
        assert dense.status_code == 200 and "x-hapi-encoding" not in dense.headers
        assert _dense_of(encoded) == dense.content, (name, split)
        features = decode_features(dense.content)[0]["features"]
        if features.nbytes <= WHOLE_RESPONSE_BYTES:  # sent whole: its length is known
            assert int(encoded.headers["content-length"]) == len(encoded.content)
        else:  # streamed: known at its end only
            assert encoded.headers["transfer-encoding"] == "chunked", split
        # A frame drops its zeros when that pays (a tenth of the words zero, or more):
        # then the body is the dense one less its zero words, plus a bit a word and the
        # frames' own 5 bytes each; else no more than the frames' bytes over it.
        zeros, words = int(np.sum(features == 0)), features.size
        frames = 64
        if zeros > 0.1 * words:
            bound = len(dense.content) - 4 * zeros + words // 8 + 1 + frames
            assert len(encoded.content) <= bound, (name, split, zeros / words)
        else:
            assert len(encoded.content) <= len(dense.content) + frames, (name, split)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_drops_its_zero_words_too(gateway, registered, images, dtype):
    encoded = _get(
        gateway, images, "coffee.jpg", model="r18", split=4, dtype=dtype, encoding="zeros"
    )
    dense = _get(gateway, images, "coffee.jpg", model="r18", split=4, dtype=dtype)
    assert _dense_of(encoded) == dense.content
    assert len(encoded.content) < 0.7 * len(dense.content)


def test_a_streamed_batch_decodes_to_the_dense_batch(gateway, registered, images):
    # Split 1 of ResNet18 is 64x112x112 floats a sample: four samples are past the 1 MiB
    # a whole answer may be, so the encoded body streams with no Content-Length.
    keys = [*IMAGES, "notes.txt", "missing.jpg"]
    spec = {"keys": keys, "model": "r18", "split": 2, "cache": "bypass"}
    encoded = _post(gateway, images, {**spec, "encoding": "zeros"})
    dense = _post(gateway, images, spec)
    assert "content-length" not in encoded.headers
    assert encoded.headers.get("transfer-encoding") == "chunked"
    body = _dense_of(encoded)
    tensors, meta = decode_features(body)
    want, want_meta = decode_features(dense.content)
    np.testing.assert_array_equal(tensors["features"], want["features"])
    assert meta == want_meta and json.loads(meta["keys"]) == list(IMAGES)
    assert set(json.loads(meta["errors"])) == {"notes.txt", "missing.jpg"}
    assert len(encoded.content) < 0.8 * len(dense.content)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"encoding": "gzip"}, "x-hapi-encoding must be one of dense, zeros"),
        ({"encoding": ""}, "x-hapi-encoding must be one of dense, zeros"),
        ({"encoding": "zeros", "format": "json"}, "encodes safetensors answers"),
    ],
)
def test_an_encoding_that_means_nothing_is_refused(gateway, registered, images, params, message):
    reply = _get(gateway, images, "chelsea.jpg", model="r18", split=3, **params)
    assert reply.status_code == 400, reply.text
    error = ET.fromstring(reply.content)
    assert error.findtext("Code") == "InvalidArgument" and message in error.findtext("Message")
    spec = {"keys": ["chelsea.jpg"], "model": "r18", "split": 3, **params}
    batch = _post(gateway, images, spec)
    assert batch.status_code == 400 and message in batch.text


def test_the_sdk_asks_for_zeros_and_hands_back_the_same_features(gateway, registered, images):
    s3 = sdk.client(
        gateway.endpoint_url,
        aws_access_key_id=gateway.access_key_id,
        aws_secret_access_key=gateway.secret_access_key,
        region_name="us-east-1",
    )
    keys = list(IMAGES)
    sent: list[object] = []
    s3.meta.events.register("before-send.s3.GetObject", lambda request, **_: sent.append(request))
    one = s3.get_features(images, keys[0], model="r18", split=4)
    signed = sent[0].headers["Authorization"].decode().split("SignedHeaders=")[1].split(",")[0]
    assert "x-hapi-encoding" in signed.split(";")
    dense_one = s3.get_features(images, keys[0], model="r18", split=4, encoding="dense")
    np.testing.assert_array_equal(one.features, dense_one.features)
    assert one.nbytes < 0.75 * dense_one.nbytes  # what crossed the wire, encoded
    batch = s3.get_features_batch(images, keys, model="r18", split=4)
    dense = s3.get_features_batch(images, keys, model="r18", split=4, encoding="dense")
    np.testing.assert_array_equal(batch.features, dense.features)
    assert batch.keys == dense.keys == tuple(keys) and batch.nbytes < 0.75 * dense.nbytes
    with pytest.raises(ValueError, match="encoding must be one of dense, zeros"):
        s3.get_features(images, keys[0], model="r18", split=4, encoding="gzip")
