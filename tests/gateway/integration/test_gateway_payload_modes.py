"""Every payload mode clients send lands in the store byte for byte, without chunk framing."""

from __future__ import annotations

import hashlib
import os
import xml.etree.ElementTree as ET

import httpx
import pytest

from hapi.gateway import sign_request
from hapi.gateway.edge._sigv4 import verify_request
from hapi.protocol import Credentials
from tests.gateway.support import botocore_chunked, encode_signed

PAYLOAD = os.urandom(300_000)


def _put(
    gateway, bucket: str, key: str, mode: str, extra: dict[str, str], body: bytes
) -> httpx.Response:
    url = f"{gateway.endpoint_url}/{bucket}/{key}"
    headers = sign_request(
        method="PUT",
        url=url,
        headers=extra,
        credentials=Credentials(gateway.access_key_id, gateway.secret_access_key),
        payload_sha256=mode,
    )
    return httpx.put(url, content=body, headers=headers)


def _streaming_headers(trailer: str | None = None) -> dict[str, str]:
    headers = {"content-encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(PAYLOAD))}
    if trailer:
        headers["x-amz-trailer"] = trailer
    return headers


def _signed_chunked_body(gateway, bucket: str, key: str) -> tuple[dict[str, str], bytes]:
    mode = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    url = f"{gateway.endpoint_url}/{bucket}/{key}"
    creds = Credentials(gateway.access_key_id, gateway.secret_access_key)
    headers = sign_request(
        method="PUT", url=url, headers=_streaming_headers(), credentials=creds, payload_sha256=mode
    )
    verified = verify_request(
        method="PUT",
        raw_path=httpx.URL(url).raw_path.decode(),
        raw_query="",
        headers=list(headers.items()),
        secrets={creds.access_key_id: creds.secret_access_key},
    )
    chunks = [PAYLOAD[i : i + 65536] for i in range(0, len(PAYLOAD), 65536)]
    body, _ = encode_signed(chunks, verified)
    return headers, body


@pytest.mark.parametrize(
    "mode", ["sha256", "UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"]
)
def test_payload_mode_is_stored_byte_identical(gateway, backend_s3, bucket, mode):
    if mode == "sha256":
        reply = _put(gateway, bucket, "obj", hashlib.sha256(PAYLOAD).hexdigest(), {}, PAYLOAD)
    elif mode == "UNSIGNED-PAYLOAD":
        reply = _put(gateway, bucket, "obj", mode, {}, PAYLOAD)
    else:
        body = botocore_chunked(PAYLOAD, chunk_size=64 * 1024)
        reply = _put(gateway, bucket, "obj", mode, _streaming_headers("x-amz-checksum-crc32"), body)
    assert reply.status_code == 200, reply.text
    assert backend_s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == PAYLOAD


def test_signed_chunked_upload_is_stored_byte_identical(gateway, backend_s3, bucket):
    headers, body = _signed_chunked_body(gateway, bucket, "chunked")
    reply = httpx.put(f"{gateway.endpoint_url}/{bucket}/chunked", content=body, headers=headers)
    assert reply.status_code == 200, reply.text
    assert backend_s3.get_object(Bucket=bucket, Key="chunked")["Body"].read() == PAYLOAD


def test_bad_chunk_signature_stores_nothing(gateway, backend_s3, bucket):
    headers, body = _signed_chunked_body(gateway, bucket, "forged")
    forged = (
        body[:-200] + bytes([body[-200] ^ 1]) + body[-199:]
    )  # flip a byte in the last data chunk
    reply = httpx.put(f"{gateway.endpoint_url}/{bucket}/forged", content=forged, headers=headers)
    assert reply.status_code in (400, 403)
    assert ET.fromstring(reply.content).findtext("Code") in {
        "SignatureDoesNotMatch",
        "IncompleteBody",
    }
    listed = backend_s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    assert "forged" not in [o["Key"] for o in listed]


def test_bad_sha256_stores_nothing(gateway, backend_s3, bucket):
    reply = _put(gateway, bucket, "badhash", hashlib.sha256(b"other").hexdigest(), {}, PAYLOAD)
    assert reply.status_code == 400
    assert ET.fromstring(reply.content).findtext("Code") == "XAmzContentSHA256Mismatch"
    assert "badhash" not in [
        o["Key"] for o in backend_s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    ]
