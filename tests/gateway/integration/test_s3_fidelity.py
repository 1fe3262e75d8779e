"""The gateway answers as the store does: each request is sent to both, in the same test.

Headers, anonymous requests, presign expiry, chunked uploads and CORS (issue 13, items 2-7);
checksum and Content-MD5 headers (issue 28).
A request to the store is signed with the backend credentials, the same request to the
gateway with the client credentials; then status, error code, stored bytes and metadata
must agree.
"""

from __future__ import annotations

import base64
import hashlib
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError


class _Signer(S3SigV4Auth):
    """botocore's S3 signer with a given x-amz-content-sha256 (it hashes the body itself)."""

    def __init__(self, payload: str, *args: Any) -> None:
        super().__init__(*args)
        self._payload = payload

    def payload(self, request: AWSRequest) -> str:
        return self._payload


@dataclass(frozen=True)
class Endpoint:
    """Where to send a request and what to sign it with."""

    url: str
    key_id: str
    secret: str

    def signed_headers(
        self, method: str, path: str, headers: Mapping[str, str], payload: str
    ) -> dict[str, str]:
        request = AWSRequest(method=method, url=self.url + path, headers=dict(headers))
        _Signer(payload, Credentials(self.key_id, self.secret), "s3", "us-east-1").add_auth(request)
        return dict(request.headers.items())

    def presigned(self, path: str, expires: int) -> str:
        request = AWSRequest(method="GET", url=self.url + path)
        S3SigV4QueryAuth(
            Credentials(self.key_id, self.secret), "s3", "us-east-1", expires=expires
        ).add_auth(request)
        return str(request.url)


@pytest.fixture
def both(gateway: Any, store: Any) -> dict[str, Endpoint]:
    """The gateway (client credentials) and the store (backend credentials)."""
    return {
        "gateway": Endpoint(gateway.endpoint_url, gateway.access_key_id, gateway.secret_access_key),
        "store": Endpoint(
            store.endpoint_url,
            store.credentials.access_key_id,
            store.credentials.secret_access_key,
        ),
    }


def _code(reply: httpx.Response) -> str:
    if not reply.content.startswith(b"<?xml") or b"<Error>" not in reply.content:
        return ""
    return ET.fromstring(reply.content).findtext("Code") or ""


def _outcome(reply: httpx.Response) -> tuple[int, str]:
    return reply.status_code, _code(reply)


def _head(backend_s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        head = backend_s3.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return None
    body = backend_s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return {
        "body": body,
        "metadata": head["Metadata"],
        "content_type": head.get("ContentType"),
        "content_encoding": head.get("ContentEncoding"),
    }


# 3. X-Amz-Expires=0


def test_presigned_url_valid_for_zero_seconds_has_expired(both, backend_s3, bucket):
    backend_s3.put_object(Bucket=bucket, Key="k", Body=b"data")
    replies = {name: httpx.get(e.presigned(f"/{bucket}/k", expires=0)) for name, e in both.items()}
    assert _outcome(replies["gateway"]) == _outcome(replies["store"]) == (403, "AccessDenied")
    assert b"Request has expired" in replies["gateway"].content


# 4. Transfer-Encoding: chunked without Content-Length


def _chunks(data: bytes) -> Iterator[bytes]:
    yield data[:5]
    yield data[5:]


@pytest.mark.parametrize("payload", ["UNSIGNED-PAYLOAD", "sha256"])
def test_chunked_put_without_length(both, backend_s3, bucket, payload):
    data = b"a body sent in HTTP chunks"
    digest = hashlib.sha256(data).hexdigest() if payload == "sha256" else payload
    replies = {}
    for name, endpoint in both.items():
        path = f"/{bucket}/chunked-{name}"
        headers = endpoint.signed_headers("PUT", path, {}, digest)
        replies[name] = httpx.put(endpoint.url + path, headers=headers, content=_chunks(data))
        assert "content-length" not in {k.lower() for k in headers}
    assert _outcome(replies["gateway"]) == _outcome(replies["store"]) == (200, "")
    stored = {name: _head(backend_s3, bucket, f"chunked-{name}") for name in both}
    assert stored["gateway"] == stored["store"] and stored["store"]["body"] == data


def test_chunked_put_with_wrong_hash_writes_nothing(both, backend_s3, bucket):
    # SeaweedFS does not check x-amz-content-sha256 (it stores this body); S3 refuses it with
    # XAmzContentSHA256Mismatch, and so does the gateway, which must verify what it signs for.
    data = b"a body sent in HTTP chunks"
    gateway = both["gateway"]
    path = f"/{bucket}/bad"
    headers = gateway.signed_headers("PUT", path, {}, hashlib.sha256(b"something else").hexdigest())
    reply = httpx.put(gateway.url + path, headers=headers, content=_chunks(data))
    assert _outcome(reply) == (400, "XAmzContentSHA256Mismatch")
    assert _head(backend_s3, bucket, "bad") is None


# 5. Non-ASCII metadata, signed over its UTF-8 bytes


def test_utf8_metadata_is_verified_and_stored_byte_for_byte(both, backend_s3, bucket):
    value = "café ünïcødé ✓ à Å"  # à and Å hold bytes 0xA0 and 0x85 in UTF-8
    replies = {}
    for name, endpoint in both.items():
        path = f"/{bucket}/meta-{name}"
        # botocore signs the canonical request as UTF-8; the header goes out as UTF-8 bytes.
        headers = endpoint.signed_headers(
            "PUT", path, {"x-amz-meta-note": value}, "UNSIGNED-PAYLOAD"
        )
        wire = {k: v.encode() for k, v in headers.items()}
        replies[name] = httpx.put(endpoint.url + path, headers=wire, content=b"m")
    assert _outcome(replies["gateway"]) == _outcome(replies["store"]) == (200, "")
    raw = {
        name: httpx.get(
            both["store"].url + f"/{bucket}/meta-{name}",
            headers=both["store"].signed_headers(
                "GET", f"/{bucket}/meta-{name}", {}, hashlib.sha256(b"").hexdigest()
            ),
        ).headers.raw
        for name in both
    }
    metas = {
        name: [v for k, v in headers if k.lower() == b"x-amz-meta-note"]
        for name, headers in raw.items()
    }
    assert metas["gateway"] == metas["store"] == [value.encode()]


# 6. Content-Encoding as written


@pytest.mark.parametrize("encoding", ["deflate, gzip", "gzip,  br"])
def test_content_encoding_reaches_the_store_as_written(both, backend_s3, bucket, encoding):
    replies = {}
    for name, endpoint in both.items():
        path = f"/{bucket}/enc-{name}"
        headers = endpoint.signed_headers(
            "PUT", path, {"Content-Encoding": encoding}, "UNSIGNED-PAYLOAD"
        )
        replies[name] = httpx.put(endpoint.url + path, headers=headers, content=b"zz")
    assert _outcome(replies["gateway"]) == _outcome(replies["store"]) == (200, "")
    stored = {name: _head(backend_s3, bucket, f"enc-{name}") for name in both}
    assert stored["gateway"] == stored["store"]
    assert stored["store"]["content_encoding"] == encoding


def test_aws_chunked_is_removed_and_the_rest_kept(s3, backend_s3, bucket):
    # boto3 uploads with aws-chunked (and a CRC trailer) and adds it to Content-Encoding.
    s3.put_object(Bucket=bucket, Key="k", Body=b"x" * 100, ContentEncoding="deflate, gzip")
    backend_s3.put_object(Bucket=bucket, Key="d", Body=b"x" * 100, ContentEncoding="deflate, gzip")
    stored = {key: _head(backend_s3, bucket, key) for key in ("k", "d")}
    assert stored["k"] == stored["d"]
    assert stored["k"]["content_encoding"] == "deflate, gzip"


# Digests that do not match the body (issue 28): ceph's s3-tests send a wrong
# x-amz-checksum-sha256 and -crc64nvme. Nothing refused may reach the store.

_DIGEST_BYTES = {"sha256": 32, "crc64nvme": 8}


@pytest.mark.parametrize("algorithm", sorted(_DIGEST_BYTES))
@pytest.mark.parametrize("value", ["wrong", "bad", "not base64!", "AAAA"])
def test_wrong_checksum_header_is_bad_digest(both, backend_s3, bucket, algorithm, value):
    data = b"A" * 1024
    if value == "wrong":  # well-formed, the digest's length, not the body's digest
        value = base64.b64encode(bytes(_DIGEST_BYTES[algorithm])).decode()
    replies = {}
    for name, endpoint in both.items():
        path = f"/{bucket}/sum-{name}"
        headers = endpoint.signed_headers(
            "PUT", path, {f"x-amz-checksum-{algorithm}": value}, hashlib.sha256(data).hexdigest()
        )
        replies[name] = httpx.put(endpoint.url + path, headers=headers, content=data)
    assert _outcome(replies["gateway"]) == _outcome(replies["store"]) == (400, "BadDigest")
    assert {name: _head(backend_s3, bucket, f"sum-{name}") for name in both} == {
        "gateway": None,
        "store": None,
    }


@pytest.mark.parametrize(
    ("value", "code"), [("not base64!", "InvalidDigest"), ("AAAA", "BadDigest")]
)
def test_malformed_content_md5(both, backend_s3, bucket, value, code):
    replies = {}
    for name, endpoint in both.items():
        path = f"/{bucket}/md5-{name}"
        headers = endpoint.signed_headers("PUT", path, {"Content-MD5": value}, "UNSIGNED-PAYLOAD")
        replies[name] = httpx.put(endpoint.url + path, headers=headers, content=b"m")
    assert _outcome(replies["gateway"]) == _outcome(replies["store"]) == (400, code)
    assert _head(backend_s3, bucket, "md5-gateway") is None


# 2. Anonymous requests: judged by the store


_PUBLIC_READ = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": "*",
            "Action": ["s3:GetObject"],
            "Resource": ["arn:aws:s3:::{bucket}/public/*"],
        }
    ],
}


@pytest.fixture
def public_bucket(backend_s3, bucket) -> str:
    """A bucket whose ``public/`` prefix anyone may read; the rest is private."""
    policy = json.dumps(_PUBLIC_READ).replace("{bucket}", bucket)
    backend_s3.put_bucket_policy(Bucket=bucket, Policy=policy)
    backend_s3.put_object(Bucket=bucket, Key="public/a.txt", Body=b"for everyone")
    backend_s3.put_object(Bucket=bucket, Key="private/a.txt", Body=b"for the owner")
    return bucket


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "public/a.txt", 200),
        ("HEAD", "public/a.txt", 200),
        ("GET", "private/a.txt", 403),
        ("HEAD", "private/a.txt", 403),
        ("GET", "", 403),
    ],
)
def test_anonymous_request_is_judged_by_the_store(both, public_bucket, method, path, expected):
    replies = {
        name: httpx.request(method, f"{e.url}/{public_bucket}/{path}") for name, e in both.items()
    }
    assert _outcome(replies["gateway"]) == _outcome(replies["store"])
    assert replies["gateway"].status_code == expected
    if expected == 200:
        assert replies["gateway"].content == replies["store"].content
        assert replies["gateway"].headers["etag"] == replies["store"].headers["etag"]
    else:
        assert b"for the owner" not in replies["gateway"].content


def test_anonymous_write_is_refused_as_by_the_store(both, backend_s3, public_bucket):
    replies = {
        name: httpx.put(f"{e.url}/{public_bucket}/public/{name}", content=b"x")
        for name, e in both.items()
    }
    assert _outcome(replies["gateway"]) == _outcome(replies["store"]) == (403, "AccessDenied")
    assert {name: _head(backend_s3, public_bucket, f"public/{name}") for name in both} == {
        "gateway": None,
        "store": None,
    }


# 7. CORS


@pytest.fixture
def cors_bucket(backend_s3, bucket) -> str:
    backend_s3.put_bucket_cors(
        Bucket=bucket,
        CORSConfiguration={
            "CORSRules": [
                {
                    "AllowedOrigins": ["https://app.example"],
                    "AllowedMethods": ["GET", "PUT"],
                    "AllowedHeaders": ["*"],
                    "ExposeHeaders": ["ETag"],
                    "MaxAgeSeconds": 600,
                }
            ]
        },
    )
    backend_s3.put_object(Bucket=bucket, Key="k", Body=b"cors")
    return bucket


def _cors(reply: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in reply.headers.items() if k.startswith("access-control-")}


@pytest.mark.parametrize("origin", ["https://app.example", "https://elsewhere.example"])
def test_cors_preflight_is_answered_by_the_store(both, cors_bucket, origin):
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "content-type,x-amz-date",
    }
    replies = {
        name: httpx.options(f"{e.url}/{cors_bucket}/k", headers=headers) for name, e in both.items()
    }
    assert _outcome(replies["gateway"]) == _outcome(replies["store"])
    assert _cors(replies["gateway"]) == _cors(replies["store"])
    if origin == "https://app.example":
        assert replies["gateway"].status_code == 200
        assert _cors(replies["gateway"])["access-control-allow-origin"] == origin


def test_cors_headers_of_the_actual_request_pass_through(both, cors_bucket):
    replies = {}
    for name, endpoint in both.items():
        path = f"/{cors_bucket}/k"
        headers = endpoint.signed_headers(
            "GET", path, {"Origin": "https://app.example"}, hashlib.sha256(b"").hexdigest()
        )
        replies[name] = httpx.get(endpoint.url + path, headers=headers)
    assert _outcome(replies["gateway"]) == _outcome(replies["store"]) == (200, "")
    assert _cors(replies["gateway"]) == _cors(replies["store"])
    assert replies["gateway"].headers["access-control-allow-origin"] == "https://app.example"
