"""hapi.models: networks as ONNX blocks in a content-addressed registry inside the store.

Export (needs torch)::

    from hapi import models
    exported = models.export_model("resnet18", freeze=10)
    registry = models.Registry(boto3.client("s3", endpoint_url=...))
    manifest = registry.register("resnet18", exported)

Any timm or torchvision network, or any ONNX file, cut at its cut points::

    exported = models.export_hub("timm:resnet10t", weights="resnet10t.safetensors")
    exported = models.import_onnx("backbone.onnx", preset="imagenet")

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
from ._cli import UserError, cli_errors, open_registry, store_options
from ._cuts import MIN_BLOCK_SHARE, cut_points
from ._decode import (
    PendingSample,
    Sample,
    TooManySamples,
    UndecodableObject,
    decode_object,
    list_samples,
)
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
from ._hub import HUBS, RandomWeightsWarning, build_hub, export_hub
from ._import import CutPoint, describe_cuts, import_onnx
from ._layout import (
    MODELS_PREFIX,
    assemble_blocks,
    block_key,
    check_block,
    latest_key,
    manifest_key,
    model_names,
    model_prefix,
    parse_latest,
    parse_manifest_key,
)
from ._manifest import BlockInfo, ExportedBlock, ExportedModel, InputSpec, Manifest
from ._onnx import compose
from ._preprocess import PRESETS, Preset, get_preset, preprocess, preprocess_batch
from ._registry import (
    DEFAULT_BUCKET,
    Lineage,
    Registry,
    RegistryReader,
    Removal,
    check_name,
    parse_ref,
)
from ._runtime import (
    Device,
    RuntimeSettings,
    block_times,
    create_session,
    cuda_usable,
    runs_on_cuda,
)
from ._schema import (
    BlockProfile,
    BlockTime,
    Figure,
    GatewayStats,
    MemoryBudgetStats,
    ModelProfile,
    ModelSummary,
    RequestCounters,
    ServedSplit,
    Source,
    StorageLoad,
    StorageProfile,
    TenantStats,
)
from ._wire import DTYPES as WIRE_DTYPES
from ._wire import decode as decode_features
from ._wire import encode as encode_features
from ._wire import to_wire_dtype

__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_CACHE_BUCKET",
    "DEFAULT_MODEL",
    "ENTRY_PREFIX",
    "FAMILIES",
    "HUBS",
    "MIN_BLOCK_SHARE",
    "MODELS_PREFIX",
    "PRESETS",
    "WIRE_DTYPES",
    "BlockInfo",
    "BlockProfile",
    "BlockTime",
    "CacheEntry",
    "CorruptBlock",
    "CutPoint",
    "Decomposition",
    "Device",
    "ExportError",
    "ExportedBlock",
    "ExportedModel",
    "Figure",
    "GatewayStats",
    "InputSpec",
    "InvalidModelSpec",
    "Lineage",
    "Manifest",
    "MemoryBudgetStats",
    "ModelError",
    "ModelProfile",
    "ModelSummary",
    "NoSuchModel",
    "ObjectIdentity",
    "PendingSample",
    "Preset",
    "RandomWeightsWarning",
    "Registry",
    "RegistryError",
    "RegistryReader",
    "Removal",
    "RequestCounters",
    "RuntimeSettings",
    "Sample",
    "ServedSplit",
    "SessionError",
    "Source",
    "StorageLoad",
    "StorageProfile",
    "TenantStats",
    "TooManySamples",
    "UndecodableObject",
    "UserError",
    "VersionConflict",
    "assemble_blocks",
    "block_key",
    "block_prefix",
    "block_times",
    "build",
    "build_hub",
    "cache_key",
    "check_block",
    "check_name",
    "cli_errors",
    "compose",
    "create_session",
    "cuda_usable",
    "cut_points",
    "decode_features",
    "decode_object",
    "describe_cuts",
    "encode_features",
    "entry_path",
    "eviction_order",
    "export_hub",
    "export_model",
    "get_preset",
    "import_onnx",
    "is_entry",
    "latest_key",
    "list_entries",
    "list_samples",
    "manifest_key",
    "model_names",
    "model_prefix",
    "open_registry",
    "parse_latest",
    "parse_manifest_key",
    "parse_ref",
    "preprocess",
    "preprocess_batch",
    "register_default_model",
    "runs_on_cuda",
    "sample_images",
    "store_options",
    "to_wire_dtype",
]
