"""Presigned URLs in the legacy S3 signature (V2) query form.

boto3 (``generate_presigned_url`` in us-east-1 without ``signature_version``) and the AWS
CLI (``aws s3 presign``) still produce these by default: ``?AWSAccessKeyId=..&Signature=..
&Expires=..``. Only the presigned query form is accepted; a V2 ``Authorization`` header is
not. Reference: https://docs.aws.amazon.com/AmazonS3/latest/userguide/RESTAuthentication.html
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from urllib.parse import unquote, unquote_plus

from .._errors import (
    AccessDenied,
    AuthorizationQueryParametersError,
    InvalidAccessKeyId,
    SignatureDoesNotMatch,
)
from .._signing import ASCII_WHITESPACE
from ._sigv4 import Verified

# Sub-resources that are part of the string to sign (the list botocore's HmacV1Auth uses).
_SUBRESOURCES = frozenset(
    [
        "accelerate",
        "acl",
        "cors",
        "defaultObjectAcl",
        "location",
        "logging",
        "partNumber",
        "policy",
        "requestPayment",
        "torrent",
        "versioning",
        "versionId",
        "versions",
        "website",
        "uploads",
        "uploadId",
        "response-content-type",
        "response-content-language",
        "response-expires",
        "response-cache-control",
        "response-content-disposition",
        "response-content-encoding",
        "delete",
        "lifecycle",
        "tagging",
        "restore",
        "storageClass",
        "notification",
        "replication",
        "analytics",
        "metrics",
        "inventory",
        "select",
        "select-type",
        "object-lock",
    ]
)


def verify_presigned_v2(
    *,
    method: str,
    resource_path: str,
    raw_query: str,
    headers: Sequence[tuple[str, str]],
    secrets: Mapping[str, str],
    now: datetime | None = None,
) -> Verified:
    """Check a V2 presigned URL.

    Args:
        method: The HTTP method.
        resource_path: ``/bucket/key`` as percent-encoded by the signer (for virtual-hosted
            requests the bucket from the Host header, then the raw path).
        raw_query: The raw query string.
        headers: Lowercase request headers.
        secrets: Access key id -> secret.
        now: The current time (tests inject it).

    Raises:
        AuthorizationQueryParametersError, AccessDenied, InvalidAccessKeyId,
        SignatureDoesNotMatch.
    """
    params = _params(raw_query)
    try:
        key_id, signature, expires = (
            params["AWSAccessKeyId"],
            params["Signature"],
            int(params["Expires"]),
        )
    except (KeyError, ValueError) as exc:
        raise AuthorizationQueryParametersError(
            "a V2 presigned URL needs AWSAccessKeyId, Signature and a numeric Expires"
        ) from exc
    if (now or datetime.now(UTC)).timestamp() > expires:
        raise AccessDenied("Request has expired")
    secret = secrets.get(key_id)
    if secret is None:
        raise InvalidAccessKeyId(f"the access key id {key_id!r} is not known to this gateway")
    expected = _sign(
        secret, _string_to_sign(method, headers, str(expires), resource_path, raw_query)
    )
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise SignatureDoesNotMatch("the V2 presigned signature does not match")
    return Verified(
        access_key_id=key_id,
        payload_mode="unsigned",
        payload_sha256=None,
        signature="",
        signing_key=b"",
        amz_date="",
        scope="",
        decoded_content_length=None,
        trailer_names=(),
        signed_headers=(),
    )


def _params(raw_query: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in raw_query.split("&"):
        name, _, value = part.partition("=")
        out.setdefault(unquote_plus(name), unquote_plus(value))
    return out


def _string_to_sign(
    method: str,
    headers: Sequence[tuple[str, str]],
    expires: str,
    resource_path: str,
    raw_query: str,
) -> str:
    index: dict[str, list[str]] = {}
    for name, value in headers:
        index.setdefault(name, []).append(value.strip(ASCII_WHITESPACE))
    standard = [",".join(index.get(h, [])) for h in ("content-md5", "content-type")]
    amz = [f"{n}:{','.join(v)}" for n, v in sorted(index.items()) if n.startswith("x-amz-")]
    return "\n".join(
        [method.upper(), *standard, expires, *amz, _resource(resource_path, raw_query)]
    )


def _resource(path: str, raw_query: str) -> str:
    pairs = [part.split("=", 1) for part in raw_query.split("&") if part]
    kept = sorted((p for p in pairs if p[0] in _SUBRESOURCES), key=lambda p: p[0])
    if not kept:
        return path
    return path + "?" + "&".join(p[0] if len(p) == 1 else f"{p[0]}={unquote(p[1])}" for p in kept)


def _sign(secret: str, string_to_sign: str) -> str:
    # Header values are raw bytes decoded as latin-1 (see _sigv4._sign).
    digest = hmac.new(secret.encode(), string_to_sign.encode("latin-1"), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()
