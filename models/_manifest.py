"""Manifests: the JSON record of one model version, and what an export hands the registry.

A manifest names its blocks by SHA-256 and carries everything the gateway, the SDK and
the planner need without fetching a block: shapes, dtype, parameter count, bytes per
sample out of each block, peak activation bytes per sample and measured CPU time per
sample. Shapes are per sample; every block has a dynamic leading batch dimension.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ._errors import RegistryError
from ._preprocess import Preset

FORMAT_VERSION = 1
UNKNOWN_WEIGHTS = "unknown"  # what manifests written before the field was added read as


@dataclass(frozen=True, kw_only=True)
class BlockInfo:
    """One block of a manifest.

    Args:
        name: Human label (``stem``, ``layer1.0``, ``fc``...).
        hash: SHA-256 hex digest of the block's canonical ONNX bytes.
        size: Size of those bytes.
        input_shape: Input shape of one sample (no batch dimension).
        output_shape: Output shape of one sample.
        dtype: Element type of input and output (``float32`` or ``float16``).
        params: Number of trainable parameters of the torch block.
        output_bytes: Bytes of one sample's output.
        peak_activation_bytes: Largest sum of tensors alive at once for one sample
            (weights excluded), from ONNX shape inference and a liveness walk.
        cpu_ms: Measured onnxruntime CPU time per sample, in milliseconds, on the
            exporting machine (best of three runs of a batch of four photos).
        zeros: Share of the output's values that are exactly zero on those photos
            (what an answer in the ``zeros`` encoding leaves off the wire at the split
            after this block); ``None`` in manifests written before hapi counted them.
    """

    name: str
    hash: str
    size: int
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    dtype: str
    params: int
    output_bytes: int
    peak_activation_bytes: int
    cpu_ms: float
    zeros: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BlockInfo:
        fields = dict(data)
        fields["input_shape"] = tuple(fields["input_shape"])
        fields["output_shape"] = tuple(fields["output_shape"])
        zeros = fields.get("zeros")
        if zeros is not None and not (
            isinstance(zeros, int | float) and not isinstance(zeros, bool) and 0 <= zeros <= 1
        ):
            raise ValueError(f"block {fields.get('name')!r}: zeros must be a share in [0, 1]")
        return cls(**fields)


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    """The first block's input: name, per-sample shape, dtype and layout."""

    shape: tuple[int, ...]
    name: str = "input"
    dtype: str = "float32"
    layout: str = "NCHW"


@dataclass(frozen=True, kw_only=True)
class ExportedBlock:
    """A block's canonical ONNX bytes with its profile (``info.hash`` is their SHA-256)."""

    data: bytes
    info: BlockInfo


@dataclass(frozen=True, kw_only=True)
class ExportedModel:
    """What :func:`hapi.models.export_model` produces and :meth:`Registry.register` stores."""

    family: str
    freeze: int
    preprocess: Preset
    input: InputSpec
    blocks: tuple[ExportedBlock, ...]
    exporter: Mapping[str, str] = field(default_factory=dict)
    source: str | None = None
    weights: str = UNKNOWN_WEIGHTS


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """One immutable model version in the registry.

    Args:
        name: Model name (a valid S3 key segment).
        version: Positive integer, 1 for the first version of a name.
        family: Family the blocks came from (``custom`` for user modules).
        freeze: Blocks ``[0, freeze)`` are frozen; splits range over ``0..freeze``.
        preprocess: The preprocessing preset that produces the first block's input.
        input: The first block's input spec.
        blocks: The blocks, in order.
        parent: ``NAME@VERSION`` of the model this one was derived from, if any.
        created: ISO 8601 UTC time of registration.
        exporter: Versions of the tools that exported the blocks.
        source: Where the network came from: a family name, ``timm:NAME``,
            ``torchvision:NAME`` or ``onnx:<sha256 of the file>``; ``None`` when unknown
            (custom modules, and manifests written before hapi recorded it).
        weights: Where the weights came from: ``random(seed=N)``, ``sha256:<hex>`` of a
            weights file, a package as ``NAME==VERSION``, or ``unknown`` (user modules,
            and manifests written before hapi recorded it).
    """

    name: str
    version: int
    family: str
    freeze: int
    preprocess: Preset
    input: InputSpec
    blocks: tuple[BlockInfo, ...]
    parent: str | None = None
    created: str = ""
    exporter: Mapping[str, str] = field(default_factory=dict)
    source: str | None = None
    weights: str = UNKNOWN_WEIGHTS

    def __str__(self) -> str:
        return self.ref

    @property
    def ref(self) -> str:
        """``NAME@VERSION``."""
        return f"{self.name}@{self.version}"

    @property
    def hashes(self) -> tuple[str, ...]:
        """The block hashes, in order."""
        return tuple(block.hash for block in self.blocks)

    @property
    def size(self) -> int:
        """Total bytes of the blocks (shared blocks counted once per model)."""
        return sum(block.size for block in self.blocks)

    @property
    def zeros(self) -> tuple[float, ...] | None:
        """The frozen blocks' shares of zero values (:attr:`BlockInfo.zeros`), one a
        block; ``None`` when a block lacks one (a manifest written before hapi counted
        them)."""
        shares = [block.zeros for block in self.blocks[: self.freeze]]
        known = tuple(share for share in shares if share is not None)
        return known if len(known) == len(shares) else None

    @property
    def random_weights(self) -> bool:
        """Whether the weights are random: features that mean nothing yet."""
        return self.weights.startswith("random")

    def same_content(self, other: Manifest) -> bool:
        """Whether ``other`` is the same model: the same blocks (by hash), freeze, input,
        preprocessing, parent and weights' origin. Measured times may differ."""
        return self._content() == other._content()

    def _content(self) -> tuple[object, ...]:
        return (
            self.hashes,
            self.family,
            self.freeze,
            self.preprocess,
            self.input,
            self.parent,
            self.weights,
        )

    def to_json(self) -> str:
        """Serialize, with sorted keys and a trailing newline."""
        data = asdict(self)
        data["format"] = FORMAT_VERSION
        data["preprocess"] = self.preprocess.to_dict()
        data["exporter"] = dict(self.exporter)
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parse :meth:`to_json`'s output.

        Raises:
            RegistryError: Not a manifest this version of hapi can read.
        """
        try:
            data = json.loads(text)
            if data.pop("format") != FORMAT_VERSION:
                raise ValueError("unsupported manifest format")
            data["preprocess"] = Preset.from_dict(data["preprocess"])
            spec = data["input"]
            data["input"] = InputSpec(**{**spec, "shape": tuple(spec["shape"])})
            data["blocks"] = tuple(BlockInfo.from_dict(block) for block in data["blocks"])
            return cls(**data)
        except (ValueError, KeyError, TypeError) as exc:
            raise RegistryError(f"unreadable manifest: {exc}") from exc
