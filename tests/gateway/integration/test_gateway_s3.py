"""Every S3 operation a training workflow uses, through the real gateway to the real store."""

from __future__ import annotations

import datetime as dt
import hashlib
import os

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

MiB = 1024 * 1024


def _body(size: int, seed: int = 0) -> bytes:
    return hashlib.sha256(str(seed).encode()).digest() * (size // 32) + b"x" * (size % 32)


def test_bucket_lifecycle(s3, backend_s3):
    name = "hapi-lifecycle-" + os.urandom(4).hex()
    s3.create_bucket(Bucket=name)
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket=name)
    backend_s3.head_bucket(Bucket=name)  # it really exists in the store
    s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as err:
        s3.head_bucket(Bucket=name)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_put_get_head_delete_with_metadata(s3, backend_s3, bucket):
    body = _body(70_000, 1)
    s3.put_object(
        Bucket=bucket,
        Key="dir/a b+c~ü.bin",
        Body=body,
        ContentType="image/jpeg",
        CacheControl="max-age=60",
        ContentDisposition='attachment; filename="a.bin"',
        Metadata={"origin": "camera-7", "split": "train"},
    )
    got = s3.get_object(Bucket=bucket, Key="dir/a b+c~ü.bin")
    assert got["Body"].read() == body
    assert got["ContentType"] == "image/jpeg"
    assert got["CacheControl"] == "max-age=60"
    assert got["ContentDisposition"] == 'attachment; filename="a.bin"'
    assert got["Metadata"] == {"origin": "camera-7", "split": "train"}
    head = s3.head_object(Bucket=bucket, Key="dir/a b+c~ü.bin")
    assert head["ContentLength"] == len(body)
    assert backend_s3.get_object(Bucket=bucket, Key="dir/a b+c~ü.bin")["Body"].read() == body
    s3.delete_object(Bucket=bucket, Key="dir/a b+c~ü.bin")
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket=bucket, Key="dir/a b+c~ü.bin")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_listings_v1_and_v2(s3, bucket):
    keys = [f"train/cat/{i:03d}.jpg" for i in range(7)] + ["train/dog/1.jpg", "val/x.jpg"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    listed, token = [], None
    while True:
        kwargs = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=bucket, Prefix="train/", MaxKeys=3, **kwargs)
        assert page["KeyCount"] <= 3
        listed += [o["Key"] for o in page.get("Contents", [])]
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert listed == sorted(k for k in keys if k.startswith("train/"))
    dirs = s3.list_objects_v2(Bucket=bucket, Prefix="train/", Delimiter="/")
    assert [p["Prefix"] for p in dirs["CommonPrefixes"]] == ["train/cat/", "train/dog/"]
    v1 = s3.list_objects(Bucket=bucket, Prefix="train/cat/", MaxKeys=4)
    assert [o["Key"] for o in v1["Contents"]] == keys[:4] and v1["IsTruncated"]
    v1_rest = s3.list_objects(Bucket=bucket, Prefix="train/cat/", Marker=keys[3])
    assert [o["Key"] for o in v1_rest["Contents"]] == keys[4:7]


def test_delete_objects_and_copy(s3, bucket):
    for key in ("a", "b", "c"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode() * 10)
    s3.copy_object(Bucket=bucket, Key="a-copy", CopySource={"Bucket": bucket, "Key": "a"})
    assert s3.get_object(Bucket=bucket, Key="a-copy")["Body"].read() == b"a" * 10
    result = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "a"}, {"Key": "b"}]})
    assert sorted(d["Key"] for d in result["Deleted"]) == ["a", "b"]
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert left == ["a-copy", "c"]


def test_range_and_conditional_reads(s3, bucket):
    body = _body(10_000, 2)
    etag = s3.put_object(Bucket=bucket, Key="r", Body=body)["ETag"]
    part = s3.get_object(Bucket=bucket, Key="r", Range="bytes=100-199")
    assert part["Body"].read() == body[100:200]
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert s3.get_object(Bucket=bucket, Key="r", IfMatch=etag)["Body"].read() == body
    for kwargs, status in [
        ({"IfNoneMatch": etag}, 304),
        ({"IfMatch": '"0123"'}, 412),
        ({"IfModifiedSince": dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)}, 304),
        ({"IfUnmodifiedSince": dt.datetime(2000, 1, 1, tzinfo=dt.UTC)}, 412),
    ]:
        with pytest.raises(ClientError) as err:
            s3.get_object(Bucket=bucket, Key="r", **kwargs)
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == status, kwargs


def test_object_tagging(s3, bucket):
    s3.put_object(Bucket=bucket, Key="t", Body=b"t")
    s3.put_object_tagging(
        Bucket=bucket, Key="t", Tagging={"TagSet": [{"Key": "label", "Value": "cat"}]}
    )
    tags = s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"]
    assert tags == [{"Key": "label", "Value": "cat"}]
    s3.delete_object_tagging(Bucket=bucket, Key="t")
    assert s3.get_object_tagging(Bucket=bucket, Key="t")["TagSet"] == []


def test_multipart_upload_three_parts_with_copy_part(s3, backend_s3, bucket):
    parts_data = [_body(5 * MiB, 10), _body(5 * MiB, 11)]
    s3.put_object(Bucket=bucket, Key="src", Body=_body(5 * MiB + 123, 12))
    upload = s3.create_multipart_upload(Bucket=bucket, Key="big", ContentType="application/x-tar")
    uid = upload["UploadId"]
    listed = s3.list_multipart_uploads(Bucket=bucket)
    assert uid in [u["UploadId"] for u in listed.get("Uploads", [])]
    etags = [
        s3.upload_part(Bucket=bucket, Key="big", UploadId=uid, PartNumber=n + 1, Body=data)["ETag"]
        for n, data in enumerate(parts_data)
    ]
    copied = s3.upload_part_copy(
        Bucket=bucket,
        Key="big",
        UploadId=uid,
        PartNumber=3,
        CopySource={"Bucket": bucket, "Key": "src"},
        CopySourceRange="bytes=0-99999",
    )
    etags.append(copied["CopyPartResult"]["ETag"])
    assert [
        p["PartNumber"] for p in s3.list_parts(Bucket=bucket, Key="big", UploadId=uid)["Parts"]
    ] == [1, 2, 3]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="big",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]},
    )
    expected = b"".join(parts_data) + _body(5 * MiB + 123, 12)[:100_000]
    assert backend_s3.get_object(Bucket=bucket, Key="big")["Body"].read() == expected


def test_abort_multipart_upload(s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="gone")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="gone", UploadId=uid, PartNumber=1, Body=b"x" * 1000)
    s3.abort_multipart_upload(Bucket=bucket, Key="gone", UploadId=uid)
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert uid not in [u["UploadId"] for u in uploads]


def test_presigned_get_and_put_with_raw_http(s3, backend_s3, bucket):
    put_url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "pre/signed.bin"}, ExpiresIn=300
    )
    body = _body(300_000, 3)
    assert httpx.put(put_url, content=body).status_code == 200
    assert backend_s3.get_object(Bucket=bucket, Key="pre/signed.bin")["Body"].read() == body
    get_url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "pre/signed.bin"}, ExpiresIn=300
    )
    reply = httpx.get(get_url)
    assert reply.status_code == 200 and reply.content == body


def test_virtual_hosted_style(gateway, bucket):
    port = httpx.URL(gateway.endpoint_url).port
    client = boto3.client(
        "s3",
        endpoint_url=f"http://localhost:{port}",
        region_name="us-east-1",
        aws_access_key_id=gateway.access_key_id,
        aws_secret_access_key=gateway.secret_access_key,
        config=Config(signature_version="s3v4", s3={"addressing_style": "virtual"}),
    )
    # Resolve BUCKET.localhost to loopback without touching /etc/hosts: sign for the
    # virtual host, send to 127.0.0.1 with that Host header.
    request = client.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "vh.txt"}
    )
    url = httpx.URL(request)
    assert url.host == f"{bucket}.localhost"
    sent = httpx.put(
        url.copy_with(host="127.0.0.1"), content=b"virtual", headers={"host": url.netloc.decode()}
    )
    assert sent.status_code == 200, sent.text
    got = httpx.get(
        httpx.URL(
            client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "vh.txt"})
        ).copy_with(host="127.0.0.1"),
        headers={"host": url.netloc.decode()},
    )
    assert got.content == b"virtual"


def test_unknown_operations_are_forwarded(s3, bucket):
    # GetBucketLocation and GetBucketVersioning are not special-cased anywhere in hapi.
    assert s3.get_bucket_location(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_bucket_versioning(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_backend_errors_pass_through_as_s3_xml(s3, bucket):
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="does/not/exist")
    assert err.value.response["Error"]["Code"] == "NoSuchKey"
    with pytest.raises(ClientError) as err:
        s3.list_objects_v2(Bucket="no-such-bucket-" + os.urandom(4).hex())
    assert err.value.response["Error"]["Code"] == "NoSuchBucket"
