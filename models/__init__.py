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

from ._cli import cli_errors, open_registry
from ._cuts import cut_points
from ._dali import DaliDecoder, dali_available
from ._decode import (
    IMAGE_EXTENSIONS,
    PendingSample,
    Sample,
    TooManySamples,
    UndecodableObject,
    decode_object,
    list_samples,
    shard_member,
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
from ._hub import RandomWeightsWarning, build_hub, export_hub
from ._import import import_onnx
from ._layout import assemble_blocks
from ._manifest import BlockInfo, ExportedModel, InputSpec, Manifest
from ._onnx import compose
from ._preprocess import DECODERS, PRESETS, Preset, get_preset, preprocess, preprocess_batch
from ._registry import (
    Registry,
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

__all__ = [
    "DECODERS",
    "DEFAULT_MODEL",
    "FAMILIES",
    "IMAGE_EXTENSIONS",
    "PRESETS",
    "BlockInfo",
    "CorruptBlock",
    "DaliDecoder",
    "Decomposition",
    "Device",
    "ExportError",
    "ExportedModel",
    "InputSpec",
    "InvalidModelSpec",
    "Manifest",
    "ModelError",
    "NoSuchModel",
    "PendingSample",
    "Preset",
    "RandomWeightsWarning",
    "Registry",
    "RegistryError",
    "RuntimeSettings",
    "Sample",
    "SessionError",
    "TooManySamples",
    "UndecodableObject",
    "VersionConflict",
    "assemble_blocks",
    "block_times",
    "build",
    "build_hub",
    "check_name",
    "cli_errors",
    "compose",
    "create_session",
    "cuda_usable",
    "cut_points",
    "dali_available",
    "decode_object",
    "export_hub",
    "export_model",
    "get_preset",
    "import_onnx",
    "list_samples",
    "open_registry",
    "parse_ref",
    "preprocess",
    "preprocess_batch",
    "register_default_model",
    "runs_on_cuda",
    "sample_images",
    "shard_member",
]
