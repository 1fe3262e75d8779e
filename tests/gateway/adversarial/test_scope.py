"""A signed request reaches exactly the bucket and key it was signed for, whatever its Host.

Signature V2 does not sign ``Host``; with virtual-hosted addressing (``localhost`` by
default), ``Host: dat.localhost`` on a URL presigned for ``/data/photo.jpg`` must not reach
``dat/data/photo.jpg``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config

from tests.support import empty_bucket, signed_headers

SECRET = b"another bucket's secret"


@pytest.fixture
def buckets(backend_s3: Any) -> Iterator[tuple[str, str]]:
    """Two buckets, the name of the second a prefix of the first's: (signed, victim)."""
    victim = f"hapiscope{secrets.token_hex(4)}"
    signed = victim + "x"
    for name in (signed, victim):
        backend_s3.create_bucket(Bucket=name)
    yield signed, victim
    for name in (signed, victim):
        empty_bucket(backend_s3, name)
        backend_s3.delete_bucket(Bucket=name)


def _presigner(gateway: Any, version: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=gateway.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=gateway.access_key_id,
        aws_secret_access_key=gateway.secret_access_key,
        config=Config(signature_version=version, s3={"addressing_style": "path"}),
    )


def _stolen(gateway: Any, method: str, url: str, victim: str, **kwargs: Any) -> httpx.Response:
    port = httpx.URL(gateway.endpoint_url).port
    return httpx.request(method, url, headers={"host": f"{victim}.localhost:{port}"}, **kwargs)


def _victim_keys(backend_s3: Any, victim: str) -> dict[str, bytes]:
    listed = backend_s3.list_objects_v2(Bucket=victim).get("Contents", [])
    return {
        o["Key"]: backend_s3.get_object(Bucket=victim, Key=o["Key"])["Body"].read() for o in listed
    }


@pytest.mark.parametrize("version", ["s3", "s3v4"])
def test_presigned_get_cannot_read_another_bucket(gateway, backend_s3, buckets, version):
    signed, victim = buckets
    backend_s3.put_object(Bucket=victim, Key=f"{signed}/photo.jpg", Body=SECRET)
    backend_s3.put_object(Bucket=signed, Key="photo.jpg", Body=b"mine")
    url = _presigner(gateway, version).generate_presigned_url(
        "get_object", Params={"Bucket": signed, "Key": "photo.jpg"}
    )
    assert httpx.get(url).content == b"mine"  # the URL works where it was meant to
    reply = _stolen(gateway, "GET", url, victim)
    assert reply.status_code == 403, reply.text
    assert SECRET not in reply.content


@pytest.mark.parametrize("version", ["s3", "s3v4"])
def test_presigned_put_cannot_write_another_bucket(gateway, backend_s3, buckets, version):
    signed, victim = buckets
    url = _presigner(gateway, version).generate_presigned_url(
        "put_object", Params={"Bucket": signed, "Key": "photo.jpg"}
    )
    reply = _stolen(gateway, "PUT", url, victim, content=b"planted")
    assert reply.status_code == 403, reply.text
    assert _victim_keys(backend_s3, victim) == {}


@pytest.mark.parametrize("version", ["s3", "s3v4"])
def test_presigned_delete_cannot_delete_in_another_bucket(gateway, backend_s3, buckets, version):
    signed, victim = buckets
    backend_s3.put_object(Bucket=victim, Key=f"{signed}/photo.jpg", Body=SECRET)
    url = _presigner(gateway, version).generate_presigned_url(
        "delete_object", Params={"Bucket": signed, "Key": "photo.jpg"}
    )
    reply = _stolen(gateway, "DELETE", url, victim)
    assert reply.status_code == 403, reply.text
    assert _victim_keys(backend_s3, victim) == {f"{signed}/photo.jpg": SECRET}


def test_header_signed_request_cannot_be_redirected(gateway, backend_s3, buckets):
    signed, victim = buckets
    backend_s3.put_object(Bucket=victim, Key=f"{signed}/photo.jpg", Body=SECRET)
    path = f"/{signed}/photo.jpg"
    headers = signed_headers(gateway, "GET", path)
    port = httpx.URL(gateway.endpoint_url).port
    headers["host"] = f"{victim}.localhost:{port}"
    reply = httpx.get(gateway.endpoint_url + path, headers=headers)
    assert reply.status_code == 403, reply.text
    assert SECRET not in reply.content
