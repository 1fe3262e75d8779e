"""The streaming multipart/form-data reader and the form-upload policy, in-process."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from hapi.gateway._errors import (
    AccessDenied,
    AuthorizationQueryParametersError,
    InvalidAccessKeyId,
    InvalidPolicyDocument,
    MalformedPOSTRequest,
    MaxPostPreDataLengthExceeded,
    MissingFields,
    SignatureDoesNotMatch,
)
from hapi.gateway.edge._form import FormReader, form_boundary
from hapi.gateway.edge._post_policy import verify_form

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _encoded(fields: dict[str, str], file: bytes, trailing: dict[str, str] | None = None):
    """A real multipart body (httpx's encoder), its boundary."""
    request = httpx.Request(
        "POST",
        "http://x/b",
        data={**fields},
        files={"file": ("name.bin", file, "image/png")},
    )
    body = request.read()
    if trailing:
        boundary = form_boundary(request.headers["content-type"])
        assert boundary is not None
        extra = b"".join(
            b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
            % (boundary, k.encode(), v.encode())
            for k, v in trailing.items()
        )
        body = body.replace(b"--" + boundary + b"--", extra + b"--" + boundary + b"--")
    return body, request.headers["content-type"]


async def _pieces(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def _read(body: bytes, content_type: str, size: int, limit: int = 1 << 20):
    return asyncio.run(_read_async(body, content_type, size, limit))


async def _read_async(body: bytes, content_type: str, size: int, limit: int):
    boundary = form_boundary(content_type)
    assert boundary is not None
    reader = FormReader(_pieces(body, size), boundary, max_fields_bytes=limit)
    fields, file = await reader.fields()
    data = b"".join([piece async for piece in reader.file()]) if file else None
    complete = await reader.rest(1 << 20)
    return fields, file, data, complete


@pytest.mark.parametrize("size", [1, 3, 7, 64, 1 << 20])
def test_fields_then_file_in_reads_of_any_size(size):
    payload = b"\r\n--not-a-boundary\r\n" * 50 + bytes(range(256))
    body, content_type = _encoded({"key": "a/${filename}", "Policy": "p"}, payload)
    fields, file, data, complete = _read(body, content_type, size)
    assert fields == {"key": "a/${filename}", "policy": "p"}
    assert file is not None and (file.filename, file.content_type) == ("name.bin", "image/png")
    assert data == payload and complete


def test_fields_after_the_file_are_ignored():
    body, content_type = _encoded({"key": "k"}, b"data", trailing={"submit": "Upload"})
    fields, _, data, complete = _read(body, content_type, 5)
    assert fields == {"key": "k"} and data == b"data" and complete


def test_empty_file():
    body, content_type = _encoded({"key": "k"}, b"")
    _, file, data, _ = _read(body, content_type, 4)
    assert file is not None and data == b""


def test_form_without_a_file():
    request = httpx.Request("POST", "http://x/b", data={"key": "k"}, files={"x": ("n", b"v")})
    # "x" is a file-like part with another name: a field, not the file
    fields, file, _, _ = _read(request.read(), request.headers["content-type"], 8)
    assert fields == {"key": "k", "x": "v"} and file is None


def test_truncated_body_is_malformed():
    body, content_type = _encoded({"key": "k"}, b"0123456789")
    with pytest.raises(MalformedPOSTRequest):
        _read(body[:-30], content_type, 4)


def test_fields_are_bounded():
    body, content_type = _encoded({"key": "k" * 5000}, b"x")
    with pytest.raises(MaxPostPreDataLengthExceeded):
        _read(body, content_type, 100, limit=1000)


@pytest.mark.parametrize(
    ("content_type", "boundary"),
    [
        ("multipart/form-data; boundary=abc", b"abc"),
        ('multipart/form-data; charset=utf-8; boundary="a b:c"', b"a b:c"),
        ("Multipart/Form-Data;boundary=x-y", b"x-y"),
        ("application/x-www-form-urlencoded", None),
        ("multipart/form-data", None),
    ],
)
def test_boundary(content_type, boundary):
    assert form_boundary(content_type) == boundary


# Policy


def _policy(conditions: list[object], expires: datetime = NOW + timedelta(minutes=5)) -> str:
    document = {"expiration": expires.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "conditions": conditions}
    return base64.b64encode(json.dumps(document).encode()).decode()


def _v2(policy: str, secret: str = "secret", key_id: str = "AKID") -> dict[str, str]:
    signature = base64.b64encode(hmac.digest(secret.encode(), policy.encode(), "sha1")).decode()
    return {"policy": policy, "awsaccesskeyid": key_id, "signature": signature}


def test_v2_policy_and_conditions():
    fields = {
        **_v2(_policy([{"bucket": "b"}, ["starts-with", "$key", "up/"], {"x-amz-meta-a": "1"}])),
        "key": "up/x",
        "x-amz-meta-a": "1",
    }
    policy = verify_form(fields, {"AKID": "secret"}, NOW)
    policy.check(fields, "b")
    assert policy.access_key_id == "AKID"
    with pytest.raises(AccessDenied, match="Condition failed"):
        policy.check(fields, "other")
    with pytest.raises(AccessDenied, match="Condition failed"):
        policy.check({**fields, "key": "down/x"}, "b")
    with pytest.raises(AccessDenied, match="Extra input fields: x-amz-meta-b"):
        policy.check({**fields, "x-amz-meta-b": "2"}, "b")


def test_content_length_range_is_read():
    fields = _v2(_policy([["content-length-range", "10", 20]]))
    policy = verify_form(fields, {"AKID": "secret"}, NOW)
    assert (policy.min_length, policy.max_length) == (10, 20)


def _v4(policy: str) -> dict[str, str]:
    key = b"AWS4secret"
    for part in ("20260102", "us-east-1", "s3", "aws4_request"):
        key = hmac.digest(key, part.encode(), "sha256")
    return {
        "policy": policy,
        "x-amz-algorithm": "AWS4-HMAC-SHA256",
        "x-amz-credential": "AKID/20260102/us-east-1/s3/aws4_request",
        "x-amz-date": "20260102T030405Z",
        "x-amz-signature": hmac.new(key, policy.encode(), hashlib.sha256).hexdigest(),
    }


def test_v4_signature():
    fields = _v4(_policy([{"bucket": "b"}]))
    assert verify_form(fields, {"AKID": "secret"}, NOW).access_key_id == "AKID"
    with pytest.raises(SignatureDoesNotMatch):
        verify_form({**fields, "x-amz-signature": "0" * 64}, {"AKID": "secret"}, NOW)


def test_refusals():
    secrets = {"AKID": "secret"}
    with pytest.raises(AccessDenied, match="Policy expired"):
        verify_form(_v2(_policy([{"bucket": "b"}], NOW - timedelta(seconds=1))), secrets, NOW)
    with pytest.raises(SignatureDoesNotMatch):
        verify_form(_v2(_policy([{"bucket": "b"}]), secret="other"), secrets, NOW)
    with pytest.raises(InvalidAccessKeyId):
        verify_form(_v2(_policy([{"bucket": "b"}]), key_id="NOBODY"), secrets, NOW)
    not_json = base64.b64encode(b"{not json").decode()
    with pytest.raises(InvalidPolicyDocument):
        verify_form(_v2(not_json), secrets, NOW)
    with pytest.raises(InvalidPolicyDocument):
        verify_form(_v2(_policy([["between", "$key", 1]])), secrets, NOW)


def _without(fields: dict[str, str], *names: str) -> dict[str, str]:
    return {name: value for name, value in fields.items() if name not in names}


_SIGNED = _policy([{"bucket": "b"}])


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        # The store's answers (SeaweedFS): a form without a V2 signature field is read as a
        # V4 form, whose credential is missing; a V2 form needs all three of its fields.
        pytest.param(
            _without(_v2(_SIGNED), "signature"), AuthorizationQueryParametersError, id="v2-no-sig"
        ),
        pytest.param({"policy": _SIGNED}, AuthorizationQueryParametersError, id="policy-alone"),
        pytest.param({"awsaccesskeyid": "AKID"}, AuthorizationQueryParametersError, id="key-id"),
        pytest.param({**_v2(_SIGNED), "signature": ""}, MissingFields, id="v2-empty-sig"),
        pytest.param(_without(_v2(_SIGNED), "awsaccesskeyid"), MissingFields, id="v2-no-key-id"),
        pytest.param(_without(_v2(_SIGNED), "policy"), MissingFields, id="v2-no-policy"),
        pytest.param(
            _without(_v4(_SIGNED), "x-amz-credential"),
            AuthorizationQueryParametersError,
            id="v4-no-credential",
        ),
        pytest.param(
            {**_v4(_SIGNED), "x-amz-credential": "AKID"},
            AuthorizationQueryParametersError,
            id="v4-bad-credential",
        ),
        pytest.param(
            _without(_v4(_SIGNED), "x-amz-signature"), SignatureDoesNotMatch, id="v4-no-sig"
        ),
    ],
)
def test_incomplete_signature_fields(fields, error):
    with pytest.raises(error):
        verify_form(fields, {"AKID": "secret"}, NOW)


@pytest.mark.parametrize("conditions", [[], [{}], [{"bucket": "b"}, {}]])
@pytest.mark.parametrize("sign", [_v2, _v4])
def test_a_policy_without_conditions_is_refused(sign, conditions):
    with pytest.raises(InvalidPolicyDocument):
        verify_form(sign(_policy(conditions)), {"AKID": "secret"}, NOW)
