"""Statuses S3 clients handle right, as S3 XML with a RequestId, as the store would give.

A request signed for another region is refused as AWS refuses it; keys with dot segments
or doubled slashes reach the store as written (no normalisation after signing), so the
gateway answers what the store answers to the same request.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config

from hapi.gateway import sign_request
from hapi.protocol import Credentials
from tests.gateway.adversarial._support import Reply, encode_request, exchange, exchange_at
from tests.support import signed_headers


def _error(reply: Reply | httpx.Response) -> tuple[str | None, str | None]:
    body = reply.body if isinstance(reply, Reply) else reply.content
    root = ET.fromstring(body)
    return root.findtext("Code"), root.findtext("RequestId")


def test_header_signed_for_another_region_is_malformed(gateway, bucket):
    path = f"/{bucket}?list-type=2"
    headers = signed_headers(gateway, "GET", path, region="eu-west-3")
    reply = httpx.get(gateway.endpoint_url + path, headers=headers)
    assert reply.status_code == 400
    code, request_id = _error(reply)
    assert code == "AuthorizationHeaderMalformed"
    assert request_id
    assert "eu-west-3" in reply.text and "us-east-1" in reply.text


def test_presigned_for_another_region_is_refused(gateway, bucket):
    client = boto3.client(
        "s3",
        endpoint_url=gateway.endpoint_url,
        region_name="eu-west-3",
        aws_access_key_id=gateway.access_key_id,
        aws_secret_access_key=gateway.secret_access_key,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    url = client.generate_presigned_url("list_objects_v2", Params={"Bucket": bucket})
    reply = httpx.get(url)
    assert reply.status_code == 400
    assert _error(reply)[0] == "AuthorizationQueryParametersError"


def _direct_put(store: Any, path: str, body: bytes) -> Reply:
    """The same raw PUT, straight to the store with its own credentials."""
    headers = sign_request(
        method="PUT",
        url=store.endpoint_url + path,
        headers={"content-length": str(len(body))},
        credentials=Credentials(
            store.credentials.access_key_id, store.credentials.secret_access_key
        ),
    )
    return exchange_at(store.endpoint_url, encode_request("PUT", path, headers, body))


def _keys(backend_s3: Any, bucket: str) -> set[str]:
    return {o["Key"] for o in backend_s3.list_objects_v2(Bucket=bucket).get("Contents", [])}


@pytest.mark.parametrize("key", ["a/../b", "./x", "a/./b", "a//b", "..", "a/.."])
def test_odd_keys_are_forwarded_as_written(gateway, store, backend_s3, bucket, key):
    direct = _direct_put(store, f"/{bucket}/{key}", b"direct")
    stored_directly = _keys(backend_s3, bucket)
    for name in stored_directly:
        backend_s3.delete_object(Bucket=bucket, Key=name)
    path = f"/{bucket}/{key}"
    headers = signed_headers(gateway, "PUT", path, headers={"content-length": "7"})
    through = exchange(gateway, encode_request("PUT", path, headers, b"gateway"))
    assert through.status == direct.status, (through, direct)
    if direct.status >= 300:
        assert _error(through)[0] == _error(direct)[0]
        assert _error(through)[1]
    assert _keys(backend_s3, bucket) == stored_directly
