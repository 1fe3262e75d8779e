"""One parse, one decision: requests the access check and the store could read two ways.

Each case is a way a hostile client key once made the gateway's access decision and the
forwarded request disagree (an encoded ``/`` in the bucket, a pushdown flag on a delete,
two copy sources, an encoded subresource name). The key here acts upstream as the backend
identity, the store's administrator, as a flat credentials file or ``HAPI_ACCESS_KEY_ID``
makes it: the store's own permissions do not stop it, so the gateway's decision on the one
parsed operation is all that does. After every refusal the store is checked directly.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hapi.protocol import Credentials
from tests.gateway.adversarial._reading import (
    content_md5,
    delete_body,
    send,
    signed_v4,
)
from tests.gateway.adversarial._support import Reply
from tests.support import RunningGateway, credentials, empty_bucket

REGISTRY = "hapi-models"
CACHE = "hapi-cache"
SENTINEL = b"sentinel " + secrets.token_bytes(8).hex().encode()


def _code(body: bytes) -> str:
    found = re.search(rb"<Code>([^<]+)</Code>", body)
    return found.group(1).decode() if found else ""


@pytest.fixture(scope="module")
def sentinels(backend_s3: Any) -> Iterator[dict[str, str]]:
    """One object in each internal bucket, put there directly: ``{bucket: key}``."""
    existing = {b["Name"] for b in backend_s3.list_buckets().get("Buckets", [])}
    placed = {}
    for bucket in (REGISTRY, CACHE):
        if bucket not in existing:
            backend_s3.create_bucket(Bucket=bucket)
        key = f"reading-{secrets.token_hex(4)}/entry"
        backend_s3.put_object(Bucket=bucket, Key=key, Body=SENTINEL)
        placed[bucket] = key
    yield placed
    for bucket, key in placed.items():
        backend_s3.delete_object(Bucket=bucket, Key=key)


@pytest.fixture(scope="module")
def mine(backend_s3: Any) -> Iterator[str]:
    """A bucket the client may use, with one object to copy from."""
    name = f"mine-{secrets.token_hex(4)}"
    backend_s3.create_bucket(Bucket=name)
    backend_s3.put_object(Bucket=name, Key="seed", Body=b"seed")
    yield name
    empty_bucket(backend_s3, name)
    backend_s3.delete_bucket(Bucket=name)


def _intact(backend_s3: Any, sentinels: dict[str, str]) -> None:
    for bucket, key in sentinels.items():
        assert backend_s3.get_object(Bucket=bucket, Key=key)["Body"].read() == SENTINEL, bucket


def _absent(backend_s3: Any, bucket: str, key: str) -> None:
    with pytest.raises(ClientError):
        backend_s3.head_object(Bucket=bucket, Key=key)


def _client(gateway: RunningGateway) -> Credentials:
    return credentials(gateway)


def _batch_delete(gateway: RunningGateway, target: str, keys: list[str]) -> Reply:
    """A signed DeleteObjects of ``keys`` at ``target`` (path and query as written)."""
    body = delete_body(keys)
    headers = [("content-md5", content_md5(body))]
    raw = signed_v4(gateway.endpoint_url, _client(gateway), "POST", target, headers, body)
    return send(gateway.endpoint_url, raw)


@pytest.mark.parametrize("bucket", [REGISTRY, CACHE])
@pytest.mark.parametrize("slash", ["%2F", "%2f", "%2F%2F", "/"])
def test_an_encoded_slash_after_an_internal_bucket_deletes_nothing(
    gateway, backend_s3, sentinels, bucket, slash
):
    reply = _batch_delete(gateway, f"/{bucket}{slash}?delete", [sentinels[bucket]])
    assert reply.status in (400, 403, 405), reply
    assert _code(reply.body) in ("InvalidBucketName", "AccessDenied", "MethodNotAllowed")
    _intact(backend_s3, sentinels)


@pytest.mark.parametrize("bucket", [REGISTRY, CACHE])
def test_an_encoded_slash_reads_and_writes_no_internal_bucket(
    gateway, backend_s3, sentinels, bucket
):
    key = sentinels[bucket]
    url = gateway.endpoint_url
    read = send(url, signed_v4(url, _client(gateway), "GET", f"/{bucket}%2F/{key}"))
    assert read.status == 400 and _code(read.body) == "InvalidBucketName", read
    assert SENTINEL not in read.body
    listed = send(url, signed_v4(url, _client(gateway), "GET", f"/{bucket}%2F?list-type=2"))
    assert listed.status == 400 and key.encode() not in listed.body, listed
    write = send(url, signed_v4(url, _client(gateway), "PUT", f"/{bucket}%2F/{key}", body=b"x"))
    assert write.status == 400 and _code(write.body) == "InvalidBucketName", write
    gone = send(url, signed_v4(url, _client(gateway), "DELETE", f"/{bucket}%2F/{key}"))
    assert gone.status == 400, gone
    _intact(backend_s3, sentinels)


@pytest.mark.parametrize(
    "target",
    [
        "/hapi-models/{key}?delete&hapi-batch",
        "/hapi-models?delete&hapi-batch",
        "/hapi-models?delete&hapi-batch=1",
        "/hapi-models?delete&HAPI-BATCH",
        "/hapi-models/{key}?delete&hapi-model=r18",
    ],
)
def test_a_pushdown_flag_does_not_turn_a_delete_into_a_read(gateway, backend_s3, sentinels, target):
    key = sentinels[REGISTRY]
    reply = _batch_delete(gateway, target.format(key=key), [key])
    assert reply.status in (400, 405), reply
    assert _code(reply.body) in ("InvalidRequest", "MethodNotAllowed"), reply.body
    _intact(backend_s3, sentinels)


def test_a_pushdown_header_on_a_write_is_refused(gateway, backend_s3, mine):
    url = gateway.endpoint_url
    raw = signed_v4(url, _client(gateway), "PUT", f"/{mine}/flagged", [("x-hapi-model", "r18")])
    reply = send(url, raw)
    assert reply.status == 400 and _code(reply.body) == "InvalidRequest", reply
    _absent(backend_s3, mine, "flagged")


@pytest.mark.parametrize("name", ["%64elete", "d%65lete", "%64%65%6c%65%74%65"])
def test_an_encoded_subresource_name_is_read_as_the_store_reads_it(
    gateway, backend_s3, sentinels, name
):
    """``?%64elete`` is ``?delete`` to the store: a batch delete of the registry, a write."""
    reply = _batch_delete(gateway, f"/{REGISTRY}?{name}", [sentinels[REGISTRY]])
    assert reply.status == 403 and _code(reply.body) == "AccessDenied", reply
    _intact(backend_s3, sentinels)


def test_two_copy_sources_copy_nothing_out(gateway, backend_s3, sentinels, mine):
    entry = sentinels[CACHE]
    raw = signed_v4(
        gateway.endpoint_url,
        _client(gateway),
        "PUT",
        f"/{mine}/loot",
        [("x-amz-copy-source", f"/{CACHE}/{entry}?versionId=null&x=")],
        repeat=[("x-amz-copy-source", f"/{mine}/seed")],
    )
    reply = send(gateway.endpoint_url, raw)
    assert reply.status == 400 and _code(reply.body) == "InvalidRequest", reply
    _absent(backend_s3, mine, "loot")


def test_two_copy_sources_copy_no_part_out(gateway, backend_s3, sentinels, mine):
    upload = backend_s3.create_multipart_upload(Bucket=mine, Key="parts")["UploadId"]
    try:
        raw = signed_v4(
            gateway.endpoint_url,
            _client(gateway),
            "PUT",
            f"/{mine}/parts?partNumber=1&uploadId={upload}",
            [("x-amz-copy-source", f"/{mine}/seed")],
            repeat=[("x-amz-copy-source", f"/{CACHE}/{sentinels[CACHE]}")],
        )
        reply = send(gateway.endpoint_url, raw)
        assert reply.status == 400 and _code(reply.body) == "InvalidRequest", reply
        parts = backend_s3.list_parts(Bucket=mine, Key="parts", UploadId=upload)
        assert not parts.get("Parts"), parts
    finally:
        backend_s3.abort_multipart_upload(Bucket=mine, Key="parts", UploadId=upload)


@pytest.mark.parametrize(
    "source",
    [
        "/hapi-cache/{entry}?versionId=null&x=",
        "/hapi-cache/{entry}?x=1",
        "hapi-cache%2F{entry}",
        "/hapi-cache%2F/{entry}",
        "//hapi-cache/{entry}",
        "/mine-x/../hapi-cache/{entry}",
        "/HAPI-CACHE/{entry}",
    ],
)
def test_a_copy_source_is_one_bucket_and_key_or_refused(
    gateway, backend_s3, sentinels, mine, source
):
    raw = signed_v4(
        gateway.endpoint_url,
        _client(gateway),
        "PUT",
        f"/{mine}/loot",
        [("x-amz-copy-source", source.format(entry=sentinels[CACHE]))],
    )
    reply = send(gateway.endpoint_url, raw)
    assert reply.status in (400, 403), reply
    assert _code(reply.body) in ("InvalidArgument", "InvalidBucketName", "AccessDenied")
    _absent(backend_s3, mine, "loot")


@pytest.mark.parametrize(
    "header", ["x-amz-content-sha256", "x-amz-date", "host", "content-md5", "x-amz-checksum-crc32"]
)
def test_a_repeated_header_that_carries_meaning_is_refused(gateway, backend_s3, mine, header):
    body = b"payload"
    signed = [("content-md5", content_md5(body)), ("x-amz-checksum-crc32", "AAAAAA==")]
    raw = signed_v4(
        gateway.endpoint_url,
        _client(gateway),
        "PUT",
        f"/{mine}/twice",
        signed,
        body,
        repeat=[(header, "AAAAAA==")],
    )
    reply = send(gateway.endpoint_url, raw)
    assert reply.status == 400 and _code(reply.body) == "InvalidRequest", reply
    _absent(backend_s3, mine, "twice")


@pytest.mark.parametrize(
    ("target", "code"),
    [
        ("/hapi-models?delete&tagging", "InvalidRequest"),
        ("/hapi-models/k?uploads&uploadId=1", "InvalidRequest"),
        ("/hapi-models?versioning&policy", "InvalidRequest"),
        ("/mine/k?delete", "MethodNotAllowed"),
        ("/?delete", "MethodNotAllowed"),
    ],
)
def test_subresources_naming_two_operations_are_refused(
    gateway, backend_s3, sentinels, target, code
):
    reply = send(
        gateway.endpoint_url, signed_v4(gateway.endpoint_url, _client(gateway), "POST", target)
    )
    assert reply.status in (400, 405) and _code(reply.body) == code, reply
    _intact(backend_s3, sentinels)


@pytest.mark.parametrize(
    "path", ["/hapi-models./k", "/Hapi-Models/k", "//hapi-models/k", "/./hapi-models/k", "/../k"]
)
def test_a_bucket_that_is_not_a_bucket_name_is_refused(gateway, backend_s3, sentinels, path):
    raw = signed_v4(gateway.endpoint_url, _client(gateway), "PUT", path, body=b"x")
    reply = send(gateway.endpoint_url, raw)
    assert reply.status == 400 and _code(reply.body) == "InvalidBucketName", reply
    _intact(backend_s3, sentinels)


@pytest.mark.parametrize("key", ["a/../../hapi-models/k", "..", "./k", "k/."])
def test_a_key_with_dot_segments_is_refused(gateway, backend_s3, mine, key):
    raw = signed_v4(gateway.endpoint_url, _client(gateway), "PUT", f"/{mine}/{key}", body=b"x")
    reply = send(gateway.endpoint_url, raw)
    assert reply.status == 400 and _code(reply.body) == "InvalidRequest", reply
    assert {o["Key"] for o in backend_s3.list_objects_v2(Bucket=mine)["Contents"]} == {"seed"}


def test_a_batch_key_with_dot_segments_reads_no_other_bucket(gateway, sentinels, mine):
    """A key from a batch body is sent as a key (its dot segments encoded), never as a path
    that an HTTP client would resolve into the cache bucket."""
    body = (
        '{"keys": ["../' + CACHE + "/" + sentinels[CACHE] + '"], "model": "nosuchmodel", '
        '"split": 1}'
    ).encode()
    url = gateway.endpoint_url
    reply = send(url, signed_v4(url, _client(gateway), "POST", f"/{mine}?hapi-batch", body=body))
    assert SENTINEL not in reply.body
    assert reply.status in (400, 404), reply
