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
    "DEFAULT_MODEL",
    "FAMILIES",
    "PRESETS",
    "BlockInfo",
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
    "Preset",
    "Registry",
    "RegistryError",
    "Removal",
    "RuntimeSettings",
    "SessionError",
    "UserError",
    "VersionConflict",
    "build",
    "check_name",
    "compose",
    "create_session",
    "cuda_usable",
    "export_model",
    "get_preset",
    "parse_ref",
    "preprocess",
    "preprocess_batch",
    "register_default_model",
    "sample_images",
]
