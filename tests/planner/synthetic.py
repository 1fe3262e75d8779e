"""Synthetic manifests and profiles with known answers (no store, no ONNX)."""

from __future__ import annotations

from collections.abc import Sequence

from hapi.models import Manifest
from hapi.models.testing import BlockInfo, InputSpec, get_preset
from hapi.planner import Profile, profile_from_manifest

# ResNet18 at 224x224, float32, per sample (REFERENCES.md): stem, 8 residual blocks, pool.
R18_OUTPUTS = (
    802_816,
    802_816,
    802_816,
    401_408,
    401_408,
    200_704,
    200_704,
    100_352,
    100_352,
    2_048,
)
R18_CPU_MS = (3.0, 4.0, 4.0, 3.0, 3.5, 3.0, 3.5, 3.0, 3.5, 0.1)
R18_WEIGHTS = (
    38_000,
    148_000,
    148_000,
    526_000,
    590_000,
    2_100_000,
    2_400_000,
    8_400_000,
    9_400_000,
    0,
)
INPUT_BYTES = 3 * 224 * 224 * 4


def manifest(
    outputs: Sequence[int] = R18_OUTPUTS,
    cpu_ms: Sequence[float] = R18_CPU_MS,
    weights: Sequence[int] = R18_WEIGHTS,
    *,
    freeze: int | None = None,
    name: str = "synthetic",
) -> Manifest:
    """A manifest whose blocks have the given per-sample outputs, times and weights."""
    blocks = tuple(
        BlockInfo(
            name=f"block{i}",
            hash=f"{i:064x}",
            size=size,
            input_shape=(1,),
            output_shape=(out // 4,),
            dtype="float32",
            params=size // 4,
            output_bytes=out,
            peak_activation_bytes=out,
            cpu_ms=ms,
        )
        for i, (out, ms, size) in enumerate(zip(outputs, cpu_ms, weights, strict=True))
    )
    return Manifest(
        name=name,
        version=1,
        family="custom",
        freeze=len(blocks) if freeze is None else freeze,
        preprocess=get_preset("imagenet"),
        input=InputSpec(shape=(3, 224, 224)),
        blocks=blocks,
    )


def r18(**overrides: object) -> tuple[Manifest, Profile]:
    """The ResNet18-like manifest and its manifest profile, with profile overrides."""
    model = manifest()
    return model, profile_from_manifest(model, **overrides)  # type: ignore[arg-type]
