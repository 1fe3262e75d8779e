"""The policy of a browser form upload (POST Object): its signature, expiry and conditions.

A form carries its authentication in fields: a base64 JSON ``policy`` signed with SigV4
(``x-amz-algorithm``, ``x-amz-credential``, ``x-amz-date``, ``x-amz-signature``) or with the
legacy V2 scheme (``AWSAccessKeyId``, ``signature``). The gateway checks the signature with
the client's secret, then the policy's expiry and every condition against the form, itself:
the upload goes to the store as an ordinary PUT signed with the backend credentials.

References: https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-HTTPPOSTConstructPolicy.html
and https://docs.aws.amazon.com/AmazonS3/latest/userguide/HTTPPOSTForms.html
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .._errors import (
    AccessDenied,
    AuthorizationQueryParametersError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidPolicyDocument,
    MissingFields,
    SignatureDoesNotMatch,
)
from .._signing import ALGORITHM, signing_key

__all__ = ["AUTH_FIELDS", "PostPolicy", "verify_form"]

# Fields that authenticate a form; a form with none of them is anonymous.
AUTH_FIELDS = frozenset(
    {"policy", "signature", "awsaccesskeyid", "x-amz-signature", "x-amz-credential"}
)
_DENIED = "Invalid according to Policy: "


@dataclass(frozen=True, slots=True)
class PostPolicy:
    """A verified policy: who signed it and what it allows.

    Attributes:
        access_key_id: The client credential that signed it.
        conditions: ``(operator, field, value)`` with ``eq`` / ``starts-with`` and a
            lowercase field name (``bucket``, ``key``, ``content-type``, ...).
        min_length, max_length: The file's allowed size (``content-length-range``).
    """

    access_key_id: str
    conditions: tuple[tuple[str, str, str], ...]
    min_length: int
    max_length: int | None

    def check(self, fields: Mapping[str, str], bucket: str) -> None:
        """Check every condition against the form (and the bucket it was posted to).

        Raises:
            AccessDenied: A condition fails, or a metadata field is not covered.
        """
        values = {**fields, "bucket": bucket}
        for operator, name, expected in self.conditions:
            if not _holds(operator, name, values.get(name, ""), expected):
                raise AccessDenied(
                    f"{_DENIED}Policy Condition failed: [{operator!r}, '${name}', {expected!r}]"
                )
        # S3 wants every field covered; the store behind checks user metadata, and so do we
        # (the rest become headers of the PUT, as the store would have applied them).
        covered = {name for _, name, _ in self.conditions}
        extra = sorted(n for n in fields if n.startswith("x-amz-meta-") and n not in covered)
        if extra:
            raise AccessDenied(f"{_DENIED}Extra input fields: {', '.join(extra)}")


def verify_form(fields: Mapping[str, str], secrets: Mapping[str, str], now: datetime) -> PostPolicy:
    """Verify a form's policy signature (SigV4 or V2) and expiry, and read its conditions.

    Args:
        fields: The form's fields, lowercase names.
        secrets: Client secret keys by access key id.
        now: The gateway's clock.

    Raises:
        AuthorizationQueryParametersError: The form has neither a V2 ``signature`` field nor
            a well-formed ``x-amz-credential``.
        MissingFields: A V2 form's access key id, policy or signature is empty.
        SignatureDoesNotMatch: A signature is wrong (or a V4 one is missing).
        InvalidAccessKeyId: The access key id is not a client credential.
        InvalidArgument: The algorithm field is not AWS4-HMAC-SHA256.
        InvalidPolicyDocument: The signed policy is not a readable policy, or it has no
            conditions.
        AccessDenied: The policy has expired.
    """
    policy = fields.get("policy", "")
    # As the store tells the schemes apart: V4 by its fields, V2 by a signature field; a
    # form with neither is refused as a V4 form without its credential.
    if "x-amz-credential" in fields or "x-amz-algorithm" in fields:
        key_id = _verify_v4(policy, fields, secrets)
    elif "signature" in fields:
        key_id = _verify_v2(policy, fields, secrets)
    else:
        raise AuthorizationQueryParametersError(
            "The form has neither a signature (V2) nor an x-amz-credential (V4)."
        )
    document = _document(policy)
    expiration = _expiration(document)
    if now >= expiration:
        raise AccessDenied(f"{_DENIED}Policy expired")
    conditions, length_range = _conditions(document)
    return PostPolicy(key_id, conditions, *length_range)


def _verify_v4(policy: str, fields: Mapping[str, str], secrets: Mapping[str, str]) -> str:
    credential = fields.get("x-amz-credential", "")
    parts = credential.split("/")
    if len(parts) != 5 or parts[3] != "s3" or parts[4] != "aws4_request":
        raise AuthorizationQueryParametersError(
            f"x-amz-credential {credential!r} is not AKID/date/region/s3/aws4_request"
        )
    if fields.get("x-amz-algorithm", ALGORITHM) != ALGORITHM:
        raise InvalidArgument(f"x-amz-algorithm must be {ALGORITHM}")
    key_id, date, region = parts[0], parts[1], parts[2]
    secret = _secret(secrets, key_id)
    expected = hmac.new(
        signing_key(secret, date, region, "s3"), policy.encode(), hashlib.sha256
    ).hexdigest()
    _compare(expected, fields.get("x-amz-signature", ""), policy)
    return key_id


def _verify_v2(policy: str, fields: Mapping[str, str], secrets: Mapping[str, str]) -> str:
    key_id = fields.get("awsaccesskeyid", "")
    if not (key_id and policy and fields.get("signature")):
        raise MissingFields("A V2 form needs the fields AWSAccessKeyId, policy and signature.")
    secret = _secret(secrets, key_id)
    digest = hmac.new(secret.encode(), policy.encode(), hashlib.sha1).digest()
    _compare(base64.b64encode(digest).decode(), fields.get("signature", ""), policy)
    return key_id


def _secret(secrets: Mapping[str, str], key_id: str) -> str:
    secret = secrets.get(key_id)
    if secret is None:
        raise InvalidAccessKeyId(
            "The AWS Access Key Id you provided does not exist in our records."
        )
    return secret


def _compare(expected: str, given: str, policy: str) -> None:
    if not policy or not hmac.compare_digest(expected.encode(), given.encode()):
        raise SignatureDoesNotMatch(
            "The request signature we calculated does not match the signature you provided. "
            "Check your key and signing method."
        )


def _document(policy: str) -> dict[str, Any]:
    try:
        document = json.loads(base64.b64decode(policy, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise InvalidPolicyDocument(
            f"Invalid Policy: the policy is not base64 JSON ({exc})."
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("conditions"), list):
        raise InvalidPolicyDocument("Invalid Policy: it needs an expiration and a conditions list.")
    if not document["conditions"]:  # it would let the form write any key of any bucket
        raise InvalidPolicyDocument("Invalid Policy: the conditions list is empty.")
    return document


def _expiration(document: Mapping[str, Any]) -> datetime:
    text = document.get("expiration")
    if not isinstance(text, str):
        raise InvalidPolicyDocument("Invalid Policy: Policy missing expiration.")
    for layout in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, layout).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise InvalidPolicyDocument(f"Invalid Policy: Invalid 'expiration' value: {text!r}.")


def _conditions(
    document: Mapping[str, Any],
) -> tuple[tuple[tuple[str, str, str], ...], tuple[int, int | None]]:
    conditions: list[tuple[str, str, str]] = []
    length_range: tuple[int, int | None] = (0, None)
    for condition in document["conditions"]:
        if isinstance(condition, dict) and condition:  # {} is no condition: refused below
            conditions += [("eq", str(k).lower(), _text(v)) for k, v in condition.items()]
        elif isinstance(condition, list) and len(condition) == 3:
            operator = str(condition[0]).lower()
            if operator == "content-length-range":
                length_range = (_count(condition[1]), _count(condition[2]))
            elif operator in ("eq", "starts-with") and str(condition[1]).startswith("$"):
                conditions.append((operator, str(condition[1])[1:].lower(), _text(condition[2])))
            else:
                raise InvalidPolicyDocument(f"Invalid Policy: Invalid Condition {condition!r}.")
        else:
            raise InvalidPolicyDocument(f"Invalid Policy: Invalid Condition {condition!r}.")
    return tuple(conditions), length_range


def _text(value: Any) -> str:
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value)
    raise InvalidPolicyDocument(f"Invalid Policy: a condition's value {value!r} is not text.")


def _count(value: Any) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise InvalidPolicyDocument(f"Invalid Policy: {value!r} is not a byte count.") from None
    if count < 0:
        raise InvalidPolicyDocument(f"Invalid Policy: {value!r} is not a byte count.")
    return count


def _holds(operator: str, name: str, value: str, expected: str) -> bool:
    if operator == "eq":
        return value == expected
    if name == "content-type":  # S3: each of several comma-separated types must match
        return all(part.strip().startswith(expected) for part in value.split(","))
    return value.startswith(expected)
