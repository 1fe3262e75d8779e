"""Signing requests with AWS Signature Version 4, for the gateway's own calls upstream.

One signer for both halves of the gateway: the pass-through signs a forwarded request as
its caller's store identity, and the store client (pushdown's fetches, the registry, the
cache) signs as the backend identity or the caller's. The canonical forms here are also
what :mod:`.edge._sigv4` verifies clients' signatures against.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import SplitResult, quote, unquote_to_bytes, urlsplit

from hapi.protocol import Credentials

__all__ = ["ALGORITHM", "UNSIGNED_PAYLOAD", "sign_request", "sign_target"]

ALGORITHM = "AWS4-HMAC-SHA256"
DEFAULT_PORTS = {"http": 80, "https": 443}  # a Host header leaves these out
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# The headers botocore never signs (botocore.auth.SIGNED_HEADERS_BLACKLIST): hop-by-hop ones
# a proxy may rewrite, plus user-agent and the X-Ray trace id.
_UNSIGNABLE = frozenset(
    {
        "authorization",
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "te",
        "proxy-authorization",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "x-amzn-trace-id",
    }
)
ASCII_WHITESPACE = " \t\n\r\x0b\x0c"
_ASCII_SPACES = re.compile(r"[ \t\n\r\x0b\x0c]+")
_UNRESERVED = re.compile(r"[A-Za-z0-9\-_.~]*")
_UNRESERVED_PATH = re.compile(r"[A-Za-z0-9\-_.~/]*")


def sign_request(
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    credentials: Credentials,
    region: str = "us-east-1",
    payload_sha256: str = UNSIGNED_PAYLOAD,
    now: datetime | None = None,
) -> dict[str, str]:
    """Sign an upstream S3 request with SigV4 the way botocore's ``S3SigV4Auth`` does.

    The path and query are signed in AWS's canonical encoding, which is the URL itself
    whenever it was built the way botocore builds URLs (``quote(key, safe="/~")``).

    Args:
        method: The HTTP method.
        url: The absolute URL the request goes to, path and query percent-encoded.
        headers: The headers to forward; all are signed but the hop-by-hop ones,
            ``user-agent`` and ``expect`` (as botocore does). Values are the bytes to send
            decoded as latin-1, as ASGI headers are (UTF-8 in them passes unchanged).
        credentials: The upstream key pair.
        region: The region in the credential scope.
        payload_sha256: The body's hex SHA-256, or ``UNSIGNED-PAYLOAD``.
        now: The signing time (UTC; naive values are taken as UTC).

    Returns:
        The headers to send, lowercase: ``headers`` plus ``host``, ``x-amz-date``,
        ``x-amz-content-sha256`` and ``authorization``.
    """
    parts = urlsplit(url)
    return sign_target(
        method=method,
        host=host_from_url(parts),
        path=parts.path,
        query=parts.query,
        headers=headers,
        credentials=credentials,
        region=region,
        payload_sha256=payload_sha256,
        now=now,
    )


def sign_target(
    *,
    method: str,
    host: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    credentials: Credentials,
    region: str = "us-east-1",
    payload_sha256: str = UNSIGNED_PAYLOAD,
    now: datetime | None = None,
) -> dict[str, str]:
    """:func:`sign_request` for a URL already in parts: ``host`` (the ``Host`` header, with a
    port other than the scheme's), the percent-encoded ``path`` and ``query``."""
    amz_date = amz_date_of(now or datetime.now(UTC))
    out = {name.lower(): value for name, value in headers.items()}
    out.pop("authorization", None)
    out.setdefault("host", host)
    out["x-amz-date"] = amz_date
    out["x-amz-content-sha256"] = payload_sha256
    names = sorted(name for name in out if name not in _UNSIGNABLE)
    signed = ";".join(names)
    canonical_headers = "".join(f"{name}:{trim(out[name])}\n" for name in names)
    canonical_qs = canonical_query(split_query(query), plus_is_space=True)
    canonical = (
        f"{method}\n{canonical_path(path)}\n{canonical_qs}\n"
        f"{canonical_headers}\n{signed}\n{payload_sha256}"
    )
    scope = f"{amz_date[:8]}/{region}/s3/aws4_request"
    key = signing_key(credentials.secret_access_key, amz_date[:8], region, "s3")
    signature = sign(key, amz_date, scope, canonical)
    out["authorization"] = (
        f"{ALGORITHM} Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return out


def amz_date_of(when: datetime) -> str:
    """``when`` as an ``X-Amz-Date`` (``20261201T194650Z``), formatted once a second."""
    return _amz_date(int(utc(when).timestamp()))


@functools.lru_cache(maxsize=4)
def _amz_date(second: int) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))


@functools.lru_cache(maxsize=256)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = hmac.digest(f"AWS4{secret}".encode(), date.encode(), "sha256")
    for part in (region, service, "aws4_request"):
        key = hmac.digest(key, part.encode(), "sha256")
    return key


def sign(key: bytes, amz_date: str, scope: str, canonical_request: str) -> str:
    # Header values are the bytes as received, decoded as latin-1 (ASGI gives bytes): S3
    # signs those bytes, so latin-1 turns them back; any UTF-8 in them is left as sent.
    digest = hashlib.sha256(canonical_request.encode("latin-1")).hexdigest()
    string_to_sign = f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"
    return hmac.new(key, string_to_sign.encode(), "sha256").hexdigest()


def trim(value: str) -> str:
    # ASCII whitespace only: values are latin-1 views of raw bytes, where str.split() would
    # also cut at 0x85 and 0xA0, bytes inside UTF-8 characters (à is C3 A0).
    return " ".join(_ASCII_SPACES.split(value.strip(ASCII_WHITESPACE)))


def split_query(raw_query: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    if raw_query:
        for token in raw_query.split("&"):
            key, _, value = token.partition("=")
            pairs.append((key, value))
    return pairs


def utc(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def canonical_query(pairs: list[tuple[str, str]], *, plus_is_space: bool) -> str:
    encoded = sorted((encode(k, plus_is_space), encode(v, plus_is_space)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


@functools.lru_cache(maxsize=4096)
def encode(token: str, plus_is_space: bool) -> str:
    if _UNRESERVED.fullmatch(token):
        return token
    if plus_is_space:
        token = token.replace("+", "%20")
    return quote(unquote_to_bytes(token), safe="-_.~")


def canonical_path(path: str) -> str:
    if not path:
        return "/"
    if _UNRESERVED_PATH.fullmatch(path):
        return path
    return quote(unquote_to_bytes(path), safe="/~")


def host_from_url(parts: SplitResult) -> str:
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    if port is not None and port != DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{port}"
    return host
