"""POST Object (browser form uploads) through the gateway, against the store's own answer.

Each form is generated twice, by boto3 (``generate_presigned_post``) with the gateway's
client credentials and with the store's, posted to each, and the answers compared: status,
error code, what is stored (bytes, metadata, content type), and that a refused form writes
nothing.
"""

from __future__ import annotations

import base64
import hmac
import json
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError


def _client(endpoint: str, key_id: str, secret: str, signature: str | None) -> Any:
    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    if signature is not None:
        config = config.merge(Config(signature_version=signature))
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=config,
    )


@pytest.fixture(params=["s3v4", None], ids=["v4-policy", "v2-policy"])
def signers(request, gateway, store) -> dict[str, Any]:
    """boto3 clients that sign forms for the gateway and for the store (V4 or V2 policy)."""
    creds = store.credentials
    return {
        "gateway": _client(
            gateway.endpoint_url, gateway.access_key_id, gateway.secret_access_key, request.param
        ),
        "store": _client(
            store.endpoint_url, creds.access_key_id, creds.secret_access_key, request.param
        ),
    }


def _post(
    signer: Any,
    bucket: str,
    key: str,
    *,
    content: bytes | BinaryIO = b"form body",
    fields: dict[str, str] | None = None,
    conditions: list[Any] | None = None,
    expires: int = 300,
    change: dict[str, str] | None = None,
    drop: tuple[str, ...] = (),
    file_type: str = "text/plain",
) -> httpx.Response:
    form = signer.generate_presigned_post(
        bucket, key, Fields=fields, Conditions=conditions, ExpiresIn=expires
    )
    data = {n: v for n, v in {**form["fields"], **(change or {})}.items() if n not in drop}
    return httpx.post(
        form["url"], data=data, files={"file": ("up load.txt", content, file_type)}, timeout=60
    )


def _code(reply: httpx.Response) -> str:
    if b"<Error>" not in reply.content:
        return ""
    return ET.fromstring(reply.content).findtext("Code") or ""


def _stored(backend_s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        got = backend_s3.get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "NoSuchKey"
        return None
    return {"body": got["Body"].read(), "type": got["ContentType"], "meta": got["Metadata"]}


def _both(signers, bucket, key, **form: Any) -> dict[str, httpx.Response]:
    return {
        name: _post(signer, bucket, f"{key}-{name}", **form) for name, signer in signers.items()
    }


def _same_outcome(replies: dict[str, httpx.Response]) -> tuple[int, str]:
    outcome = {name: (r.status_code, _code(r)) for name, r in replies.items()}
    assert outcome["gateway"] == outcome["store"], outcome
    return outcome["gateway"]


def _same_store(backend_s3, bucket, key) -> dict[str, Any] | None:
    stored = {name: _stored(backend_s3, bucket, f"{key}-{name}") for name in ("gateway", "store")}
    assert stored["gateway"] == stored["store"]
    return stored["gateway"]


def test_form_upload_stores_the_file_with_its_fields(signers, backend_s3, bucket):
    fields = {"Content-Type": "image/png", "x-amz-meta-note": "café ✓"}
    conditions = [{"Content-Type": "image/png"}, {"x-amz-meta-note": "café ✓"}]
    replies = _both(signers, bucket, "k", fields=fields, conditions=conditions)
    assert _same_outcome(replies) == (204, "")
    stored = _same_store(backend_s3, bucket, "k")
    # Stored as the form's UTF-8 bytes; botocore reads header bytes as latin-1.
    note = "café ✓".encode().decode("latin-1")
    assert stored == {"body": b"form body", "type": "image/png", "meta": {"note": note}}
    assert replies["gateway"].headers["etag"] == replies["store"].headers["etag"]


def test_file_content_type_is_used_without_a_field(signers, backend_s3, bucket):
    assert _same_outcome(_both(signers, bucket, "t", file_type="image/webp")) == (204, "")
    assert _same_store(backend_s3, bucket, "t")["type"] == "image/webp"


def test_filename_is_substituted_into_the_key(signers, backend_s3, bucket):
    replies = {
        name: _post(signer, bucket, f"{name}/${{filename}}") for name, signer in signers.items()
    }
    assert _same_outcome(replies) == (204, "")
    for name in signers:
        assert _stored(backend_s3, bucket, f"{name}/up load.txt")["body"] == b"form body"


def test_success_action_status_201_answers_xml(signers, backend_s3, bucket):
    status = {"success_action_status": "201"}
    replies = _both(signers, bucket, "c", fields=status, conditions=[status])
    assert _same_outcome(replies) == (201, "")
    for name, reply in replies.items():
        root = ET.fromstring(reply.content)
        assert root.tag == "PostResponse"
        assert root.findtext("Bucket") == bucket and root.findtext("Key") == f"c-{name}"
        assert root.findtext("ETag") == reply.headers["etag"]


def test_success_action_status_200(signers, backend_s3, bucket):
    status = {"success_action_status": "200"}
    replies = _both(signers, bucket, "s", fields=status, conditions=[status])
    assert _same_outcome(replies) == (200, "")
    assert replies["gateway"].content == replies["store"].content == b""
    assert _same_store(backend_s3, bucket, "s")["body"] == b"form body"


def test_success_action_redirect(signers, backend_s3, bucket):
    target = {"success_action_redirect": "https://app.example/done"}
    replies = _both(signers, bucket, "r", fields=target, conditions=[target])
    assert _same_outcome(replies) == (303, "")
    for name, reply in replies.items():
        location = urlsplit(reply.headers["location"])
        assert location[:3] == ("https", "app.example", "/done")
        etag = backend_s3.head_object(Bucket=bucket, Key=f"r-{name}")["ETag"]
        query = parse_qs(location.query)
        assert query == {"bucket": [bucket], "key": [f"r-{name}"], "etag": [etag]}


# Refused forms: the store's error, and nothing written


def _assert_refused(signers, backend_s3, bucket, key, expected, **form: Any) -> None:
    replies = _both(signers, bucket, key, **form)
    assert _same_outcome(replies) == expected
    assert _same_store(backend_s3, bucket, key) is None


def _is_v4(signer: Any) -> bool:
    return "x-amz-credential" in signer.generate_presigned_post("b", "k")["fields"]


def test_bad_signature(signers, backend_s3, bucket):
    if _is_v4(signers["gateway"]):
        bad = {"x-amz-signature": "0" * 64}
    else:
        bad = {"signature": "AAAAAAAAAAAAAAAAAAAAAAAAAAA="}
    _assert_refused(signers, backend_s3, bucket, "sig", (403, "SignatureDoesNotMatch"), change=bad)


# What the store answers a form whose signature fields are incomplete: without a V2
# signature field it reads the form as V4, whose credential is then missing.
_INCOMPLETE = {
    "v2": [
        ({"drop": ("signature",)}, (400, "AuthorizationQueryParametersError")),
        ({"drop": ("signature", "AWSAccessKeyId")}, (400, "AuthorizationQueryParametersError")),
        ({"change": {"signature": ""}}, (400, "MissingFields")),
        ({"drop": ("AWSAccessKeyId",)}, (400, "MissingFields")),
    ],
    "v4": [
        ({"drop": ("x-amz-credential",)}, (400, "AuthorizationQueryParametersError")),
        ({"change": {"x-amz-credential": "NOBODY"}}, (400, "AuthorizationQueryParametersError")),
        ({"drop": ("x-amz-signature",)}, (403, "SignatureDoesNotMatch")),
    ],
}


def test_incomplete_signature_fields(signers, backend_s3, bucket):
    scheme = "v4" if _is_v4(signers["gateway"]) else "v2"
    for index, (form, expected) in enumerate(_INCOMPLETE[scheme]):
        _assert_refused(signers, backend_s3, bucket, f"incomplete-{index}", expected, **form)


def test_expired_policy(signers, backend_s3, bucket):
    _assert_refused(signers, backend_s3, bucket, "old", (403, "AccessDenied"), expires=-10)


def test_key_outside_the_policy(signers, backend_s3, bucket):
    replies = {
        name: _post(signer, bucket, f"allowed-{name}", change={"key": f"elsewhere-{name}"})
        for name, signer in signers.items()
    }
    assert _same_outcome(replies) == (403, "AccessDenied")
    for name in signers:
        assert _stored(backend_s3, bucket, f"elsewhere-{name}") is None


def test_starts_with_condition(signers, backend_s3, bucket):
    conditions = [["starts-with", "$Content-Type", "image/"]]
    fields = {"Content-Type": "image/png"}
    ok = _both(signers, bucket, "sw", fields=fields, conditions=conditions)
    assert _same_outcome(ok) == (204, "")
    _assert_refused(
        signers,
        backend_s3,
        bucket,
        "sw-bad",
        (403, "AccessDenied"),
        fields=fields,
        conditions=conditions,
        change={"Content-Type": "text/html"},
    )


def test_uncovered_metadata_field(signers, backend_s3, bucket):
    _assert_refused(
        signers,
        backend_s3,
        bucket,
        "extra",
        (403, "AccessDenied"),
        change={"x-amz-meta-sneaky": "yes"},
    )


def test_unknown_access_key(signers, backend_s3, bucket):
    v4 = _is_v4(signers["gateway"])
    replies = {}
    for name, signer in signers.items():
        form = signer.generate_presigned_post(bucket, f"who-{name}", ExpiresIn=300)
        fields = dict(form["fields"])
        if v4:
            fields["x-amz-credential"] = "NOBODY/" + fields["x-amz-credential"].split("/", 1)[1]
        else:
            fields["AWSAccessKeyId"] = "NOBODY"
        replies[name] = httpx.post(form["url"], data=fields, files={"file": ("a", b"x")})
    assert _same_outcome(replies) == (403, "InvalidAccessKeyId")
    assert _same_store(backend_s3, bucket, "who") is None


def test_file_under_the_size_range(signers, backend_s3, bucket):
    _assert_refused(
        signers,
        backend_s3,
        bucket,
        "small",
        (400, "EntityTooSmall"),
        conditions=[["content-length-range", 100, 1000]],
    )


def test_file_over_the_size_range_leaves_the_old_object(signers, backend_s3, bucket):
    for name in signers:
        backend_s3.put_object(Bucket=bucket, Key=f"big-{name}", Body=b"old")
    content = b"z" * (3 * 1024 * 1024)  # larger than one read: the PUT is cut off mid-way
    replies = _both(
        signers,
        bucket,
        "big",
        content=content,
        conditions=[["content-length-range", 1, 1024 * 1024]],
    )
    assert _same_outcome(replies) == (400, "EntityTooLarge")
    assert _same_store(backend_s3, bucket, "big")["body"] == b"old"


def test_a_large_file_streams_with_bounded_memory(gateway, signers, backend_s3, bucket, tmp_path):
    size = 96 * 1024 * 1024
    path = tmp_path / "big.bin"
    with path.open("wb") as out:
        for _ in range(size // (1024 * 1024)):
            out.write(b"q" * (1024 * 1024))
    gateway.reset_peak_rss()
    before = gateway.rss_bytes()
    with path.open("rb") as content:
        reply = _post(
            signers["gateway"],
            bucket,
            "huge",
            content=content,
            conditions=[["content-length-range", 1, size]],
        )
    assert reply.status_code == 204, reply.text
    assert gateway.peak_rss_bytes() - before < 48 * 1024 * 1024
    head = backend_s3.head_object(Bucket=bucket, Key="huge")
    assert head["ContentLength"] == size


def test_anonymous_form_is_judged_by_the_store(gateway, store, backend_s3, bucket):
    replies = {
        name: httpx.post(
            f"{url}/{bucket}", data={"key": f"anon-{name}"}, files={"file": ("a", b"x")}
        )
        for name, url in (("gateway", gateway.endpoint_url), ("store", store.endpoint_url))
    }
    outcome = _same_outcome(replies)
    assert outcome[0] >= 400
    assert _same_store(backend_s3, bucket, "anon") is None


def test_virtual_hosted_form_upload(gateway, signers, backend_s3, bucket):
    form = signers["gateway"].generate_presigned_post(bucket, "vhost", ExpiresIn=300)
    port = urlsplit(gateway.endpoint_url).port
    reply = httpx.post(
        f"{gateway.endpoint_url}/",
        headers={"host": f"{bucket}.localhost:{port}"},
        data=form["fields"],
        files={"file": ("a", b"virtual")},
    )
    assert reply.status_code == 204, reply.text
    assert _stored(backend_s3, bucket, "vhost")["body"] == b"virtual"
    other = httpx.post(
        f"{gateway.endpoint_url}/",
        headers={"host": f"{bucket}-other.localhost:{port}"},
        data=form["fields"],  # signed for another bucket
        files={"file": ("a", b"elsewhere")},
    )
    assert other.status_code == 403 and _code(other) == "AccessDenied"


# The forms of ceph's s3-tests (test_post_object_missing_signature and
# test_post_object_empty_conditions), built and sent as those tests do: a V2 policy signed by
# hand, every field a multipart part with a filename (requests' ``files=``).


def _ceph_form(
    key_id: str, secret: str, bucket: str, key: str, conditions: list[Any], *, signed: bool
) -> list[tuple[str, tuple[str, str]]]:
    expiration = (datetime.now(UTC) + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    document = {"expiration": expiration, "conditions": conditions}
    policy = base64.b64encode(json.dumps(document).encode()).decode()
    fields = {"key": key, "AWSAccessKeyId": key_id, "acl": "private"}
    if signed:
        digest = hmac.digest(secret.encode(), policy.encode(), "sha1")
        fields["signature"] = base64.b64encode(digest).decode()
    fields |= {"policy": policy, "Content-Type": "text/plain", "file": "bar"}
    return [(name, (name, value)) for name, value in fields.items()]


def _ceph_conditions(bucket: str) -> list[Any]:
    return [
        {"bucket": bucket},
        ["starts-with", "$key", "foo"],
        {"acl": "private"},
        ["starts-with", "$Content-Type", "text/plain"],
        ["content-length-range", 0, 1024],
    ]


@pytest.mark.parametrize(
    ("conditions", "signed", "code"),
    [
        pytest.param(None, False, "AuthorizationQueryParametersError", id="missing-signature"),
        pytest.param([{}], True, "InvalidPolicyDocument", id="empty-conditions"),
        pytest.param([], True, "InvalidPolicyDocument", id="no-conditions"),
    ],
)
def test_ceph_forms_are_refused(gateway, store, backend_s3, bucket, conditions, signed, code):
    creds = store.credentials
    endpoints = {
        "gateway": (gateway.endpoint_url, gateway.access_key_id, gateway.secret_access_key),
        "store": (store.endpoint_url, creds.access_key_id, creds.secret_access_key),
    }
    if conditions is None:
        conditions = _ceph_conditions(bucket)
    replies = {}
    for name, (url, key_id, secret) in endpoints.items():
        form = _ceph_form(key_id, secret, bucket, f"foo-ceph-{name}", conditions, signed=signed)
        replies[name] = httpx.post(f"{url}/{bucket}", files=form)
    # The store reads no field of a part that has a filename, so it answers 400
    # InvalidRequest to any form sent this way; the gateway reads them as S3 does.
    assert replies["gateway"].status_code == replies["store"].status_code == 400
    assert _code(replies["gateway"]) == code
    assert _same_store(backend_s3, bucket, "foo-ceph") is None
