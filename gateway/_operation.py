"""One reading of a request: the S3 operation it is, parsed once at the edge.

Every later step works from the :class:`S3Operation` this module returns and never looks at
the raw request again: the access decision, the choice between pass-through and pushdown,
metering, the access log, and the upstream request, whose path, query and meaningful
headers are re-encoded from the parsed values. A difference between how two steps read a
request is how proxies get bypassed (an encoded ``/`` in a bucket, the first against the
last of two copy sources, a query flag that changes the operation's class), so a request
that could be read two ways is refused, never guessed:

- a bucket that is not a valid S3 bucket name once decoded (``InvalidBucketName``);
- a key with a ``.`` or ``..`` segment, which a store may resolve into another bucket
  (``InvalidRequest``, as SeaweedFS answers);
- a repeated query parameter, or a repeated header that carries meaning (``InvalidRequest``);
- subresources naming two operations, a method the addressed resource does not have, or
  pushdown parameters on an operation pushdown does not serve (``InvalidRequest``,
  ``MethodNotAllowed``);
- a copy source that is not ``bucket/key`` with at most a ``versionId``
  (``InvalidArgument``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, unquote_to_bytes

from ._errors import InvalidArgument, InvalidBucketName, InvalidRequest, MethodNotAllowed

Access = Literal["read", "write"]

# Subresources that name an operation, by level and method (the S3 API reference's names).
_BUCKET_OPS: dict[str, dict[str, str]] = {
    "accelerate": {"GET": "GetBucketAccelerateConfiguration", "PUT": "PutBucketAccelerateConfiguration"},
    "acl": {"GET": "GetBucketAcl", "PUT": "PutBucketAcl"},
    "analytics": {"GET": "GetBucketAnalyticsConfiguration", "PUT": "PutBucketAnalyticsConfiguration", "DELETE": "DeleteBucketAnalyticsConfiguration"},
    "cors": {"GET": "GetBucketCors", "PUT": "PutBucketCors", "DELETE": "DeleteBucketCors"},
    "delete": {"POST": "DeleteObjects"},
    "encryption": {"GET": "GetBucketEncryption", "PUT": "PutBucketEncryption", "DELETE": "DeleteBucketEncryption"},
    "intelligent-tiering": {"GET": "GetBucketIntelligentTieringConfiguration", "PUT": "PutBucketIntelligentTieringConfiguration", "DELETE": "DeleteBucketIntelligentTieringConfiguration"},
    "inventory": {"GET": "GetBucketInventoryConfiguration", "PUT": "PutBucketInventoryConfiguration", "DELETE": "DeleteBucketInventoryConfiguration"},
    "lifecycle": {"GET": "GetBucketLifecycleConfiguration", "PUT": "PutBucketLifecycleConfiguration", "DELETE": "DeleteBucketLifecycle"},
    "location": {"GET": "GetBucketLocation"},
    "logging": {"GET": "GetBucketLogging", "PUT": "PutBucketLogging"},
    "metrics": {"GET": "GetBucketMetricsConfiguration", "PUT": "PutBucketMetricsConfiguration", "DELETE": "DeleteBucketMetricsConfiguration"},
    "notification": {"GET": "GetBucketNotificationConfiguration", "PUT": "PutBucketNotificationConfiguration"},
    "object-lock": {"GET": "GetObjectLockConfiguration", "PUT": "PutObjectLockConfiguration"},
    "ownershipControls": {"GET": "GetBucketOwnershipControls", "PUT": "PutBucketOwnershipControls", "DELETE": "DeleteBucketOwnershipControls"},
    "policy": {"GET": "GetBucketPolicy", "PUT": "PutBucketPolicy", "DELETE": "DeleteBucketPolicy"},
    "policyStatus": {"GET": "GetBucketPolicyStatus"},
    "publicAccessBlock": {"GET": "GetPublicAccessBlock", "PUT": "PutPublicAccessBlock", "DELETE": "DeletePublicAccessBlock"},
    "replication": {"GET": "GetBucketReplication", "PUT": "PutBucketReplication", "DELETE": "DeleteBucketReplication"},
    "requestPayment": {"GET": "GetBucketRequestPayment", "PUT": "PutBucketRequestPayment"},
    "tagging": {"GET": "GetBucketTagging", "PUT": "PutBucketTagging", "DELETE": "DeleteBucketTagging"},
    "uploads": {"GET": "ListMultipartUploads"},
    "versioning": {"GET": "GetBucketVersioning", "PUT": "PutBucketVersioning"},
    "versions": {"GET": "ListObjectVersions"},
    "website": {"GET": "GetBucketWebsite", "PUT": "PutBucketWebsite", "DELETE": "DeleteBucketWebsite"},
    "hapi-batch": {"POST": "HapiBatch"},
}  # fmt: skip
_BUCKET_PLAIN = {
    "GET": "ListObjects",
    "PUT": "CreateBucket",
    "DELETE": "DeleteBucket",
    "HEAD": "HeadBucket",
    "POST": "PostObject",  # a browser form upload
    "OPTIONS": "OptionsObject",  # a CORS preflight
}
_OBJECT_OPS: dict[str, dict[str, str]] = {
    "acl": {"GET": "GetObjectAcl", "PUT": "PutObjectAcl"},
    "attributes": {"GET": "GetObjectAttributes"},
    "legal-hold": {"GET": "GetObjectLegalHold", "PUT": "PutObjectLegalHold"},
    "retention": {"GET": "GetObjectRetention", "PUT": "PutObjectRetention"},
    "tagging": {"GET": "GetObjectTagging", "PUT": "PutObjectTagging", "DELETE": "DeleteObjectTagging"},
    "torrent": {"GET": "GetObjectTorrent"},
    "restore": {"POST": "RestoreObject"},
    "select": {"POST": "SelectObjectContent"},
    "uploads": {"POST": "CreateMultipartUpload"},
    "uploadId": {"GET": "ListParts", "PUT": "UploadPart", "POST": "CompleteMultipartUpload", "DELETE": "AbortMultipartUpload"},
}  # fmt: skip
_OBJECT_PLAIN = {
    "GET": "GetObject",
    "PUT": "PutObject",
    "DELETE": "DeleteObject",
    "HEAD": "HeadObject",
    "OPTIONS": "OptionsObject",
}
# Each operation-naming subresource, at either level: more than one in a query is ambiguous.
SUBRESOURCES = frozenset(_BUCKET_OPS) | frozenset(_OBJECT_OPS)
# Operations that copy from x-amz-copy-source, by the operation the PUT would otherwise be.
_COPIES = {"PutObject": "CopyObject", "UploadPart": "UploadPartCopy"}
# Methods that only read. Every other forwarded request counts as a write, whatever its
# name (a POST that a store might read differently is never judged a read); pushdown's
# two operations read, and are never forwarded.
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PUSHDOWN = frozenset({"GetFeatures", "HapiBatch"})

# Headers that carry meaning: one copy each, or the request is refused. (Others that may
# legitimately repeat, such as Accept or Cache-Control, are forwarded joined by commas.)
_SINGLE_HEADERS = frozenset(
    {
        "host",
        "authorization",
        "date",
        "expect",
        "content-length",
        "content-type",
        "content-md5",
        "content-encoding",
        "content-language",
        "content-disposition",
        "transfer-encoding",
        "range",
        "if-match",
        "if-none-match",
        "if-modified-since",
        "if-unmodified-since",
        "expires",
    }
)
_SINGLE_PREFIXES = ("x-amz-", "x-hapi-")
COPY_SOURCE = "x-amz-copy-source"

# S3's rules for bucket names (the legacy rules add capitals and "_" in us-east-1 only).
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+")
_QUERY_SAFE = "-_.~"
# Characters S3 leaves unencoded in a key path (the RFC 3986 unreserved set, plus "/").
_KEY_SAFE = "/-_.~"
_DOT_SEGMENTS = {".": "%2E", "..": "%2E%2E"}
# The authentication parameters of presigned URLs (SigV4, then V2): never forwarded, they
# authenticate the client's request, not the one the gateway makes of it.
PRESIGN_PARAMS = frozenset(
    {
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Signature",
        "X-Amz-Security-Token",
        "X-Amz-Content-Sha256",
    }
)
V2_PRESIGN_PARAMS = frozenset({"AWSAccessKeyId", "Signature", "Expires"})


@dataclass(frozen=True, slots=True)
class CopySource:
    """The object a copy reads (``x-amz-copy-source``), decoded."""

    bucket: str
    key: str
    version_id: str | None = None

    @property
    def header(self) -> str:
        """The value to send upstream, encoded canonically from the parsed parts."""
        path = object_path(self.bucket, self.key)
        if self.version_id is None:
            return path
        return f"{path}?versionId={quote(self.version_id, safe=_QUERY_SAFE)}"


@dataclass(frozen=True, slots=True)
class S3Operation:
    """What a request asks for, read once.

    Attributes:
        name: The S3 operation (``GetObject``, ``DeleteObjects``, ``UploadPartCopy``, ...),
            or hapi's own ``GetFeatures`` and ``HapiBatch``.
        method: The HTTP method.
        bucket: The bucket (``""`` for the service: ListBuckets).
        key: The decoded object key (``""`` for bucket-level operations).
        query: The decoded query parameters, in order, without pushdown parameters.
        headers: Every header, lowercase name to value, one entry a name.
        hapi: Pushdown parameters by short name (``model``, ``split``, ...): ``(name as
            spelled, value)``, from ``x-hapi-*`` headers or ``hapi-*`` query parameters.
        copy_source: What a CopyObject or UploadPartCopy reads.
        virtual_host: Whether the bucket came from the Host header.
        client_path: The path as the client encoded it, ``/BUCKET`` in front for
            virtual-hosted requests (what a V2 signature covers).
        raw_path: The path exactly as received (what a V4 signature covers).
        raw_query: The query exactly as received.
    """

    name: str
    method: str
    bucket: str
    key: str
    query: tuple[tuple[str, str], ...]
    headers: Mapping[str, str]
    hapi: Mapping[str, tuple[str, str]]
    copy_source: CopySource | None
    virtual_host: bool
    client_path: str
    raw_path: str
    raw_query: str

    @property
    def access(self) -> Access:
        """Whether the operation only reads or also writes what it addresses."""
        reads = self.method in _READ_METHODS or self.name in PUSHDOWN
        return "read" if reads else "write"

    @property
    def is_pushdown(self) -> bool:
        return self.name in PUSHDOWN

    @property
    def resource(self) -> str:
        return f"/{self.bucket}/{self.key}" if self.bucket else "/"

    def query_names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.query)

    def upstream_path(self) -> str:
        """The path-style path to send upstream, encoded from the parsed bucket and key."""
        return object_path(self.bucket, self.key) if self.bucket else "/"

    def upstream_query(self) -> str:
        """The query to send upstream, re-encoded from the parsed pairs, without any
        presigned URL's authentication parameters."""
        dropped = PRESIGN_PARAMS | (V2_PRESIGN_PARAMS if self.presigned_v2 else frozenset())
        pairs = sorted(
            (_encode_query(name), _encode_query(value))
            for name, value in self.query
            if name not in dropped
        )
        return "&".join(f"{name}={value}" for name, value in pairs)

    @property
    def presigned_v2(self) -> bool:
        """Whether the query carries a V2 presigned URL's parameters (the one reading the
        verifier and the upstream query both go by)."""
        names = self.query_names()
        return "Signature" in names and "AWSAccessKeyId" in names


def parse_operation(
    method: str,
    raw_path: str,
    raw_query: str,
    raw_headers: Iterable[tuple[str, str]],
    domains: tuple[str, ...],
) -> S3Operation:
    """Read a request into the operation it is.

    Args:
        method: The HTTP method.
        raw_path: The path as received, still percent-encoded.
        raw_query: The query as received, without ``?``.
        raw_headers: ``(lowercase name, value)`` pairs as received.
        domains: Domains under which ``BUCKET.DOMAIN`` is virtual-hosted addressing.

    Raises:
        S3Error: The request can be read more than one way, or is not an S3 operation.
    """
    headers = _single_headers(raw_headers)
    bucket, raw_key, client_path, virtual = _split_target(
        raw_path, headers.get("host", ""), domains
    )
    key = _key(raw_key)
    pairs = _query_pairs(raw_query)
    query = tuple((n, v) for n, v in pairs if not n.lower().startswith("hapi-"))
    hapi = _hapi_parameters(pairs, headers)
    name = _name(method, bucket, key, query, headers, hapi)
    copy = _copy_source(headers[COPY_SOURCE]) if COPY_SOURCE in headers else None
    if copy is not None and name not in _COPIES.values():
        raise InvalidRequest(f"{COPY_SOURCE} is meaningful only for a copy (a PUT of an object).")
    return S3Operation(
        name=name,
        method=method,
        bucket=bucket,
        key=key,
        query=query,
        headers=headers,
        hapi=hapi,
        copy_source=copy,
        virtual_host=virtual,
        client_path=client_path,
        raw_path=raw_path,
        raw_query=raw_query,
    )


def check_bucket_name(bucket: str) -> None:
    """Refuse what is not a valid S3 bucket name.

    Raises:
        InvalidBucketName: It has a ``/``, ``..``, a character S3 forbids, a bad length, or
            the form of an IP address.
    """
    if not _BUCKET_NAME.fullmatch(bucket) or ".." in bucket or _IP_ADDRESS.fullmatch(bucket):
        raise InvalidBucketName(
            f"The specified bucket is not valid: {bucket!r} (3-63 characters of a-z, 0-9, "
            "'.' and '-', beginning and ending with a letter or digit).",
            resource=f"/{quote(bucket, safe='')}",
        )


def _single_headers(raw: Iterable[tuple[str, str]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in raw:
        if name not in headers:
            headers[name] = value
        elif name in _SINGLE_HEADERS or name.startswith(_SINGLE_PREFIXES):
            raise InvalidRequest(
                f"The header {name} appears more than once; it carries meaning, so it may "
                "appear only once."
            )
        else:
            headers[name] = f"{headers[name]},{value}"
    return headers


def _split_target(raw_path: str, host: str, domains: tuple[str, ...]) -> tuple[str, str, str, bool]:
    """``(bucket, raw key, client path, virtual-hosted)`` of a request, the bucket checked."""
    hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    hostname = hostname.lower().rstrip(".")
    if not raw_path.startswith("/"):
        raise InvalidRequest(f"The request path must begin with '/': {raw_path!r}.")
    for domain in domains:
        if hostname.endswith("." + domain):
            bucket = hostname[: -len(domain) - 1]
            check_bucket_name(bucket)
            return bucket, raw_path[1:], f"/{bucket}{raw_path}", True
    raw_bucket, slash, raw_key = raw_path[1:].partition("/")
    if not raw_bucket:
        if raw_key or slash:
            raise InvalidBucketName("The request path names an empty bucket.", resource=raw_path)
        return "", "", raw_path, False
    bucket = _decode(raw_bucket, "bucket")
    check_bucket_name(bucket)
    return bucket, raw_key, raw_path, False


def check_key(key: str) -> None:
    """Refuse a key that a store may resolve to another path.

    Raises:
        InvalidRequest: The key has a ``.`` or ``..`` segment.
    """
    if any(part in (".", "..") for part in key.split("/")):
        raise InvalidRequest(
            f"The key {key!r} has a '.' or '..' segment, which a store may resolve to another "
            "path; this gateway refuses such keys, as SeaweedFS does.",
        )


def _key(raw_key: str) -> str:
    key = _decode(raw_key, "key")
    check_key(key)
    return key


def _decode(raw: str, what: str, *, plus_is_space: bool = False) -> str:
    if raw.isascii() and "%" not in raw and (not plus_is_space or "+" not in raw):
        return raw  # nothing to decode (most names and values)
    if plus_is_space:
        raw = raw.replace("+", " ")
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"The {what} {raw!r} is not UTF-8 once decoded.") from exc


def _query_pairs(raw_query: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for token in raw_query.split("&") if raw_query else ():
        if not token:
            continue
        raw_name, _, raw_value = token.partition("=")
        name = _decode(raw_name, "query parameter", plus_is_space=True)
        value = _decode(raw_value, "query value", plus_is_space=True)
        folded = name.lower() if name.lower().startswith("hapi-") else name
        if folded in seen:
            raise InvalidRequest(f"The query parameter {name!r} appears more than once.")
        seen.add(folded)
        pairs.append((name, value))
    return pairs


def _hapi_parameters(
    pairs: list[tuple[str, str]], headers: Mapping[str, str]
) -> dict[str, tuple[str, str]]:
    """Pushdown parameters by short name; one given both as a header and in the query is
    refused (which one would win is a guess)."""
    given: dict[str, tuple[str, str]] = {}
    for name, value in pairs:
        if name.lower().startswith("hapi-"):
            given[name.lower().removeprefix("hapi-")] = (name, value)
    for name, value in headers.items():
        if name.startswith("x-hapi-"):
            short = name.removeprefix("x-hapi-")
            if short in given:
                raise InvalidRequest(
                    f"The pushdown parameter {short!r} is given both as {name} and as "
                    f"{given[short][0]}; give it once."
                )
            given[short] = (name, value)
    return given


def _name(
    method: str,
    bucket: str,
    key: str,
    query: tuple[tuple[str, str], ...],
    headers: Mapping[str, str],
    hapi: Mapping[str, tuple[str, str]],
) -> str:
    names = {name for name, _ in query}
    if "batch" in hapi:  # ?hapi-batch names an operation, like a subresource
        names.add("hapi-batch")
    named = sorted(names & SUBRESOURCES)
    if len(named) > 1:
        raise InvalidRequest(
            f"The query names more than one operation ({', '.join(named)}); send one."
        )
    if not bucket:
        if method != "GET" or named:
            raise MethodNotAllowed(f"{method} is not an operation of the service endpoint.")
        name = "ListBuckets"
    elif not key:
        name = _bucket_operation(method, named, names)
    else:
        name = _object_operation(method, named, headers)
    return _pushdown(name, hapi)


def _bucket_operation(method: str, named: list[str], names: set[str]) -> str:
    table = _BUCKET_OPS.get(named[0], {}) if named else _BUCKET_PLAIN
    name = table.get(method)
    if name is None:
        raise MethodNotAllowed(_not_allowed(method, "a bucket", named))
    if name == "ListObjects" and "list-type" in names:
        return "ListObjectsV2"
    return name


def _object_operation(method: str, named: list[str], headers: Mapping[str, str]) -> str:
    table = _OBJECT_OPS.get(named[0], {}) if named else _OBJECT_PLAIN
    name = table.get(method)
    if name is None:
        raise MethodNotAllowed(_not_allowed(method, "an object", named))
    if COPY_SOURCE in headers and name in _COPIES:
        return _COPIES[name]
    return name


def _pushdown(name: str, hapi: Mapping[str, tuple[str, str]]) -> str:
    """The operation's name once pushdown parameters are counted: a GET of an object that
    names any is GetFeatures (pushdown checks the set); on any other, they are refused."""
    if not hapi:
        return name
    if name == "GetObject":
        return "GetFeatures"
    if name not in PUSHDOWN:
        spelled = ", ".join(sorted(spelled for spelled, _ in hapi.values()))
        raise InvalidRequest(
            f"Pushdown parameters ({spelled}) on {name}: pushdown serves only GetObject "
            "(a GET of an object) and POST /BUCKET?hapi-batch."
        )
    return name


def _not_allowed(method: str, what: str, named: list[str]) -> str:
    on = f" with ?{named[0]}" if named else ""
    return f"{method} is not an operation of {what}{on}."


def _copy_source(value: str) -> CopySource:
    """Parse ``[/]bucket/key[?versionId=V]`` (URL-encoded)."""
    raw_path, question, raw_query = value.partition("?")
    version: str | None = None
    if question:
        name, equals, raw_version = raw_query.partition("=")
        if name != "versionId" or not equals or "&" in raw_version:
            raise InvalidArgument(
                f"{COPY_SOURCE} may carry only ?versionId=ID after the key, not {value!r}."
            )
        version = _decode(raw_version, "copy source version", plus_is_space=True)
    path = _decode(raw_path, "copy source")
    bucket, _, key = path.removeprefix("/").partition("/")
    check_bucket_name(bucket)
    if not key or any(part in (".", "..") for part in key.split("/")):
        raise InvalidArgument(f"{COPY_SOURCE} must name BUCKET/KEY, not {value!r}.")
    return CopySource(bucket, key, version)


def _encode_query(token: str) -> str:
    return quote(token.encode("utf-8"), safe=_QUERY_SAFE)


def object_path(bucket: str, key: str) -> str:
    """The canonical path-style path of an object (or of a bucket when ``key`` is empty).

    ``.`` and ``..`` segments of a key are percent-encoded: HTTP clients (httpx included)
    remove dot segments from a URL's path, so a key from a batch body that named one would
    otherwise reach another bucket. Signing decodes them again, as S3 does.
    """
    encoded = quote(key, safe=_KEY_SAFE)
    if "." in encoded:
        encoded = "/".join(_DOT_SEGMENTS.get(part, part) for part in encoded.split("/"))
    path = "/" + quote(bucket, safe="") + "/" + encoded
    return path if key else path.rstrip("/")
