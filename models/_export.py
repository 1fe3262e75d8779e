"""Export a decomposed network block by block to ONNX, verified against torch.

Each block becomes its own ONNX graph (``input -> output``, dynamic batch dimension) with
torch's TorchScript-based exporter (``dynamo=False``: it needs no extra packages and takes
a fraction of a second per block; the dynamo exporter needs ``onnxscript``). Every block
is traced with a batch of two and checked with a batch of four real, preprocessed photos
(scikit-image's samples unless the caller brings images), so a batch size baked into the
graph cannot slip through. onnxruntime must agree with torch within 1e-4 (float32) or
1e-2 (float16) of the block output's largest magnitude (at least 1), so trained networks
with large activations verify as tightly, relatively, as small ones. Blocks must return
one floating-point tensor. torch is imported inside the functions only.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnx
from PIL import Image

from hapi.protocol import DEFAULT_REGISTRY_BUCKET, share_of_zeros

from ._errors import ExportError, InvalidModelSpec, NoSuchModel
from ._exporting import (
    OPSET,
    _check,
    _first_line,
    _import_torch,
    _peak_bytes,
    _Probe,
    _time_per_sample_ms,
    _to_onnx,
    sample_images,
)
from ._families import FAMILIES, Decomposition, WeightsArg, build
from ._manifest import BlockInfo, ExportedBlock, ExportedModel, InputSpec, Manifest
from ._onnx import INPUT, canonical_bytes, sha256
from ._preprocess import preprocess_batch
from ._registry import Registry
from ._runtime import RuntimeSettings, create_session

if TYPE_CHECKING:
    import torch
    from torch import nn

_TRACE_BATCH = 2


def _export_block(
    index: int, name: str, block: nn.Module, probe: _Probe, settings: RuntimeSettings
) -> ExportedBlock:
    import torch

    label = f"{index} ({name})"
    fp16 = probe.inputs.dtype == torch.float16
    try:
        graph = _to_onnx(block, probe.inputs[:_TRACE_BATCH])
    except Exception as exc:  # torch raises many error types for untraceable modules
        raise ExportError(f"block {label} does not export to ONNX: {_first_line(exc)}") from exc
    data = canonical_bytes(graph)
    batch = probe.inputs.numpy()
    session = create_session(data, settings)
    try:
        got = session.run(None, {INPUT: batch})[0]
    except Exception as exc:  # e.g. a batch size the trace baked into a Reshape
        raise ExportError(f"block {label}: onnxruntime cannot run it: {_first_line(exc)}") from exc
    _check(f"block {label}", got, probe.outputs.numpy(), fp16)
    output = probe.outputs
    info = BlockInfo(
        name=name,
        hash=sha256(data),
        size=len(data),
        input_shape=tuple(probe.inputs.shape[1:]),
        output_shape=tuple(output.shape[1:]),
        dtype="float16" if fp16 else "float32",
        params=sum(p.numel() for p in block.parameters()),
        output_bytes=output[0].numel() * output.element_size(),
        peak_activation_bytes=_peak_bytes(data, batch[:1], settings),
        cpu_ms=round(_time_per_sample_ms(session, batch), 4),
        zeros=round(share_of_zeros(got), 4),
    )
    return ExportedBlock(data=data, info=info)


def _run_torch(label: str, block: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    import torch

    try:
        with torch.no_grad():
            outputs = block(inputs.clone())  # a clone: a block may work in place
    except Exception as exc:  # a user's module can raise anything
        raise ExportError(f"block {label} fails in torch: {_first_line(exc)}") from exc
    if not isinstance(outputs, torch.Tensor):
        raise ExportError(f"block {label} must return one tensor, not {type(outputs).__name__}")
    if not outputs.is_floating_point():
        dtype = str(outputs.dtype).removeprefix("torch.")
        raise ExportError(
            f"block {label} returns {dtype} values; blocks must return floating-point "
            "features (end the network before an argmax or a cast)"
        )
    return outputs


def _blocks_for(decomposition: Decomposition, fp16: bool) -> list[nn.Module]:
    if not fp16:
        return list(decomposition.blocks)
    return [copy.deepcopy(block).half().eval() for block in decomposition.blocks]


def _export_blocks(
    decomposition: Decomposition, first: torch.Tensor, settings: RuntimeSettings, progress: bool
) -> tuple[ExportedBlock, ...]:
    import torch
    from tqdm import tqdm

    exported = []
    current = first
    blocks = _blocks_for(decomposition, first.dtype == torch.float16)
    with tqdm(
        total=len(blocks), disable=not progress, desc=f"export {decomposition.family}", unit="block"
    ) as bar:
        for index, (name, block) in enumerate(zip(decomposition.names, blocks, strict=True)):
            outputs = _run_torch(f"{index} ({name})", block, current)
            probe = _Probe(inputs=current, outputs=outputs)
            exported.append(_export_block(index, name, block, probe, settings))
            current = outputs
            bar.update(1)
    return tuple(exported)


def export_model(
    model: str | Decomposition,
    *,
    freeze: int | None = None,
    weights: WeightsArg = None,
    fp16: bool = False,
    images: Sequence[Image.Image] | None = None,
    progress: bool = False,
    runtime: RuntimeSettings | None = None,
) -> ExportedModel:
    """Export every block of a network to verified, canonical ONNX.

    Args:
        model: A family name (see :data:`FAMILIES`), ``timm:NAME`` or
            ``torchvision:NAME`` (cut automatically, see :func:`export_hub`), or a
            :class:`Decomposition` (``Decomposition.custom(...)`` for your own modules).
        freeze: Freeze point recorded in the manifest; the family default when omitted.
        weights: State dict or weights file for a name (ignored for a decomposition).
        fp16: Export half-precision blocks.
        images: Real images to verify with (at least one); scikit-image's sample photos
            when omitted.
        progress: Show a progress bar on stderr.
        runtime: onnxruntime thread settings for verification and timing; both always
            run on the CPU, so that ``cpu_ms`` means what it says.

    Returns:
        The blocks' bytes and profiles, ready for :meth:`Registry.register`.

    Raises:
        InvalidModelSpec: Unknown family, bad weights, or freeze out of range.
        ExportError: A block does not export, or onnxruntime disagrees with torch.
    """
    if isinstance(model, str) and ":" in model:
        from ._hub import export_hub

        if fp16:
            raise InvalidModelSpec("fp16 export is for families and custom decompositions")
        return export_hub(model, weights=weights, freeze=freeze, images=images, runtime=runtime)
    torch = _import_torch()
    decomposition = model if isinstance(model, Decomposition) else build(model, weights=weights)
    freeze = decomposition.check_freeze(decomposition.freeze if freeze is None else freeze)
    photos = list(images) if images is not None else sample_images()
    if not photos:
        raise InvalidModelSpec("export needs at least one image to verify with")
    # Verify with more samples than the trace saw, so a baked-in batch size shows.
    photos = (photos * (_TRACE_BATCH + 1))[: max(len(photos), _TRACE_BATCH + 1)]
    batch = torch.from_numpy(preprocess_batch(photos, decomposition.preset))
    first = batch.half() if fp16 else batch
    settings = dataclasses.replace(runtime or RuntimeSettings(), device="cpu")
    return ExportedModel(
        family=decomposition.family,
        freeze=freeze,
        preprocess=decomposition.preset,
        input=InputSpec(shape=tuple(batch.shape[1:]), dtype="float16" if fp16 else "float32"),
        blocks=_export_blocks(decomposition, first, settings, progress),
        exporter={"torch": torch.__version__, "onnx": onnx.__version__, "opset": str(OPSET)},
        source=decomposition.family if decomposition.family in FAMILIES else None,
        weights=decomposition.weights,
    )


DEFAULT_MODEL = "efficientnet_lite0"


def register_default_model(
    client: Any, bucket: str = DEFAULT_REGISTRY_BUCKET, *, progress: bool = False
) -> Manifest:
    """Export and register EfficientNet-Lite0 (real ImageNet weights) unless it is there.

    ``hapi up`` calls this on first start; it takes a few seconds on two CPU cores.

    Args:
        client: A boto3 S3 client for the store.
        bucket: The registry bucket.
        progress: Show a progress bar while exporting.

    Returns:
        The manifest of the registered (or already present) model.
    """
    registry = Registry(client, bucket)
    try:
        return registry.get_manifest(DEFAULT_MODEL)
    except NoSuchModel:
        pass
    return registry.register(DEFAULT_MODEL, export_model(DEFAULT_MODEL, progress=progress))
