"""Pushdown answers what can never succeed with a 4xx, and names what is wrong.

Each case here was a wrong status: a retryable 503 for a request that can never succeed, a
500 for bad input, a silent 200 with the raw object for a misspelled parameter, a 200 with
an empty tensor for a batch whose every key failed.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from hapi.protocol import decode_features as decode
from tests.support import RunningGateway, store_gateway

from ._pushdown_support import (
    batch_body,
    error_of,
    png_shard,
    put_many,
    signed_batch,
    signed_get,
    tiny_png,
)

QUEUE_BOUND = 8


@pytest.fixture(scope="module")
def gateway(
    store: Any, registered: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    with store_gateway(
        store,
        tmp_path_factory.mktemp("gateway-statuses"),
        env={"HAPI_MAX_QUEUE_SAMPLES": str(QUEUE_BOUND)},
    ) as running:
        yield running


@pytest.fixture(scope="module")
def bucket(backend_s3: Any) -> str:
    name = "adversarial-statuses"
    backend_s3.create_bucket(Bucket=name)
    put_many(
        backend_s3,
        name,
        {
            "one.png": tiny_png(),
            "big-shard.tar": png_shard(3 * QUEUE_BOUND),
            "notes.txt": b"not an image",
            "late-corrupt.tar": _shard_with_corrupt_member(at=3 * QUEUE_BOUND),
        },
    )
    return name


def _shard_with_corrupt_member(at: int) -> bytes:
    """A shard whose member ``at`` has a sound PNG header but truncated pixel data, so
    listing accepts it and only decoding (in a later window) finds it broken."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 10, 10)).save(buf, "PNG")
    broken = buf.getvalue()[:60]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in range(at + 1):
            payload = broken if i == at else tiny_png(i)
            info = tarfile.TarInfo(f"s/{i:04d}.png")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def _assert_error(reply: Any, status: int, code: str) -> str:
    assert reply.status_code == status, reply.text
    got_code, message, request_id = error_of(reply)
    assert got_code == code and request_id, reply.text
    return message


def test_a_shard_larger_than_the_queue_bound_is_served_not_slowed_down(gateway, bucket):
    reply = signed_get(gateway, f"/{bucket}/big-shard.tar?hapi-model=r18&hapi-split=1")
    assert reply.status_code == 200, reply.text
    tensors, meta = decode(reply.content)
    assert tensors["features"].shape[0] == 3 * QUEUE_BOUND
    assert len(json.loads(meta["keys"])) == 3 * QUEUE_BOUND


@pytest.mark.parametrize("ref", ["../../etc", "name@0", "r18@-1", "r18@x", "a/b", ""])
def test_a_malformed_model_reference_is_invalid_argument(gateway, bucket, ref):
    reply = signed_get(gateway, f"/{bucket}/one.png", {"x-hapi-model": ref, "x-hapi-split": "1"})
    _assert_error(reply, 400, "InvalidArgument")
    body = batch_body(["one.png"], model=ref, split=1)
    _assert_error(signed_batch(gateway, bucket, body), 400, "InvalidArgument")


def test_deeply_nested_batch_json_is_invalid_argument(gateway, bucket):
    nested = (
        b'{"keys": ["one.png"], "model": "r18", "split": 1, "x": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}"
    )
    _assert_error(signed_batch(gateway, bucket, nested), 400, "InvalidArgument")


@pytest.mark.parametrize("split", [1.9, True, "1", None, [1], {"k": 1}])
def test_a_batch_split_that_is_not_an_integer_is_refused(gateway, bucket, split):
    body = batch_body(["one.png"], model="r18", split=split)
    message = _assert_error(signed_batch(gateway, bucket, body), 400, "InvalidArgument")
    assert "split" in message


@pytest.mark.parametrize(
    ("query", "headers", "named"),
    [
        ("hapi-modle=r18&hapi-split=1", {}, "hapi-modle"),
        ("hapi-model=r18", {"x-hapi-splt": "1"}, "x-hapi-splt"),
        ("hapi-split=1", {}, "model"),
        ("", {"x-hapi-dtype": "float16"}, "model"),
        ("hapi-format=json", {}, "model"),
        ("hapi-model=", {}, "model"),
    ],
)
def test_pushdown_parameters_are_validated_as_a_set(gateway, bucket, query, headers, named):
    reply = signed_get(gateway, f"/{bucket}/one.png?{query}", headers)
    message = _assert_error(reply, 400, "InvalidArgument")
    assert named in message
    assert "x-hapi-model" in message and "x-hapi-split" in message  # names the known ones


def test_parameters_the_sdk_and_curl_send_are_accepted(gateway, bucket):
    reply = signed_get(
        gateway,
        f"/{bucket}/one.png?hapi-model=r18&hapi-split=auto&hapi-bandwidth=100mbit",
        {"x-hapi-dtype": "float16"},
    )
    assert reply.status_code == 200, reply.text
    assert signed_get(gateway, f"/{bucket}/one.png").content == tiny_png()


def test_unknown_batch_fields_are_refused(gateway, bucket):
    body = batch_body(["one.png"], model="r18", split=1, dtpye="float16")
    message = _assert_error(signed_batch(gateway, bucket, body), 400, "InvalidArgument")
    assert "dtpye" in message and "dtype" in message
    reply = signed_batch(
        gateway, bucket, batch_body(["one.png"], model="r18", split=1), "hapi-batch&hapi-modle=x"
    )
    _assert_error(reply, 400, "InvalidArgument")


def test_a_batch_whose_every_key_failed_is_an_error_with_reasons(gateway, bucket):
    body = batch_body(["missing.png", "notes.txt"], model="r18", split=1)
    reply = signed_batch(gateway, bucket, body)
    message = _assert_error(reply, 422, "UnprocessableObject")
    assert "missing.png" in message and "NoSuchKey" in message and "notes.txt" in message
    only_missing = signed_batch(gateway, bucket, batch_body(["missing.png"], model="r18", split=1))
    assert "missing.png" in _assert_error(only_missing, 404, "NoSuchKey")


def test_json_format_works_on_the_batch_post(gateway, bucket):
    body = batch_body(["one.png", "notes.txt"], model="r18", split=1)
    for reply in (
        signed_batch(gateway, bucket, body, "hapi-batch&hapi-format=json"),
        signed_batch(
            gateway,
            bucket,
            batch_body(["one.png", "notes.txt"], model="r18", split=1, format="json"),
        ),
    ):
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"] == "application/json"
        summary = reply.json()
        assert summary["keys"] == ["one.png"] and set(summary["errors"]) == {"notes.txt"}
        assert summary["shape"][0] == 1


@pytest.mark.parametrize("encoding", ["", "&hapi-encoding=zeros"], ids=["dense", "zeros"])
def test_a_sample_that_fails_after_the_first_rows_cuts_the_body_short(gateway, bucket, encoding):
    # The header and first rows are sent before the broken member's window is decoded;
    # the body must then end short of its Content-Length (or, encoded and chunked, short
    # of its last chunk and its end frame), never look complete.
    path = f"/{bucket}/late-corrupt.tar?hapi-model=r18&hapi-split=1{encoding}"
    with pytest.raises(httpx.RemoteProtocolError):
        signed_get(gateway, path)
    assert signed_get(gateway, f"/{bucket}/one.png?hapi-model=r18&hapi-split=1").status_code == 200
