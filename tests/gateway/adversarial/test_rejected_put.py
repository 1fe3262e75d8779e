"""No rejected PUT and no vanishing client changes what the store holds.

SeaweedFS commits an empty object when a request head is followed by the connection's end
with no body byte; a gateway that opens the upstream request before it holds a verified
byte turns every rejected single-read PUT into a 0-byte overwrite.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config

from hapi.gateway.edge._sigv4 import verify_request
from tests.gateway.adversarial._support import encode_request, exchange, send_and_vanish
from tests.gateway.support import botocore_chunked, encode_signed
from tests.support import RunningGateway, signed_headers

ORIGINAL = b"the original bytes, which must survive"
PAYLOAD = os.urandom(1000)
Case = Callable[[RunningGateway, str], tuple[dict[str, str], bytes]]


def _wrong_sha256(gw: RunningGateway, path: str) -> tuple[dict[str, str], bytes]:
    wrong = hashlib.sha256(b"something else").hexdigest()
    return signed_headers(gw, "PUT", path, payload=wrong), PAYLOAD


def _wrong_sha256_empty(gw: RunningGateway, path: str) -> tuple[dict[str, str], bytes]:
    wrong = hashlib.sha256(b"x").hexdigest()
    headers = signed_headers(gw, "PUT", path, payload=wrong, headers={"content-length": "0"})
    return headers, b""


def _wrong_chunk_signature(gw: RunningGateway, path: str) -> tuple[dict[str, str], bytes]:
    mode = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    extra = {
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(PAYLOAD)),
    }
    headers = signed_headers(gw, "PUT", path, payload=mode, headers=extra)
    verified = verify_request(
        method="PUT",
        raw_path=path,
        raw_query="",
        headers=list(headers.items()),
        secrets={gw.access_key_id: gw.secret_access_key},
    )
    body, _ = encode_signed([PAYLOAD[:500], PAYLOAD[500:]], verified)
    position = body.index(PAYLOAD[600:610])
    return headers, body[:position] + bytes([body[position] ^ 1]) + body[position + 1 :]


def _trailer_headers(gw: RunningGateway, path: str, declared: int) -> dict[str, str]:
    extra = {
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(declared),
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    return signed_headers(
        gw, "PUT", path, payload="STREAMING-UNSIGNED-PAYLOAD-TRAILER", headers=extra
    )


def _wrong_crc32_trailer(gw: RunningGateway, path: str) -> tuple[dict[str, str], bytes]:
    body = botocore_chunked(PAYLOAD)
    right = base64.b64encode(zlib.crc32(PAYLOAD).to_bytes(4, "big"))
    wrong = base64.b64encode(zlib.crc32(b"other").to_bytes(4, "big"))
    assert right in body
    return _trailer_headers(gw, path, len(PAYLOAD)), body.replace(right, wrong)


def _wrong_checksum_header(gw: RunningGateway, path: str) -> tuple[dict[str, str], bytes]:
    wrong = base64.b64encode(zlib.crc32(b"other").to_bytes(4, "big")).decode()
    return signed_headers(gw, "PUT", path, headers={"x-amz-checksum-crc32": wrong}), PAYLOAD


def _shorter_than_declared(gw: RunningGateway, path: str) -> tuple[dict[str, str], bytes]:
    return _trailer_headers(gw, path, len(PAYLOAD) + 10), botocore_chunked(PAYLOAD)


CASES: dict[str, tuple[Case, str]] = {
    "wrong-sha256": (_wrong_sha256, "XAmzContentSHA256Mismatch"),
    "wrong-sha256-empty-body": (_wrong_sha256_empty, "XAmzContentSHA256Mismatch"),
    "wrong-chunk-signature": (_wrong_chunk_signature, "SignatureDoesNotMatch"),
    "wrong-crc32-trailer": (_wrong_crc32_trailer, "BadDigest"),
    "wrong-checksum-header": (_wrong_checksum_header, "BadDigest"),
    "shorter-than-declared": (_shorter_than_declared, "IncompleteBody"),
}


def _stored(backend_s3: Any, bucket: str, key: str) -> bytes | None:
    try:
        return backend_s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except backend_s3.exceptions.NoSuchKey:
        return None


def _settled(backend_s3: Any, bucket: str, key: str, expected: bytes | None) -> bytes | None:
    """What the store holds once a late write would have landed (bounded wait)."""
    deadline = time.monotonic() + 1
    while (held := _stored(backend_s3, bucket, key)) == expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return held


def _await_log(gw: RunningGateway, needle: str) -> None:
    deadline = time.monotonic() + 15
    while needle not in gw.log():
        assert time.monotonic() < deadline, f"no {needle!r} in the gateway log"
        time.sleep(0.05)


@pytest.mark.parametrize("existing", [True, False], ids=["overwrite", "new-key"])
@pytest.mark.parametrize("case", list(CASES))
def test_rejected_single_read_put_changes_nothing(
    gateway, backend_s3, bucket, case: str, existing: bool
):
    build, code = CASES[case]
    key = f"victim-{case}"
    if existing:
        backend_s3.put_object(Bucket=bucket, Key=key, Body=ORIGINAL)
    path = f"/{bucket}/{key}"
    headers, body = build(gateway, path)
    reply = exchange(gateway, encode_request("PUT", path, headers, body))
    assert reply.status in (400, 403), reply
    assert ET.fromstring(reply.body).findtext("Code") == code
    expected = ORIGINAL if existing else None
    assert _settled(backend_s3, bucket, key, expected) == expected


@pytest.mark.parametrize("existing", [True, False], ids=["overwrite", "new-key"])
@pytest.mark.parametrize("sent", [0, 300_000], ids=["head-only", "mid-body"])
def test_client_that_vanishes_changes_nothing(gateway, backend_s3, bucket, sent, existing):
    key = f"vanish-{sent}-{existing}"
    if existing:
        backend_s3.put_object(Bucket=bucket, Key=key, Body=ORIGINAL)
    path = f"/{bucket}/{key}"
    headers = signed_headers(gateway, "PUT", path, headers={"content-length": str(2_000_000)})
    send_and_vanish(gateway, encode_request("PUT", path, headers) + os.urandom(sent))
    _await_log(gateway, f"PUT {path} status=499")
    expected = ORIGINAL if existing else None
    assert _settled(backend_s3, bucket, key, expected) == expected


def test_rejected_multi_read_put_changes_nothing(gateway, backend_s3, bucket):
    backend_s3.put_object(Bucket=bucket, Key="big", Body=ORIGINAL)
    body = os.urandom(3 * 1024 * 1024)
    url = f"{gateway.endpoint_url}/{bucket}/big"
    wrong = hashlib.sha256(b"other").hexdigest()
    headers = signed_headers(gateway, "PUT", f"/{bucket}/big", payload=wrong)
    reply = httpx.put(url, content=body, headers=headers)
    assert reply.status_code == 400
    assert _settled(backend_s3, bucket, "big", ORIGINAL) == ORIGINAL


def test_empty_put_still_stores_an_empty_object(gateway, backend_s3, bucket):
    backend_s3.put_object(Bucket=bucket, Key="empty", Body=ORIGINAL)
    path = f"/{bucket}/empty"
    headers = signed_headers(
        gateway,
        "PUT",
        path,
        payload=hashlib.sha256(b"").hexdigest(),
        headers={"content-length": "0"},
    )
    reply = exchange(gateway, encode_request("PUT", path, headers))
    assert reply.status == 200, reply
    assert _stored(backend_s3, bucket, "empty") == b""


@pytest.mark.parametrize("version", ["s3", "s3v4"])
def test_presigned_put_whose_client_vanishes_changes_nothing(gateway, backend_s3, bucket, version):
    key = f"presigned-{version}"
    backend_s3.put_object(Bucket=bucket, Key=key, Body=ORIGINAL)
    presigner = boto3.client(
        "s3",
        endpoint_url=gateway.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=gateway.access_key_id,
        aws_secret_access_key=gateway.secret_access_key,
        config=Config(signature_version=version, s3={"addressing_style": "path"}),
    )
    url = httpx.URL(
        presigner.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key})
    )
    target = url.raw_path.decode()
    host = f"{url.host}:{url.port}"
    send_and_vanish(
        gateway, encode_request("PUT", target, {"host": host, "content-length": "5000"})
    )
    _await_log(gateway, f"PUT /{bucket}/{key} status=499")
    assert _settled(backend_s3, bucket, key, ORIGINAL) == ORIGINAL
