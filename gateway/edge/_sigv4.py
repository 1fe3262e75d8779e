"""AWS Signature Version 4 for S3: verify what clients send, sign what the gateway forwards.

Both directions build the same canonical request; see
https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html and
https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Literal, NamedTuple
from urllib.parse import unquote

from .._errors import (
    AccessDenied,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRequest,
    RequestTimeTooSkewed,
    SignatureDoesNotMatch,
)
from .._signing import (
    ALGORITHM,
    UNSIGNED_PAYLOAD,
    canonical_path,
    canonical_query,
    sign,
    signing_key,
    split_query,
    trim,
    utc,
)

__all__ = ["PayloadMode", "Verified", "verify_request"]

PayloadMode = Literal[
    "sha256",
    "unsigned",
    "streaming-signed",
    "streaming-signed-trailer",
    "streaming-unsigned-trailer",
]

EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

_PAYLOAD_MODES: dict[str, PayloadMode] = {
    UNSIGNED_PAYLOAD: "unsigned",
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD": "streaming-signed",
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER": "streaming-signed-trailer",
    "STREAMING-UNSIGNED-PAYLOAD-TRAILER": "streaming-unsigned-trailer",
}
_PRESIGN_PARAMS = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
)
_MAX_EXPIRES = 7 * 24 * 3600
_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")
_SCOPE_DATE = re.compile(r"\d{8}")
_DIGITS = re.compile(r"[0-9]{1,19}")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. "
    "Check your key and signing method."
)


@dataclass(frozen=True, slots=True)
class Verified:
    """What a verified request proved, and what its body decoder needs.

    ``signature`` is the seed for chunk signatures and ``signing_key`` the key they use;
    ``signed_headers`` lists the headers the client's signature covers, so a proxy can
    forward only those.
    """

    access_key_id: str
    payload_mode: PayloadMode
    payload_sha256: str | None
    signature: str
    signing_key: bytes
    amz_date: str
    scope: str
    decoded_content_length: int | None
    trailer_names: tuple[str, ...]
    signed_headers: tuple[str, ...]


class _Auth(NamedTuple):
    """The signature fields of one request, from its header or its query."""

    access_key_id: str
    scope_date: str
    region: str
    signed_headers: str
    signature: str
    amz_date: str
    when: datetime
    payload: str
    presigned: bool


def verify_request(
    *,
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Sequence[tuple[str, str]],
    secrets: Mapping[str, str],
    now: datetime | None = None,
    max_skew: timedelta = timedelta(minutes=15),
    region: str | None = None,
) -> Verified:
    """Check a request's SigV4 signature, in its Authorization header or presigned query.

    Args:
        method: The HTTP method, as sent.
        raw_path: The path exactly as received, still percent-encoded (ASGI ``raw_path``).
        raw_query: The raw query string, without ``?``.
        headers: ``(name, value)`` pairs with lowercase names, values decoded as latin-1;
            repeated names are joined with ``,`` as SigV4 prescribes.
        secrets: Secret access keys by access key id.
        now: The gateway's clock (UTC); defaults to the current time.
        max_skew: How far the request's date may be from ``now``.
        region: The region requests must be signed for; None accepts any.

    Returns:
        The verified identity, payload mode and the material to check a chunked body.

    Raises:
        AccessDenied: No signature at all, an expired presigned URL, or an ``x-amz-*``
            header the signature does not cover.
        InvalidAccessKeyId: The access key id is not in ``secrets``.
        AuthorizationHeaderMalformed: The Authorization header cannot be parsed, or it is
            signed for another region.
        AuthorizationQueryParametersError: The presigned query parameters are malformed, or
            signed for another region.
        RequestTimeTooSkewed: The request's date is more than ``max_skew`` from ``now``.
        InvalidRequest: A required header is missing or the algorithm is not SigV4.
        InvalidArgument: ``x-amz-content-sha256`` or a length header has a bad value.
        SignatureDoesNotMatch: The signature is wrong.
    """
    index = _index_headers(headers)
    pairs = split_query(raw_query)
    presign = {k: v for k, v in pairs if k.startswith("X-Amz-")}
    authorization = index.get("authorization")
    if authorization is not None:
        if "X-Amz-Algorithm" in presign or "X-Amz-Signature" in presign:
            raise InvalidArgument("Only one auth mechanism allowed: header or query string.")
        auth = _header_auth(authorization, index)
    elif any(name in presign for name in _PRESIGN_PARAMS):
        auth = _query_auth(presign, index)
    else:
        raise AccessDenied("Anonymous access is not allowed; sign requests with SigV4.")
    if region is not None and auth.region != region:
        _wrong_region(auth, region)
    secret = secrets.get(auth.access_key_id)
    if secret is None:
        raise InvalidAccessKeyId(
            "The AWS Access Key Id you provided does not exist in our records."
        )
    _check_time(auth, presign, now or datetime.now(UTC), max_skew)
    mode, declared = _payload_mode(auth.payload)
    signed = tuple(auth.signed_headers.split(";"))
    _check_signed_headers(signed, index)
    key = signing_key(secret, auth.scope_date, auth.region, "s3")
    scope = f"{auth.scope_date}/{auth.region}/s3/aws4_request"
    tail = f"{_canonical_headers(signed, index)}\n{auth.signed_headers}\n{auth.payload}"
    for path, query in _canonical_candidates(raw_path, raw_query, pairs, auth.presigned):
        canonical = f"{method}\n{path}\n{query}\n{tail}"
        if hmac.compare_digest(sign(key, auth.amz_date, scope, canonical), auth.signature):
            break
    else:
        raise SignatureDoesNotMatch(_MISMATCH)
    return Verified(
        access_key_id=auth.access_key_id,
        payload_mode=mode,
        payload_sha256=declared,
        signature=auth.signature,
        signing_key=key,
        amz_date=auth.amz_date,
        scope=scope,
        decoded_content_length=_decoded_length(index),
        trailer_names=_trailer_names(index),
        signed_headers=signed,
    )


def _index_headers(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    index: dict[str, str] = {}
    for name, value in headers:
        previous = index.get(name)
        index[name] = value if previous is None else f"{trim(previous)},{trim(value)}"
    return index


def _header_auth(authorization: str, index: Mapping[str, str]) -> _Auth:
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise InvalidRequest(
            "The authorization mechanism you have provided is not supported. "
            f"Please use {ALGORITHM}."
        )
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise AuthorizationHeaderMalformed(f"Malformed Authorization component {part!r}.")
        fields[name] = value.strip()
    missing = [f for f in ("Credential", "SignedHeaders", "Signature") if not fields.get(f)]
    if missing:
        raise AuthorizationHeaderMalformed(f"The Authorization header lacks {', '.join(missing)}.")
    amz_date, when = _header_date(index)
    access_key_id, scope_date, region = _credential(
        fields["Credential"], amz_date, AuthorizationHeaderMalformed
    )
    payload = index.get("x-amz-content-sha256")
    if payload is None:
        payload = _implied_payload_hash(index)
    signature = fields["Signature"]
    _check_signature_format(signature, fields["SignedHeaders"], AuthorizationHeaderMalformed)
    return _Auth(
        access_key_id=access_key_id,
        scope_date=scope_date,
        region=region,
        signed_headers=fields["SignedHeaders"],
        signature=signature,
        amz_date=amz_date,
        when=when,
        payload=payload,
        presigned=False,
    )


def _query_auth(presign: Mapping[str, str], index: Mapping[str, str]) -> _Auth:
    if any(not presign.get(name) for name in _PRESIGN_PARAMS):
        raise AuthorizationQueryParametersError(
            "Query-string authentication version 4 requires the "
            + ", ".join(_PRESIGN_PARAMS)
            + " parameters."
        )
    values = {name: unquote(presign[name]) for name in _PRESIGN_PARAMS}
    if values["X-Amz-Algorithm"] != ALGORITHM:
        raise AuthorizationQueryParametersError(f"X-Amz-Algorithm only supports {ALGORITHM}.")
    amz_date = values["X-Amz-Date"]
    when = _parse_amz_date(amz_date)
    if when is None:
        raise AuthorizationQueryParametersError(f"X-Amz-Date {amz_date!r} is not valid.")
    access_key_id, scope_date, region = _credential(
        values["X-Amz-Credential"], amz_date, AuthorizationQueryParametersError
    )
    _check_signature_format(
        values["X-Amz-Signature"], values["X-Amz-SignedHeaders"], AuthorizationQueryParametersError
    )
    payload = index.get("x-amz-content-sha256") or unquote(
        presign.get("X-Amz-Content-Sha256", UNSIGNED_PAYLOAD)
    )
    return _Auth(
        access_key_id=access_key_id,
        scope_date=scope_date,
        region=region,
        signed_headers=values["X-Amz-SignedHeaders"],
        signature=values["X-Amz-Signature"],
        amz_date=amz_date,
        when=when,
        payload=payload,
        presigned=True,
    )


def _credential(
    credential: str,
    amz_date: str,
    error: type[AuthorizationHeaderMalformed | AuthorizationQueryParametersError],
) -> tuple[str, str, str]:
    parts = credential.split("/")
    if len(parts) != 5 or not parts[0] or not parts[2]:
        raise error(f"Credential {credential!r} is not AKID/date/region/s3/aws4_request.")
    access_key_id, scope_date, region, service, terminator = parts
    if not _SCOPE_DATE.fullmatch(scope_date) or terminator != "aws4_request":
        raise error(f"Credential {credential!r} is not AKID/date/region/s3/aws4_request.")
    if service != "s3":
        raise error(f"The credential scope names service {service!r}; it must be 's3'.")
    if scope_date != amz_date[:8]:
        raise error(f"Invalid credential date {scope_date!r}: it is not the date of {amz_date!r}.")
    return access_key_id, scope_date, region


def _wrong_region(auth: _Auth, expected: str) -> None:
    # AWS's own wording, which botocore's region redirector recognises.
    wrong = f"the region '{auth.region}' is wrong; expecting '{expected}'"
    if auth.presigned:
        raise AuthorizationQueryParametersError(
            f"Error parsing the X-Amz-Credential parameter; {wrong}"
        )
    raise AuthorizationHeaderMalformed(f"The authorization header is malformed; {wrong}")


def _check_signature_format(
    signature: str,
    signed_headers: str,
    error: type[AuthorizationHeaderMalformed | AuthorizationQueryParametersError],
) -> None:
    if not _HEX64.fullmatch(signature):
        raise error("The signature must be 64 hexadecimal characters.")
    if "host" not in signed_headers.split(";"):
        raise error("The host header must be among the signed headers.")


def _header_date(index: Mapping[str, str]) -> tuple[str, datetime]:
    amz_date = index.get("x-amz-date")
    if amz_date is not None:
        when = _parse_amz_date(amz_date.strip())
        if when is None:
            raise AccessDenied(f"x-amz-date {amz_date!r} is not in the form YYYYMMDDTHHMMSSZ.")
        return amz_date.strip(), when
    date = index.get("date")
    if date is None:
        raise AccessDenied("AWS authentication requires a valid Date or x-amz-date header.")
    try:
        when = utc(parsedate_to_datetime(date))
    except (TypeError, ValueError):
        raise AccessDenied(f"The Date header {date!r} is not an HTTP date.") from None
    return f"{when:%Y%m%dT%H%M%SZ}", when


def _parse_amz_date(value: str) -> datetime | None:
    match = _AMZ_DATE.fullmatch(value)
    if match is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _check_time(
    auth: _Auth, presign: Mapping[str, str], now: datetime, max_skew: timedelta
) -> None:
    now = utc(now)
    if auth.presigned:
        expires = unquote(presign["X-Amz-Expires"])
        if not _DIGITS.fullmatch(expires) or int(expires) > _MAX_EXPIRES:
            raise AuthorizationQueryParametersError(
                f"X-Amz-Expires must be between 0 and {_MAX_EXPIRES} seconds."
            )
        # A URL valid for 0 seconds has expired when it arrives (S3: 403, not 400).
        if int(expires) == 0 or now > auth.when + timedelta(seconds=int(expires)):
            raise AccessDenied("Request has expired")
        if auth.when - now > max_skew:
            raise RequestTimeTooSkewed("The presigned URL's X-Amz-Date is in the future.")
    elif abs(now - auth.when) > max_skew:
        raise RequestTimeTooSkewed(
            "The difference between the request time and the server's time is too large."
        )


def _implied_payload_hash(index: Mapping[str, str]) -> str:
    # S3 requires x-amz-content-sha256, but generic SigV4 signers (curl --aws-sigv4 before
    # 8.x) omit it and sign the body's hash; for a request without a body that hash is
    # known, so such a GET verifies. A body still needs the header.
    if index.get("content-length", "0") == "0" and "transfer-encoding" not in index:
        return EMPTY_SHA256
    raise InvalidRequest(
        "Missing required header for this request: x-amz-content-sha256 (with curl, add "
        "-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD')."
    )


def _payload_mode(payload: str) -> tuple[PayloadMode, str | None]:
    mode = _PAYLOAD_MODES.get(payload)
    if mode is not None:
        return mode, None
    if _HEX64.fullmatch(payload):
        return "sha256", payload.lower()
    raise InvalidArgument(
        "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, a supported STREAMING-* value, "
        "or the hex SHA-256 of the body."
    )


def _check_signed_headers(signed: tuple[str, ...], index: Mapping[str, str]) -> None:
    # S3 refuses x-amz-* headers the signature does not cover ("There were headers present in
    # the request which were not signed"); x-amz-content-sha256 is bound through the payload line.
    # https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html
    unsigned = [
        name
        for name in index
        if name.startswith("x-amz-") and name not in signed and name != "x-amz-content-sha256"
    ]
    if unsigned:
        raise AccessDenied(
            "There were headers present in the request which were not signed: "
            + ", ".join(sorted(unsigned))
        )


def _canonical_headers(signed: tuple[str, ...], index: Mapping[str, str]) -> str:
    lines = []
    for name in signed:
        value = index.get(name)
        if value is None:
            raise SignatureDoesNotMatch(f"The signed header {name!r} is not in the request.")
        lines.append(f"{name}:{trim(value)}\n")
    return "".join(lines)


def _canonical_candidates(
    raw_path: str, raw_query: str, pairs: list[tuple[str, str]], presigned: bool
) -> Iterator[tuple[str, str]]:
    """The (path, query) forms a client may have signed, most likely first.

    S3 signs the path as sent (no normalisation, no double encoding) and the query in
    canonical encoding; botocore signs URL query tokens as sent; curl 7.x signs the query
    as written, unsorted; SDKs that re-encode a
    decoded path (Go, MinIO) differ from the raw path only for non-canonical encodings.
    Alternatives are computed only if the first form does not match.
    """
    if presigned:
        pairs = [(k, v) for k, v in pairs if k != "X-Amz-Signature"]
    path = raw_path or "/"
    query = canonical_query(pairs, plus_is_space=True)
    yield path, query
    tried = {(path, query)}
    alternatives = [(path, "&".join(f"{k}={v}" for k, v in sorted(pairs)))]
    if "+" in raw_query:
        alternatives.append((path, canonical_query(pairs, plus_is_space=False)))
    alternatives.append((canonical_path(path), query))
    if not presigned:  # curl --aws-sigv4 before 8.x signs the query as written, unsorted
        alternatives.append((path, raw_query))
    for candidate in alternatives:
        if candidate not in tried:
            tried.add(candidate)
            yield candidate


def _decoded_length(index: Mapping[str, str]) -> int | None:
    value = index.get("x-amz-decoded-content-length")
    if value is None:
        return None
    if not _DIGITS.fullmatch(value.strip()):
        raise InvalidArgument(f"x-amz-decoded-content-length {value!r} is not a byte count.")
    return int(value)


def _trailer_names(index: Mapping[str, str]) -> tuple[str, ...]:
    value = index.get("x-amz-trailer", "")
    return tuple(name.strip().lower() for name in value.split(",") if name.strip())
