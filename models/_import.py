"""Import any ONNX graph: cut it into blocks at its cut points, verify, profile.

The graph must take one image batch (NCHW, float32, dynamic batch dimension) and give
one tensor. Its blocks come from :mod:`hapi.models._cuts` (the cut points, tiny blocks
merged) or from the tensors the caller names. Each block is verified on real photos
against the original graph's own intermediate tensor at that boundary (exposed as an
extra output), and the composed blocks against the original output, with the same
relative tolerance as :func:`hapi.models.export_model`. A torch reference, where there is
one (``timm:`` and ``torchvision:`` exports), is checked against the original graph too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx.external_data_helper import uses_external_data
from PIL import Image
from tqdm import tqdm

from hapi.protocol import share_of_zeros

from ._cuts import (
    MIN_BLOCK_SHARE,
    Segment,
    Shapes,
    choose_boundaries,
    cut_points,
    extract,
    graph_input,
    infer_shapes,
    measure_shapes,
)
from ._errors import ExportError, InvalidModelSpec
from ._exporting import (
    _check,
    _first_line,
    _peak_bytes,
    _time_per_sample_ms,
    sample_images,
)
from ._manifest import BlockInfo, ExportedBlock, ExportedModel, InputSpec
from ._onnx import INPUT, canonical_bytes, compose, sha256
from ._preprocess import Preset, get_preset, preprocess_batch
from ._runtime import RuntimeSettings, create_session

Reference = Callable[[np.ndarray], np.ndarray]
_VERIFY_BATCH = 4
_ORIGINAL = "the original graph"


def read_onnx(path: str | Path) -> tuple[onnx.ModelProto, str]:
    """Load an ONNX file; return it with the SHA-256 of its bytes.

    Raises:
        InvalidModelSpec: Missing or not an ONNX model.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidModelSpec(f"ONNX file not found: {path}")
    data = path.read_bytes()
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf raises its own types
        raise InvalidModelSpec(f"{path} is not a valid ONNX model: {_first_line(exc)}") from exc
    if any(uses_external_data(tensor) for tensor in model.graph.initializer):
        raise InvalidModelSpec(
            f"{path} keeps its weights in external data files; save it as one file "
            "(onnx.save_model(model, path, save_as_external_data=False))"
        )
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise InvalidModelSpec(f"{path} is not a valid ONNX model: {_first_line(exc)}") from exc
    return model, sha256(data)


def _check_graph(model: onnx.ModelProto, preset: Preset) -> None:
    _check_input(graph_input(model.graph), preset)
    output = model.graph.output[0]
    if output.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        kind = onnx.helper.tensor_dtype_to_np_dtype(output.type.tensor_type.elem_type)
        raise InvalidModelSpec(
            f"output {output.name!r} is {kind}, not float32: blocks must give floating-point "
            "features (end the graph before an argmax or a cast)"
        )


def _check_input(value: onnx.ValueInfoProto, preset: Preset) -> None:
    tensor = value.type.tensor_type
    if tensor.elem_type != onnx.TensorProto.FLOAT:
        raise InvalidModelSpec(f"input {value.name!r} must be float32 (an NCHW image batch)")
    dims = list(tensor.shape.dim)
    if len(dims) != 4:
        raise InvalidModelSpec(f"input {value.name!r} must be NCHW, not {len(dims)}-dimensional")
    if dims[0].HasField("dim_value"):
        raise InvalidModelSpec(
            f"input {value.name!r} has a fixed batch size {dims[0].dim_value}; "
            "export the graph with a dynamic batch dimension"
        )
    for dim, want in zip(dims[1:], preset.sample_shape, strict=True):
        if dim.HasField("dim_value") and dim.dim_value != want:
            shape = "x".join(str(d.dim_value or d.dim_param or "?") for d in dims[1:])
            raise InvalidModelSpec(
                f"input {value.name!r} is {shape} per sample, but preset {preset.name} "
                f"gives {'x'.join(map(str, preset.sample_shape))}; choose another --preset"
            )


def _boundary_values(
    model: onnx.ModelProto, parts: Sequence[Segment], batch: np.ndarray
) -> dict[str, np.ndarray]:
    """The original graph's tensor at every boundary, on the verification batch."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    wanted = [part.output for part in parts]
    known = {value.name for value in exposed.graph.output}
    exposed.graph.output.extend(onnx.ValueInfoProto(name=n) for n in wanted if n not in known)
    session = create_session(exposed, RuntimeSettings(device="cpu"))
    try:
        values = session.run(wanted, {graph_input(model.graph).name: batch})
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ExportError(f"onnxruntime cannot run the graph: {_first_line(exc)}") from exc
    found = dict(zip(wanted, values, strict=True))
    found[parts[0].input] = batch
    return found


def _measured(model: onnx.ModelProto, batch: np.ndarray) -> Shapes:
    try:
        return measure_shapes(model, batch)
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ExportError(f"onnxruntime cannot run the graph: {_first_line(exc)}") from exc


def _params(graph: onnx.ModelProto) -> int:
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    return sum(int(np.prod(t.dims)) for t in graph.graph.initializer if t.data_type in floats)


def _block(
    index: int,
    part: Segment,
    graph: onnx.ModelProto,
    seen: dict[str, np.ndarray],
    settings: RuntimeSettings,
) -> ExportedBlock:
    label = f"block {index} ({part.name})"
    data = canonical_bytes(graph)
    inputs, want = seen[part.input], seen[part.output]
    session = create_session(data, settings)
    try:
        got = session.run(None, {INPUT: inputs})[0]
    except Exception as exc:  # onnxruntime raises its own exception types
        raise ExportError(f"{label}: onnxruntime cannot run it: {_first_line(exc)}") from exc
    _check(label, got, want, fp16=False, against=_ORIGINAL)
    info = BlockInfo(
        name=part.name,
        hash=sha256(data),
        size=len(data),
        input_shape=tuple(inputs.shape[1:]),
        output_shape=tuple(want.shape[1:]),
        dtype="float32",
        params=_params(graph),
        output_bytes=int(want[0].nbytes),
        peak_activation_bytes=_peak_bytes(data, inputs[:1], settings),
        cpu_ms=round(_time_per_sample_ms(session, inputs), 4),
        zeros=round(share_of_zeros(got), 4),
    )
    return ExportedBlock(data=data, info=info)


def _verify_composed(blocks: Sequence[ExportedBlock], batch: np.ndarray, want: np.ndarray) -> None:
    composed = compose([onnx.load_from_string(block.data) for block in blocks])
    got = create_session(composed, RuntimeSettings(device="cpu")).run(None, {INPUT: batch})[0]
    _check("composition of all blocks", got, want, fp16=False, against=_ORIGINAL)


def _photo_batch(images: Sequence[Image.Image] | None, preset: Preset) -> np.ndarray:
    photos = list(images) if images is not None else sample_images()
    if not photos:
        raise InvalidModelSpec("import needs at least one image to verify with")
    photos = (photos * _VERIFY_BATCH)[: max(len(photos), _VERIFY_BATCH)]
    return preprocess_batch(photos, preset)


def blocks_from_onnx(
    model: onnx.ModelProto,
    *,
    family: str,
    source: str,
    preset: str | Preset = "imagenet",
    freeze: int | None = None,
    cut_at: Sequence[str] = (),
    min_share: float = MIN_BLOCK_SHARE,
    images: Sequence[Image.Image] | None = None,
    reference: Reference | None = None,
    runtime: RuntimeSettings | None = None,
    exporter: dict[str, str] | None = None,
    progress: bool = False,
) -> ExportedModel:
    """Cut an ONNX graph into verified, profiled blocks, ready to register.

    Args:
        model: The graph (one NCHW float32 input with a dynamic batch, one output).
        family: Recorded as the manifest's family (``onnx``, ``timm``, ``torchvision``).
        source: Recorded as the manifest's source (``onnx:<sha256>``, ``timm:NAME``...).
        preset: Preprocessing that produces the graph's input.
        freeze: Freeze point; all blocks when omitted.
        cut_at: Tensor names to cut at instead of the automatic choice.
        min_share: Smallest share of the graph's FLOPs a block may hold (automatic cuts).
        images: Real images to verify with; scikit-image's sample photos when omitted.
        reference: The original network (numpy batch in, output out), if there is one.
        runtime: onnxruntime thread settings; verification and timing run on the CPU.
        exporter: Tool versions to record.
        progress: Show a progress bar (one step per block) on stderr.

    Raises:
        InvalidModelSpec: The graph does not fit (inputs, shapes, names), or bad freeze.
        ExportError: A block, the composition or the graph disagrees with the reference.
    """
    chosen = preset if isinstance(preset, Preset) else get_preset(preset)
    _check_graph(model, chosen)
    inferred = infer_shapes(model)
    batch = _photo_batch(images, chosen)
    shapes = _measured(inferred, batch)
    parts = choose_boundaries(inferred, shapes, cut_at, min_share)
    freeze = len(parts) if freeze is None else freeze
    if not 1 <= freeze <= len(parts):
        raise InvalidModelSpec(f"freeze {freeze} is out of range: choose 1..{len(parts)}")
    seen = _boundary_values(inferred, parts, batch)
    final = seen[parts[-1].output]
    if reference is not None:
        _check("the whole graph", final, reference(batch), fp16=False)
    settings = dataclasses.replace(runtime or RuntimeSettings(), device="cpu")
    graphs = extract(inferred, parts)
    with tqdm(total=len(parts), disable=not progress, desc=source[:40], unit="block") as bar:
        blocks = []
        for i, (part, graph) in enumerate(zip(parts, graphs, strict=True)):
            blocks.append(_block(i, part, graph, seen, settings))
            bar.update(1)
    _verify_composed(blocks, batch, final)
    return ExportedModel(
        family=family,
        source=source,
        freeze=freeze,
        preprocess=chosen,
        input=InputSpec(shape=tuple(batch.shape[1:])),
        blocks=tuple(blocks),
        exporter={"onnx": onnx.__version__, **(exporter or {})},
    )


def import_onnx(
    path: str | Path,
    *,
    preset: str | Preset = "imagenet",
    freeze: int | None = None,
    cut_at: Sequence[str] = (),
    images: Sequence[Image.Image] | None = None,
    runtime: RuntimeSettings | None = None,
    progress: bool = False,
) -> ExportedModel:
    """Import an ONNX file: find its cut points, extract and verify the blocks.

    The manifest's source becomes ``onnx:<sha256 of the file>``.

    Args:
        path: The ``.onnx`` file (one NCHW float32 input with a dynamic batch, one output).
        preset: Preprocessing preset that produces the graph's input.
        freeze: Freeze point; the whole graph when omitted.
        cut_at: Cut exactly at these tensors (names in the graph) instead of choosing.
        images: Real images to verify with; scikit-image's sample photos when omitted.
        runtime: onnxruntime thread settings for verification and timing.
        progress: Show a progress bar on stderr.

    Returns:
        The blocks, ready for :meth:`Registry.register`.

    Raises:
        InvalidModelSpec: Unreadable file, unsupported graph, unknown cut tensor, bad freeze.
        ExportError: The blocks do not reproduce the graph.
    """
    model, digest = read_onnx(path)
    exported = blocks_from_onnx(
        model,
        family="onnx",
        source=f"onnx:{digest}",
        preset=preset,
        freeze=freeze,
        cut_at=cut_at,
        images=images,
        runtime=runtime,
        progress=progress,
    )
    # the weights are the file's own: its digest says which they are
    return dataclasses.replace(exported, weights=f"sha256:{digest}")


@dataclasses.dataclass(frozen=True)
class CutPoint:
    """One cut point of a graph, as ``hapi models cuts`` lists it.

    Args:
        tensor: The tensor's name in the graph (what ``--cut-at`` takes).
        shape: Its shape for one sample.
        share: The share of the graph's estimated FLOPs since the previous cut point.
        chosen: Whether the automatic choice (tiny blocks merged) cuts here.
    """

    tensor: str
    shape: tuple[int, ...]
    share: float
    chosen: bool


def describe_cuts(
    path: str | Path,
    *,
    preset: str | Preset = "imagenet",
    images: Sequence[Image.Image] | None = None,
) -> list[CutPoint]:
    """Every cut point of an ONNX file, and which ones :func:`import_onnx` would choose.

    Raises:
        InvalidModelSpec: Unreadable file or unsupported graph.
        ExportError: onnxruntime cannot run the graph.
    """
    model, _ = read_onnx(path)
    chosen_preset = preset if isinstance(preset, Preset) else get_preset(preset)
    _check_graph(model, chosen_preset)
    inferred = infer_shapes(model)
    shapes = _measured(inferred, _photo_batch(images, chosen_preset)[:1])
    every = choose_boundaries(inferred, shapes, cut_points(model))
    chosen = {part.output for part in choose_boundaries(inferred, shapes)}
    total = max(1, sum(part.flops for part in every))
    return [
        CutPoint(part.output, shapes[part.output][1:], part.flops / total, part.output in chosen)
        for part in every[:-1]
    ]
