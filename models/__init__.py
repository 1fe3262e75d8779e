"""hapi.models: networks as ONNX blocks in a content-addressed registry inside the store.

Export (needs torch)::

    from hapi import models
    exported = models.export_model("resnet18", freeze=10)
    registry = models.Registry(boto3.client("s3", endpoint_url=...))
    manifest = registry.register("resnet18", exported)

Run (no torch needed; what the gateway and the SDK do)::

    graph = registry.load_blocks(manifest, 0, split)
    session = models.create_session(graph, models.RuntimeSettings())
    features = session.run(None, {"input": models.preprocess_batch(images, manifest.preprocess)})
"""

from __future__ import annotations

from ._cache import (
    DEFAULT_CACHE_BUCKET,
    ENTRY_PREFIX,
    CacheEntry,
    ObjectIdentity,
    block_prefix,
    cache_key,
    entry_path,
    eviction_order,
    is_entry,
    list_entries,
)
from ._cli import UserError
from ._errors import (
    CorruptBlock,
    ExportError,
    InvalidModelSpec,
    ModelError,
    NoSuchModel,
    RegistryError,
    SessionError,
    VersionConflict,
)
from ._export import DEFAULT_MODEL, export_model, register_default_model, sample_images
from ._families import FAMILIES, Decomposition, build
from ._manifest import BlockInfo, ExportedBlock, ExportedModel, InputSpec, Manifest
from ._onnx import compose
from ._preprocess import PRESETS, Preset, get_preset, preprocess, preprocess_batch
from ._registry import DEFAULT_BUCKET, Lineage, Registry, Removal, check_name, parse_ref
from ._runtime import RuntimeSettings, create_session, cuda_usable

__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_CACHE_BUCKET",
    "DEFAULT_MODEL",
    "ENTRY_PREFIX",
    "FAMILIES",
    "PRESETS",
    "BlockInfo",
    "CacheEntry",
    "CorruptBlock",
    "Decomposition",
    "ExportError",
    "ExportedBlock",
    "ExportedModel",
    "InputSpec",
    "InvalidModelSpec",
    "Lineage",
    "Manifest",
    "ModelError",
    "NoSuchModel",
    "ObjectIdentity",
    "Preset",
    "Registry",
    "RegistryError",
    "Removal",
    "RuntimeSettings",
    "SessionError",
    "UserError",
    "VersionConflict",
    "block_prefix",
    "build",
    "cache_key",
    "check_name",
    "compose",
    "create_session",
    "cuda_usable",
    "entry_path",
    "eviction_order",
    "export_model",
    "get_preset",
    "is_entry",
    "list_entries",
    "parse_ref",
    "preprocess",
    "preprocess_batch",
    "register_default_model",
    "sample_images",
]
