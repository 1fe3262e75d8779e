"""Name the S3 operation of a request, for metrics and access logs.

The names follow the S3 API reference (``GetObject``, ``ListObjectsV2``, ...); anything
unrecognised is still forwarded and counted as ``Unknown``.
"""

from __future__ import annotations

from collections.abc import Collection

_BUCKET_SUBRESOURCES = {
    "uploads": {"GET": "ListMultipartUploads"},
    "delete": {"POST": "DeleteObjects"},
    "tagging": {
        "GET": "GetBucketTagging",
        "PUT": "PutBucketTagging",
        "DELETE": "DeleteBucketTagging",
    },
    "location": {"GET": "GetBucketLocation"},
    "versioning": {"GET": "GetBucketVersioning", "PUT": "PutBucketVersioning"},
    "policy": {"GET": "GetBucketPolicy", "PUT": "PutBucketPolicy", "DELETE": "DeleteBucketPolicy"},
    "acl": {"GET": "GetBucketAcl", "PUT": "PutBucketAcl"},
    "cors": {"GET": "GetBucketCors", "PUT": "PutBucketCors", "DELETE": "DeleteBucketCors"},
    "lifecycle": {"GET": "GetBucketLifecycle", "PUT": "PutBucketLifecycle"},
    "versions": {"GET": "ListObjectVersions"},
    "hapi-batch": {"POST": "HapiBatch"},
}
_OBJECT_SUBRESOURCES = {
    "tagging": {
        "GET": "GetObjectTagging",
        "PUT": "PutObjectTagging",
        "DELETE": "DeleteObjectTagging",
    },
    "acl": {"GET": "GetObjectAcl", "PUT": "PutObjectAcl"},
    "uploads": {"POST": "CreateMultipartUpload"},
    "attributes": {"GET": "GetObjectAttributes"},
}
_BUCKET = {
    "GET": "ListObjects",
    "PUT": "CreateBucket",
    "DELETE": "DeleteBucket",
    "HEAD": "HeadBucket",
    "POST": "PostObject",  # a browser form upload
    "OPTIONS": "OptionsObject",  # a CORS preflight
}
_OBJECT = {
    "GET": "GetObject",
    "PUT": "PutObject",
    "DELETE": "DeleteObject",
    "HEAD": "HeadObject",
    "OPTIONS": "OptionsObject",
}


def classify(
    method: str, bucket: str, key: str, query: Collection[str], headers: Collection[str]
) -> str:
    """Return the S3 operation name.

    Args:
        method: HTTP method.
        bucket: Bucket name, empty for the service endpoint.
        key: Object key, empty for bucket-level requests.
        query: Names of the query parameters present.
        headers: Lowercase names of the headers present.
    """
    if not bucket:
        return "ListBuckets" if method == "GET" else "Unknown"
    if not key:
        for name, ops in _BUCKET_SUBRESOURCES.items():
            if name in query and method in ops:
                return ops[method]
        if method == "GET" and query and "list-type" in query:
            return "ListObjectsV2"
        return _BUCKET.get(method, "Unknown")
    return _classify_object(method, query, headers)


def _classify_object(method: str, query: Collection[str], headers: Collection[str]) -> str:
    for name, ops in _OBJECT_SUBRESOURCES.items():
        if name in query and method in ops:
            return ops[method]
    if "uploadId" in query:
        if method == "PUT":
            return "UploadPartCopy" if "x-amz-copy-source" in headers else "UploadPart"
        return {"POST": "CompleteMultipartUpload", "DELETE": "AbortMultipartUpload"}.get(
            method, "ListParts"
        )
    if method == "PUT" and "x-amz-copy-source" in headers:
        return "CopyObject"
    if method == "GET" and ("x-hapi-model" in headers or "hapi-model" in query):
        return "GetFeatures"
    return _OBJECT.get(method, "Unknown")
