"""The error tree of ``hapi.models``.

::

    ModelError                       base of everything raised here
    ├── NoSuchModel (LookupError)    no manifest for NAME or NAME@VERSION
    ├── InvalidModelSpec (ValueError)
    │                                bad input: unknown family, freeze out of range,
    │                                invalid name, unusable weights, unknown preset
    ├── ExportError                  a module does not export, or ONNX disagrees with torch
    ├── CorruptBlock                 a stored block's bytes do not match its hash
    ├── SessionError                 onnxruntime cannot run a graph on the requested device
    └── RegistryError                the object store failed or holds something unexpected
        └── VersionConflict          another writer registered the same version first

Third-party errors (botocore, onnx, torch) are wrapped where they enter, with
``raise ... from exc``, so callers (the gateway's one error handler, the CLI) translate
exactly this tree.
"""

from __future__ import annotations


class ModelError(Exception):
    """Base class of every error raised by ``hapi.models``."""


class NoSuchModel(ModelError, LookupError):
    """The registry holds no manifest for the requested model or version.

    Args:
        ref: The reference as the caller wrote it (``NAME`` or ``NAME@VERSION``).
    """

    def __init__(self, ref: str, detail: str = "") -> None:
        message = f"no such model: {ref}" + (f" ({detail})" if detail else "")
        super().__init__(message)
        self.ref = ref


class InvalidModelSpec(ModelError, ValueError):
    """The caller asked for something that cannot be exported or registered."""


class ExportError(ModelError):
    """A block failed to export to ONNX, or its ONNX output disagrees with torch."""


class CorruptBlock(ModelError):
    """A block fetched from the store does not hash to the digest its manifest names.

    Args:
        model: ``NAME@VERSION`` of the manifest being loaded.
        index: Position of the block in that manifest.
        expected: The SHA-256 hex digest the manifest records.
        actual: The SHA-256 hex digest of the bytes actually read (or ``"missing"``).
    """

    def __init__(self, model: str, index: int, expected: str, actual: str) -> None:
        super().__init__(
            f"corrupt block {index} of {model}: blocks/sha256/{expected}.onnx "
            f"hashes to {actual}; re-register the model to repair it"
        )
        self.model = model
        self.index = index
        self.expected = expected
        self.actual = actual


class SessionError(ModelError):
    """onnxruntime cannot create a session: an invalid graph, or no usable requested device."""


class RegistryError(ModelError):
    """The object store failed, or holds something the registry cannot read."""


class VersionConflict(RegistryError):
    """Another writer created the same ``NAME@VERSION`` first."""
