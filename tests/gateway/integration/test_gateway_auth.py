"""Negative authentication cases: 403 S3 XML and nothing reaches the store."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from unittest import mock

import boto3
import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError


def _error(reply: httpx.Response) -> dict[str, str]:
    root = ET.fromstring(reply.content)
    return {child.tag: child.text or "" for child in root}


def _assert_absent(backend_s3, bucket: str, key: str) -> None:
    with pytest.raises(ClientError) as err:
        backend_s3.head_object(Bucket=bucket, Key=key)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def _signed_put(gateway, bucket, key, *, secret=None, key_id=None, when=None) -> httpx.Response:
    url = f"{gateway.endpoint_url}/{bucket}/{key}"
    request = AWSRequest(
        method="PUT", url=url, data=b"payload", headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}
    )
    creds = Credentials(key_id or gateway.access_key_id, secret or gateway.secret_access_key)
    with mock.patch("botocore.auth.get_current_datetime", lambda: when or dt.datetime.utcnow()):
        S3SigV4Auth(creds, "s3", "us-east-1").add_auth(request)
    return httpx.put(url, content=b"payload", headers=dict(request.headers.items()))


def test_missing_signature_is_denied(gateway, backend_s3, bucket):
    # Unsigned: the store judges it (no bucket policy grants anonymous writes) and answers.
    reply = httpx.put(f"{gateway.endpoint_url}/{bucket}/anon", content=b"x")
    assert reply.status_code == 403
    err = _error(reply)
    assert err["Code"] == "AccessDenied" and err["RequestId"] == reply.headers["x-amz-request-id"]
    assert reply.headers["x-hapi-request-id"]
    _assert_absent(backend_s3, bucket, "anon")


def test_wrong_secret_is_signature_mismatch(gateway, backend_s3, bucket):
    reply = _signed_put(gateway, bucket, "wrong", secret="not-the-secret")
    assert reply.status_code == 403 and _error(reply)["Code"] == "SignatureDoesNotMatch"
    _assert_absent(backend_s3, bucket, "wrong")


def test_unknown_access_key(gateway, backend_s3, bucket):
    reply = _signed_put(gateway, bucket, "unknown", key_id="AKIDNOTKNOWN")
    assert reply.status_code == 403 and _error(reply)["Code"] == "InvalidAccessKeyId"
    _assert_absent(backend_s3, bucket, "unknown")


def test_clock_skew_is_refused(gateway, backend_s3, bucket):
    when = dt.datetime.utcnow() - dt.timedelta(hours=1)
    reply = _signed_put(gateway, bucket, "skewed", when=when)
    assert reply.status_code == 403 and _error(reply)["Code"] == "RequestTimeTooSkewed"
    _assert_absent(backend_s3, bucket, "skewed")


def test_expired_presigned_url(gateway, s3, bucket):
    s3.put_object(Bucket=bucket, Key="exp", Body=b"secret data")
    an_hour_ago = dt.datetime.utcnow() - dt.timedelta(hours=1)
    with mock.patch("botocore.auth.get_current_datetime", lambda: an_hour_ago):
        url = s3.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "exp"}, ExpiresIn=60
        )
    reply = httpx.get(url)
    assert reply.status_code == 403 and b"secret data" not in reply.content
    err = _error(reply)
    assert err["Code"] == "AccessDenied" and "expired" in err["Message"]


def test_tampered_presigned_url(gateway, s3, bucket):
    s3.put_object(Bucket=bucket, Key="t1", Body=b"one")
    s3.put_object(Bucket=bucket, Key="t2", Body=b"two")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "t1"})
    reply = httpx.get(url.replace("/t1?", "/t2?"))
    assert reply.status_code == 403 and _error(reply)["Code"] == "SignatureDoesNotMatch"


def test_client_authorization_never_goes_upstream(gateway, bucket):
    # A client signing with the *backend's* credentials is a stranger to the gateway.
    store_client = boto3.client(
        "s3",
        endpoint_url=gateway.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=gateway.backend_access_key_id,
        aws_secret_access_key=gateway.backend_secret_access_key,
    )
    with pytest.raises(ClientError) as err:
        store_client.list_objects_v2(Bucket=bucket)
    assert err.value.response["Error"]["Code"] == "InvalidAccessKeyId"


@pytest.fixture
def v2_client(gateway):
    """boto3 as users have it: no signature_version, so presigned URLs use the V2 form."""
    return boto3.client(
        "s3",
        endpoint_url=gateway.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=gateway.access_key_id,
        aws_secret_access_key=gateway.secret_access_key,
    )


def test_default_boto3_presigned_urls_v2(v2_client, backend_s3, bucket):
    put_url = v2_client.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "v2 key+x.bin"}
    )
    assert "AWSAccessKeyId=" in put_url and "X-Amz-Signature" not in put_url
    assert httpx.put(put_url, content=b"v2 body").status_code == 200
    assert backend_s3.get_object(Bucket=bucket, Key="v2 key+x.bin")["Body"].read() == b"v2 body"
    get_url = v2_client.generate_presigned_url(
        "get_object",
        Params={"Bucket": bucket, "Key": "v2 key+x.bin", "ResponseContentType": "text/plain"},
    )
    reply = httpx.get(get_url)
    assert reply.content == b"v2 body" and reply.headers["content-type"] == "text/plain"
    tampered = httpx.get(get_url.replace("text%2Fplain", "text%2Fhtml"))
    assert tampered.status_code == 403 and _error(tampered)["Code"] == "SignatureDoesNotMatch"


def test_expired_v2_presigned_url(v2_client, bucket):
    url = v2_client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "x"}, ExpiresIn=-10
    )
    reply = httpx.get(url)
    assert reply.status_code == 403 and "expired" in _error(reply)["Message"]
