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

import warnings

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
from ._export import DEFAULT_MODEL, export_model, register_default_model
from ._exporting import sample_images
from ._hub import export_hub
from ._import import import_onnx
from ._layout import assemble_blocks
from ._manifest import ExportedModel, Manifest
from ._names import parse_ref
from ._preprocess import DECODERS, Preset, preprocess, preprocess_batch
from ._reading import RegistryReads
from ._registry import Registry
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
    "IMAGE_EXTENSIONS",
    "CorruptBlock",
    "DaliDecoder",
    "Device",
    "ExportError",
    "ExportedModel",
    "InvalidModelSpec",
    "Manifest",
    "ModelError",
    "NoSuchModel",
    "PendingSample",
    "Preset",
    "Registry",
    "RegistryError",
    "RegistryReads",
    "RuntimeSettings",
    "Sample",
    "SessionError",
    "TooManySamples",
    "UndecodableObject",
    "VersionConflict",
    "assemble_blocks",
    "block_times",
    "create_session",
    "cuda_usable",
    "dali_available",
    "decode_object",
    "export_hub",
    "export_model",
    "import_onnx",
    "list_samples",
    "parse_ref",
    "preprocess",
    "preprocess_batch",
    "register_default_model",
    "runs_on_cuda",
    "sample_images",
    "shard_member",
]

# Names that left __all__ (used only by tests, the benchmarks or the CLI), still reachable
# here for one release: the module where each lives now.
_MOVED = {
    "PRESETS": "testing",
    "BlockInfo": "testing",
    "InputSpec": "testing",
    "check_name": "testing",
    "FAMILIES": "testing",
    "Decomposition": "testing",
    "RandomWeightsWarning": "testing",
    "build": "testing",
    "build_hub": "testing",
    "compose": "testing",
    "cut_points": "testing",
    "get_preset": "testing",
    "cli_errors": "cli",
    "open_registry": "cli",
}


def __getattr__(name: str) -> object:
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"hapi.models.{name} is deprecated; import it from hapi.models.{home}",
        DeprecationWarning,
        stacklevel=2,
    )
    if home == "testing":
        from . import testing

        return getattr(testing, name)
    from . import cli

    return getattr(cli, name)
