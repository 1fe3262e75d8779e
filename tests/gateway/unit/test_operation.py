"""One reading of a request: the S3 operation it is, and the upstream request made of it.

The property that matters: whatever the raw request, either it is refused, or the request
the gateway sends upstream reads as the very same operation (same name, bucket, key, query
and copy source) when it is parsed again, so a store that parses it sees what the access
decision saw.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hapi.gateway._errors import (
    InvalidArgument,
    InvalidBucketName,
    InvalidRequest,
    MethodNotAllowed,
    S3Error,
)
from hapi.gateway._operation import S3Operation, parse_operation

DOMAINS = ("localhost",)


def _parse(
    method: str, target: str, headers: list[tuple[str, str]] | None = None, host: str = "gw"
) -> S3Operation:
    path, _, query = target.partition("?")
    return parse_operation(method, path, query, [("host", host), *(headers or [])], DOMAINS)


@pytest.mark.parametrize(
    ("method", "target", "headers", "name"),
    [
        ("GET", "/", [], "ListBuckets"),
        ("GET", "/data", [], "ListObjects"),
        ("GET", "/data?list-type=2&prefix=a", [], "ListObjectsV2"),
        ("POST", "/data?delete", [], "DeleteObjects"),
        ("POST", "/data?%64elete", [], "DeleteObjects"),
        ("POST", "/data?hapi-batch", [], "HapiBatch"),
        ("POST", "/data", [], "PostObject"),
        ("GET", "/data/k", [], "GetObject"),
        ("GET", "/data/k?hapi-model=r18&hapi-split=3", [], "GetFeatures"),
        ("GET", "/data/k", [("x-hapi-model", "r18")], "GetFeatures"),
        ("PUT", "/data/k", [("x-amz-copy-source", "/src/a")], "CopyObject"),
        ("PUT", "/data/k?partNumber=1&uploadId=u", [], "UploadPart"),
        (
            "PUT",
            "/data/k?partNumber=1&uploadId=u",
            [("x-amz-copy-source", "src/a")],
            "UploadPartCopy",
        ),
        ("POST", "/data/k?uploads", [], "CreateMultipartUpload"),
        ("DELETE", "/data/k?uploadId=u", [], "AbortMultipartUpload"),
        ("PUT", "/data/k?tagging", [], "PutObjectTagging"),
        ("DELETE", "/data?policy", [], "DeleteBucketPolicy"),
        ("OPTIONS", "/data/k", [], "OptionsObject"),
    ],
)
def test_each_request_is_named_as_the_s3_operation_it_is(method, target, headers, name):
    assert _parse(method, target, headers).name == name


def test_virtual_hosted_addressing_names_the_bucket_from_the_host():
    operation = _parse("GET", "/a/b.jpg", host="photos.localhost:8080")
    assert (operation.bucket, operation.key, operation.virtual_host) == ("photos", "a/b.jpg", True)
    assert operation.upstream_path() == "/photos/a/b.jpg"


@pytest.mark.parametrize(
    ("method", "target", "headers", "error"),
    [
        ("POST", "/hapi-models%2F?delete", [], InvalidBucketName),
        ("GET", "/hapi-models%2f/k", [], InvalidBucketName),
        ("GET", "//hapi-models/k", [], InvalidBucketName),
        ("GET", "/Hapi-Models/k", [], InvalidBucketName),
        ("GET", "/hapi-models./k", [], InvalidBucketName),
        ("GET", "/../k", [], InvalidBucketName),
        ("GET", "/192.168.1.1/k", [], InvalidBucketName),
        ("PUT", "/data/a/../b", [], InvalidRequest),
        ("PUT", "/data/%2E%2E/b", [], InvalidRequest),
        ("GET", "/data/k?versionId=1&versionId=2", [], InvalidRequest),
        ("POST", "/data?delete&tagging", [], InvalidRequest),
        ("POST", "/data?delete&hapi-batch", [], InvalidRequest),
        ("POST", "/data/k?delete&hapi-batch", [], InvalidRequest),
        ("POST", "/data/k?delete", [], MethodNotAllowed),
        ("PATCH", "/data/k", [], MethodNotAllowed),
        ("PUT", "/data/k", [("x-hapi-model", "r18")], InvalidRequest),
        ("HEAD", "/data/k?hapi-model=r18", [], InvalidRequest),
        ("GET", "/data/k?hapi-model=a", [("x-hapi-model", "b")], InvalidRequest),
        (
            "PUT",
            "/data/k",
            [("x-amz-copy-source", "/a/b"), ("x-amz-copy-source", "/c/d")],
            InvalidRequest,
        ),
        ("PUT", "/data/k", [("x-amz-copy-source", "/cache/e?versionId=null&x=")], InvalidArgument),
        ("PUT", "/data/k", [("x-amz-copy-source", "/Cache/e")], InvalidBucketName),
        ("PUT", "/data/k", [("x-amz-copy-source", "/c%2E%2E/e")], InvalidBucketName),
        ("PUT", "/data/k", [("x-amz-copy-source", "/cache/%2E%2E/e")], InvalidArgument),
        ("GET", "/data/k", [("x-amz-copy-source", "/cache/e")], InvalidRequest),
        ("GET", "/data/k", [("x-amz-date", "1"), ("x-amz-date", "2")], InvalidRequest),
        ("GET", "/data/k", [("host", "other")], InvalidRequest),
    ],
)
def test_a_request_that_reads_two_ways_is_refused(method, target, headers, error):
    with pytest.raises(error):
        _parse(method, target, headers)


def test_a_copy_source_is_sent_encoded_anew():
    headers = [("x-amz-copy-source", "src%2Fa%20b/c?versionId=v%201")]
    operation = _parse("PUT", "/data/k", headers)
    assert operation.copy_source is not None
    assert (operation.copy_source.bucket, operation.copy_source.key) == ("src", "a b/c")
    assert operation.copy_source.header == "/src/a%20b/c?versionId=v%201"


# -- the property --------------------------------------------------------------------------

PIECES = [*"abcz09.-_/%2FfE~+ ?&=é", "%2F", "%2E", "%25", "..", "%C3%A9", "%FF"]
SEGMENT = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)
BUCKETS = st.sampled_from(["data", "hapi-models", "hapi-cache", "a.b-c", "photos"])
QUERY_NAMES = st.sampled_from(
    ["delete", "%64elete", "tagging", "uploads", "uploadId", "versionId", "list-type",
     "prefix", "hapi-batch", "hapi-model", "x-id", "acl", "Delete", "select"]
)  # fmt: skip


@st.composite
def raw_requests(draw: st.DrawFn) -> tuple[str, str, str, list[tuple[str, str]]]:
    method = draw(st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD", "OPTIONS"]))
    bucket = draw(BUCKETS)
    spelled = "".join(f"%{ord(c):02X}" if draw(st.booleans()) and c != "/" else c for c in bucket)
    path = "/" + spelled + draw(st.sampled_from(["", "/", "%2F", "//"])) + draw(SEGMENT)
    pairs = draw(st.lists(st.tuples(QUERY_NAMES, SEGMENT), max_size=3))
    query = "&".join(f"{n}={v}" if v else n for n, v in pairs)
    headers = [("host", "gw")]
    if draw(st.booleans()):
        headers.append(("x-amz-copy-source", draw(BUCKETS) + "/" + draw(SEGMENT)))
    return method, path, query, headers


@settings(max_examples=1500, deadline=None)
@given(raw_requests())
def test_the_upstream_request_reads_as_the_same_operation(raw):
    method, path, query, headers = raw
    try:
        first = parse_operation(method, path, query, headers, DOMAINS)
    except S3Error:
        return  # refused: nothing goes upstream
    upstream_headers = [("host", "store")]
    if first.copy_source is not None:
        upstream_headers.append(("x-amz-copy-source", first.copy_source.header))
    if first.hapi:
        return  # pushdown: served by the gateway, never forwarded
    again = parse_operation(
        method, first.upstream_path(), first.upstream_query(), upstream_headers, ()
    )
    assert (again.name, again.bucket, again.key) == (first.name, first.bucket, first.key)
    assert again.copy_source == first.copy_source
    presign = {"X-Amz-Signature", "Signature"}
    assert sorted(again.query) == sorted(p for p in first.query if p[0] not in presign)
    assert "/" not in first.bucket and first.bucket == first.bucket.lower()
