"""The internal buckets belong to operators: who may touch the registry and the cache.

Through the gateway, only an admin key may write the registry bucket, and only an admin
key may touch the cache bucket at all (a raw entry holds features of objects the caller
may not be allowed to read). Ordinary clients and anonymous callers keep reading the
registry: the SDK runs blocks from it, ``hapi plan`` and ``hapi models ls`` read manifests.

The check runs once per request, on the operation it was parsed into (:mod:`._operation`):
its bucket (path-style or virtual-hosted, signed, presigned or unsigned, pass-through or
pushdown) and the source of a copy (CopyObject and UploadPartCopy). Every forwarded
request that is not a GET, HEAD or OPTIONS counts as a write; a form upload is a write to
its bucket. Everything else the store's own permissions decide, since each request acts
upstream as its caller's identity.
"""

from __future__ import annotations

from ._errors import AccessDenied
from ._identities import Caller
from ._operation import S3Operation
from ._settings import GatewaySettings


def check_access(caller: Caller, settings: GatewaySettings, operation: S3Operation) -> None:
    """Refuse an operation that reaches an internal bucket its caller may not reach.

    Args:
        caller: Who sent it.
        settings: Which buckets are the registry and the cache.
        operation: The request, as parsed once at the edge: its bucket, whether it reads or
            writes, and the bucket a copy reads.

    Raises:
        AccessDenied: A client reaches the cache bucket, or writes the registry.
    """
    if caller.is_admin:
        return
    _check_bucket(settings, operation.bucket, writes=operation.access == "write")
    if operation.copy_source is not None:
        _check_bucket(settings, operation.copy_source.bucket, writes=False)


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
