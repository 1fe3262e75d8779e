"""The internal buckets belong to operators: who may touch the registry and the cache.

Through the gateway, only an admin key may write the registry bucket, and only an admin
key may touch the cache bucket at all (a raw entry holds features of objects the caller
may not be allowed to read). Ordinary clients and anonymous callers keep reading the
registry: the SDK runs blocks from it, ``hapi plan`` and ``hapi models ls`` read manifests.

The check runs once per request, on every path into a bucket: the request's own bucket
(path-style or virtual-hosted, signed, presigned or unsigned, pass-through or pushdown)
and the source of a copy (``x-amz-copy-source``, for CopyObject and UploadPartCopy). A form
upload is a write to its bucket. Everything else the store's own permissions decide, since
each request acts upstream as its caller's identity.
"""

from __future__ import annotations

from collections.abc import Set
from urllib.parse import unquote

from .._errors import AccessDenied
from .._identities import Caller
from .._settings import GatewaySettings

# Methods that only read; a POST ?hapi-batch is a pushdown read as well.
_READS = frozenset({"GET", "HEAD", "OPTIONS"})
COPY_SOURCE = "x-amz-copy-source"  # the header naming a copy's source


def check_access(
    caller: Caller,
    settings: GatewaySettings,
    *,
    method: str,
    bucket: str,
    query_names: Set[str],
    copy_source: str | None = None,
) -> None:
    """Refuse a request that reaches an internal bucket its caller may not reach.

    Args:
        caller: Who sent it.
        settings: Which buckets are the registry and the cache.
        method: The HTTP method.
        bucket: The bucket it addresses ("" for the service: ListBuckets).
        query_names: Its query parameters' names.
        copy_source: Its ``x-amz-copy-source`` header, if it has one.

    Raises:
        AccessDenied: A client reaches the cache bucket, or writes the registry.
    """
    if caller.is_admin:
        return
    reads = method in _READS or (method == "POST" and "hapi-batch" in query_names)
    _check_bucket(settings, bucket, writes=not reads)
    if copy_source is not None:
        _check_bucket(settings, copy_source_bucket(copy_source), writes=False)


def check_form_upload(caller: Caller, settings: GatewaySettings, bucket: str) -> None:
    """Refuse a form upload (a write) into an internal bucket by a client.

    Raises:
        AccessDenied: The caller is not an admin and ``bucket`` is internal.
    """
    if not caller.is_admin:
        _check_bucket(settings, bucket, writes=True)


def _check_bucket(settings: GatewaySettings, bucket: str, *, writes: bool) -> None:
    if bucket == settings.cache_bucket:
        raise AccessDenied(
            f"The feature cache bucket {bucket!r} is reserved for admin keys of this gateway.",
            resource=f"/{bucket}",
        )
    if writes and bucket == settings.registry_bucket:
        raise AccessDenied(
            f"The model registry bucket {bucket!r} is written by admin keys of this gateway "
            "only; clients may read it.",
            resource=f"/{bucket}",
        )


def copy_source_bucket(source: str) -> str:
    """The bucket of an ``x-amz-copy-source`` value (``/bucket/key`` or ``bucket/key``,
    URL-encoded, perhaps with ``?versionId=``)."""
    path = unquote(source.split("?", 1)[0]).lstrip("/")
    return path.split("/", 1)[0]
