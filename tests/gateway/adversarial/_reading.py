"""Raw requests as a hostile client writes them: any path bytes, repeated headers, the three
ways of signing (SigV4 header, SigV4 presigned, V2 presigned), aws-chunked bodies and form
uploads, for the suites that try to make the gateway read a request two ways."""

from __future__ import annotations

import base64
import datetime as dt
import functools
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote_to_bytes

import boto3

from hapi.gateway import sign_request
from hapi.protocol import Credentials
from tests.gateway.adversarial._support import Reply, exchange_at
from tests.gateway.support import botocore_chunked

Headers = Sequence[tuple[str, str]]
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Raw:
    """One request exactly as it goes on the wire (path and query as written)."""

    method: str
    target: str  # path and query, as sent
    headers: Headers = ()
    body: bytes = b""

    def encode(self) -> bytes:
        lines = [f"{self.method} {self.target} HTTP/1.1", *(f"{n}: {v}" for n, v in self.headers)]
        if not any(n.lower() == "content-length" for n, _ in self.headers):
            lines.append(f"content-length: {len(self.body)}")
        lines.append("connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


def send(endpoint_url: str, raw: Raw) -> Reply:
    return exchange_at(endpoint_url, raw.encode(), timeout=60)


def signed_v4(
    endpoint_url: str,
    creds: Credentials,
    method: str,
    target: str,
    headers: Headers = (),
    body: bytes = b"",
    *,
    host: str | None = None,
    repeat: Headers = (),
    payload: str | None = None,
) -> Raw:
    """SigV4 in the Authorization header over ``target`` as written; ``repeat`` headers are
    added after signing, so the request carries them twice. The payload is signed as its
    SHA-256 unless ``payload`` names another mode (``STREAMING-UNSIGNED-PAYLOAD-TRAILER``)."""
    signed = dict(headers)
    if host is not None:
        signed["host"] = host
    signed = sign_request(
        method=method,
        url=endpoint_url + target,
        headers=signed,
        credentials=creds,
        region="us-east-1",
        payload_sha256=payload or hashlib.sha256(body).hexdigest(),
    )
    return Raw(method, target, [*signed.items(), *repeat], body)


def aws_chunked(payload: bytes) -> tuple[list[tuple[str, str]], bytes]:
    """Headers and body of ``payload`` sent as current SDKs send it: aws-chunked, unsigned
    chunks, a CRC32 trailer (sign with ``payload=STREAMING_TRAILER``)."""
    headers = [
        ("content-encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", str(len(payload))),
        ("x-amz-trailer", "x-amz-checksum-crc32"),
    ]
    return headers, botocore_chunked(payload)


STREAMING_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"


def form_upload(
    endpoint_url: str, creds: Credentials | None, bucket: str, key: str, path: str
) -> Raw:
    """A browser form upload (POST Object) of ``key`` to ``bucket`` at ``path``: a V4
    policy signed by ``creds`` (boto3's ``generate_presigned_post``), or unsigned."""
    fields = {"key": key}
    if creds is not None:
        signer = _presigner(endpoint_url, creds)
        fields = signer.generate_presigned_post(bucket, key, ExpiresIn=300)["fields"]
    boundary = "hapiform" + hashlib.sha256(key.encode()).hexdigest()[:16]
    parts = [
        f'--{boundary}\r\ncontent-disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\ncontent-disposition: form-data; name="file"; filename="f.bin"\r\n'
        "content-type: application/octet-stream\r\n\r\nform-written\r\n"
        f"--{boundary}--\r\n"
    )
    body = "".join(parts).encode()
    host = endpoint_url.split("//", 1)[1]
    headers = [("host", host), ("content-type", f"multipart/form-data; boundary={boundary}")]
    return Raw("POST", path, headers, body)


def presigned_v4(
    endpoint_url: str, creds: Credentials, method: str, path: str, query: str = ""
) -> Raw:
    """A SigV4 presigned request (``X-Amz-*`` query), signed over ``path`` as written."""
    now = dt.datetime.now(dt.UTC)
    amz_date, day = f"{now:%Y%m%dT%H%M%SZ}", f"{now:%Y%m%d}"
    scope = f"{day}/us-east-1/s3/aws4_request"
    host = endpoint_url.split("//", 1)[1]
    params = {
        "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
        "X-Amz-Credential": f"{creds.access_key_id}/{scope}",
        "X-Amz-Date": amz_date,
        "X-Amz-Expires": "300",
        "X-Amz-SignedHeaders": "host",
    }
    pairs = [tuple(p.partition("=")[::2]) for p in query.split("&") if p]
    canonical_pairs = sorted(
        [(_enc(k), _enc(v)) for k, v in params.items()]
        + [(_enc(_dec(k)), _enc(_dec(v))) for k, v in pairs]
    )
    canonical_query = "&".join(f"{k}={v}" for k, v in canonical_pairs)
    canonical_path = quote(unquote_to_bytes(path), safe="/~")
    canonical = (
        f"{method}\n{canonical_path}\n{canonical_query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD"
    )
    to_sign = (
        f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    )
    key = f"AWS4{creds.secret_access_key}".encode()
    for part in (day, "us-east-1", "s3", "aws4_request"):
        key = hmac.digest(key, part.encode(), "sha256")
    signature = hmac.new(key, to_sign.encode(), "sha256").hexdigest()
    full = "&".join(
        [query, *(f"{k}={_enc(v)}" for k, v in params.items()), f"X-Amz-Signature={signature}"]
    ).lstrip("&")
    return Raw(method, f"{path}?{full}", [("host", host)])


def presigned_v2(
    endpoint_url: str, creds: Credentials, method: str, path: str, query: str = ""
) -> Raw:
    """A V2 presigned request over ``path`` as written (the resource V2 signs)."""
    expires = str(int(dt.datetime.now(dt.UTC).timestamp()) + 300)
    subresources = [p for p in query.split("&") if p and p.split("=")[0] in _V2_SUBRESOURCES]
    resource = path + ("?" + "&".join(sorted(subresources)) if subresources else "")
    to_sign = f"{method}\n\n\n{expires}\n{resource}"
    digest = hmac.digest(creds.secret_access_key.encode(), to_sign.encode("latin-1"), "sha1")
    signature = quote(base64.b64encode(digest).decode(), safe="")
    auth = f"AWSAccessKeyId={creds.access_key_id}&Expires={expires}&Signature={signature}"
    host = endpoint_url.split("//", 1)[1]
    return Raw(method, f"{path}?{'&'.join(filter(None, [query, auth]))}", [("host", host)])


_V2_SUBRESOURCES = frozenset(
    {"acl", "delete", "tagging", "uploads", "uploadId", "partNumber", "versionId", "versioning"}
)


def _enc(text: str) -> str:
    return quote(text, safe="-_.~")


def _dec(text: str) -> str:
    return unquote_to_bytes(text.replace("+", " ")).decode("utf-8", "replace")


def delete_body(keys: Sequence[str]) -> bytes:
    objects = "".join(f"<Object><Key>{key}</Key></Object>" for key in keys)
    return f"<Delete>{objects}</Delete>".encode()


def content_md5(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode()


@functools.lru_cache(maxsize=16)
def _presigner(endpoint_url: str, creds: Credentials) -> Any:
    """A boto3 client that only signs (made once per credential: making one is slow)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
    )
