"""What exporting from torch and importing ONNX share: the sample photos to verify on, torch
to ONNX, checking a block against torch, and timing it; imported by both, importing neither.
"""

from __future__ import annotations

import importlib.util
import io
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import onnx
from PIL import Image

from ._errors import ExportError
from ._onnx import INPUT, OUTPUT, expose_all, peak_activation_bytes
from ._runtime import RuntimeSettings, create_session

if TYPE_CHECKING:
    import torch
    from torch import nn

OPSET = 18
# Verification limits relative to the output's largest magnitude (at least 1): a float32
# block whose activations reach hundreds (BatchNorm statistics calibrated on photos)
# differs from torch by ~1e-4 in absolute terms, yet only by ~1e-7 relative to them.
FP32_TOLERANCE = 1e-4
FP16_TOLERANCE = 1e-2
SAMPLE_PHOTOS = ("chelsea.png", "astronaut.png", "coffee.png", "rocket.jpg")
_TIMING_RUNS = 3


def sample_images() -> list[Image.Image]:
    """scikit-image's bundled sample photos (a cat, an astronaut, coffee, a rocket).

    Read straight from the installed package's data folder: no download, no skimage import.

    Raises:
        ExportError: scikit-image is not installed.
    """
    spec = importlib.util.find_spec("skimage")
    if spec is None or spec.origin is None:
        raise ExportError("export needs real images: install scikit-image or pass images=")
    folder = Path(spec.origin).parent / "data"
    images = []
    for name in SAMPLE_PHOTOS:
        with Image.open(folder / name) as image:
            images.append(image.convert("RGB"))
    return images


@dataclass(frozen=True)
class _Probe:
    """One block's torch input and output on the verification batch."""

    inputs: torch.Tensor
    outputs: torch.Tensor


@contextmanager
def _export_mode() -> Iterator[None]:
    import torch

    # The TorchScript exporter announces its own deprecation, and tracing warns about
    # Python values it records as constants; the batch-size check in _export_block
    # catches the cases where such a constant would matter. MultiheadAttention's fast
    # path (taken under no_grad) calls an operator that has no ONNX symbolic.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # type: ignore[attr-defined]
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def _to_onnx(block: nn.Module, sample: torch.Tensor) -> onnx.ModelProto:
    import torch

    buffer = io.BytesIO()
    with _export_mode():
        torch.onnx.export(
            block,
            (sample,),
            cast(Any, buffer),  # the annotation says path, a file object works too
            dynamo=False,
            opset_version=OPSET,
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
            do_constant_folding=True,
        )
    return onnx.load_from_string(buffer.getvalue())


def _check(
    name: str, got: np.ndarray, want: np.ndarray, fp16: bool, against: str = "torch"
) -> None:
    want32 = want.astype(np.float32)
    if got.shape != want.shape:
        raise ExportError(f"{name}: onnxruntime gives shape {got.shape}, {against} {want.shape}")
    diff = float(np.max(np.abs(got.astype(np.float32) - want32))) if got.size else 0.0
    peak = max(1.0, float(np.max(np.abs(want32)))) if want.size else 1.0
    tolerance = FP16_TOLERANCE if fp16 else FP32_TOLERANCE
    limit = tolerance * peak
    if not diff <= limit:
        raise ExportError(
            f"{name}: onnxruntime differs from {against} by {diff:.3g} > {limit:.3g} "
            f"({tolerance:.0e} relative to the largest output magnitude {peak:.3g})"
        )


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _time_per_sample_ms(session: object, batch: np.ndarray) -> float:
    run = session.run  # type: ignore[attr-defined]
    best = float("inf")
    for _ in range(_TIMING_RUNS):
        start = time.perf_counter()
        run(None, {INPUT: batch})
        best = min(best, time.perf_counter() - start)
    return best * 1000.0 / len(batch)


def _peak_bytes(data: bytes, sample: np.ndarray, settings: RuntimeSettings) -> int:
    """Peak activation bytes for one sample, from the tensors onnxruntime really produces."""
    graph = onnx.load_from_string(data)
    session = create_session(expose_all(graph), settings)
    names = [output.name for output in session.get_outputs()]
    values = session.run(names, {INPUT: sample})
    sizes = {name: value.nbytes for name, value in zip(names, values, strict=True)}
    return peak_activation_bytes(graph, {**sizes, INPUT: sample.nbytes})


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ExportError("exporting needs torch: pip install 'hapi[torch]'") from exc
    return torch
