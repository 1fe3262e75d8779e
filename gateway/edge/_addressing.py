"""Where a request points: bucket and key from path-style or virtual-hosted-style URLs."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

# Characters S3 leaves unencoded in a key path (the RFC 3986 unreserved set, plus "/").
_KEY_SAFE = "/-_.~"
_DOT_SEGMENTS = {".": "%2E", "..": "%2E%2E"}


@dataclass(frozen=True, slots=True)
class Target:
    """The bucket and key a request addresses.

    Attributes:
        bucket: Bucket name; empty for the service endpoint (ListBuckets).
        key: The decoded object key; empty for bucket-level requests.
        upstream_path: The path-style path to send upstream, encoded canonically, so the
            path we sign is byte for byte the path we send.
        client_path: The path-style path as the client encoded it: the raw path, with
            ``/BUCKET`` in front for virtual-hosted requests. Signature V2 signs this,
            not ``Host``, so the bucket it names is the one the signature covers.
    """

    bucket: str
    key: str
    upstream_path: str
    client_path: str


def resolve(raw_path: str, host: str, domains: tuple[str, ...]) -> Target:
    """Resolve the target of a request.

    Args:
        raw_path: The path as received, still percent-encoded.
        host: The Host header (port included or not).
        domains: Domains under which ``BUCKET.DOMAIN`` is virtual-hosted addressing.
    """
    hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    for domain in domains:
        if hostname.endswith("." + domain):
            bucket = hostname[: -len(domain) - 1]
            return _target(bucket, unquote(raw_path[1:]), f"/{bucket}{raw_path}")
    path = raw_path[1:] if raw_path.startswith("/") else raw_path
    bucket, _, raw_key = path.partition("/")
    return _target(unquote(bucket), unquote(raw_key), raw_path)


def object_path(bucket: str, key: str) -> str:
    """The canonical path-style path of an object (or of a bucket when ``key`` is empty).

    ``.`` and ``..`` segments of a key are percent-encoded: HTTP clients (httpx included)
    remove dot segments from a URL's path, and a key must reach the store as written.
    Signing decodes them again, as S3 does.
    """
    encoded = quote(key, safe=_KEY_SAFE)
    if "." in encoded:
        encoded = "/".join(_DOT_SEGMENTS.get(part, part) for part in encoded.split("/"))
    path = "/" + quote(bucket, safe="") + "/" + encoded
    return path if key else path.rstrip("/")


def _target(bucket: str, key: str, client_path: str) -> Target:
    if not bucket:
        return Target("", "", "/", client_path or "/")
    return Target(bucket, key, object_path(bucket, key), client_path)
