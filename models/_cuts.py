"""Cut points of an ONNX graph, and the blocks between them.

A **cut point** is a place in the graph's (topological) node order where exactly one
tensor carries all the state from the nodes before to the nodes after: every other
tensor produced so far is dead or constant. Initializers, ``Constant`` nodes and
anything computed from constants alone do not count as state; a block that needs them
gets its own copy. In a ResNet the cut points are the tensors between residual blocks
(inside one, the skip connection is alive too); in a transformer, between encoder
layers and between each layer's attention and MLP halves; in a plain chain of layers,
after every layer. The order searched is the one the graph is stored in (ONNX requires
a topological one; exporters write nodes in execution order).

Cutting at every cut point gives many tiny blocks (a ReLU, a Flatten), whose boundaries
are not worth a split: they save no compute and, next to their neighbour, no bytes. So
tiny blocks are merged, by this rule:

* A block is *tiny* when it holds less than ``MIN_BLOCK_SHARE`` (1 %) of the graph's
  estimated FLOPs: multiply-accumulates of Conv, ConvTranspose, MatMul and Gemm, plus
  one per output element of every other node, from the tensor shapes onnxruntime
  computes for one sample.
* The tiniest block is merged first, with the neighbour across the *larger* of its two
  boundary tensors (the previous one on a tie), so the smaller tensor stays a boundary:
  it is the cheaper one to send over the network. Repeat until no block is tiny.
* The last block is never merged away, however cheap: it is the head (a classifier),
  and the boundary before it carries the pooled features, the split most worth having.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeAlias

import numpy as np
import onnx
import onnx.shape_inference
import onnx.utils

from ._errors import InvalidModelSpec
from ._onnx import INPUT, OUTPUT, expose_all
from ._runtime import RuntimeSettings, create_session

MIN_BLOCK_SHARE = 0.01
Shapes: TypeAlias = Mapping[str, tuple[int, ...]]
_FLOAT = onnx.TensorProto.FLOAT
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
_MAC_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}


@dataclass(frozen=True)
class Segment:
    """Nodes ``[start, stop)`` of the stateful node list, from one cut tensor to the next.

    Args:
        start: Index of the first node (constant nodes not counted).
        stop: One past the last node.
        input: The tensor entering the segment (the graph input for the first).
        output: The tensor leaving it (the graph output for the last).
        flops: Estimated FLOPs per sample.
        name: A label from the nodes' module scopes (``layer1.0``) or ``block{i}``.
    """

    start: int
    stop: int
    input: str
    output: str
    flops: int
    name: str


def graph_input(graph: onnx.GraphProto) -> onnx.ValueInfoProto:
    """The graph's one real input (initializers listed as inputs do not count).

    Raises:
        InvalidModelSpec: The graph takes more or fewer than one input, or gives more
            or fewer than one output.
    """
    initializers = {t.name for t in graph.initializer}
    inputs = [v for v in graph.input if v.name not in initializers]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise InvalidModelSpec(
            f"the graph has {len(inputs)} inputs and {len(graph.output)} outputs; "
            "hapi needs one image input and one output"
        )
    first: onnx.ValueInfoProto = inputs[0]
    return first


def _subgraph_names(node: onnx.NodeProto) -> Iterator[str]:
    """Every tensor name a node's subgraphs (If, Loop, Scan) read from the outer scope."""
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == attribute.GRAPH else list(attribute.graphs)
        for graph in graphs:
            for inner in graph.node:
                yield from inner.input
                yield from _subgraph_names(inner)


def _inputs(node: onnx.NodeProto) -> list[str]:
    return [name for name in (*node.input, *_subgraph_names(node)) if name]


def constant_tensors(graph: onnx.GraphProto) -> set[str]:
    """Initializers, and the outputs of nodes computed from constants alone."""
    constants = {t.name for t in graph.initializer}
    for node in graph.node:
        inputs = _inputs(node)
        if node.op_type == "Constant" or (inputs and all(n in constants for n in inputs)):
            constants.update(name for name in node.output if name)
    return constants


def stateful_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes that depend on the input, in graph order."""
    constants = constant_tensors(graph)
    return [n for n in graph.node if any(o and o not in constants for o in n.output)]


def find_cut_points(graph: onnx.GraphProto) -> list[tuple[int, str]]:
    """Every ``(position, tensor)``: before stateful node ``position`` only ``tensor`` is alive.

    Positions run over :func:`stateful_nodes`; the graph's input and output are not listed.
    """
    constants = constant_tensors(graph)
    nodes = stateful_nodes(graph)
    final = {v.name for v in graph.output}
    last_use: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in _inputs(node):
            last_use[name] = index
    last_use.update(dict.fromkeys(final, len(nodes)))
    alive = {graph_input(graph).name}
    cuts: list[tuple[int, str]] = []
    seen = set(alive)  # the input, and each tensor once (nodes whose outputs die leave it alone)
    for index, node in enumerate(nodes):
        if len(alive) == 1 and not alive <= seen:
            cuts.append((index, next(iter(alive))))
            seen |= alive
        alive |= {o for o in node.output if o and o not in constants}
        alive = {name for name in alive if last_use.get(name, -1) > index}
    return cuts


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the shapes and types of its intermediate tensors filled in."""
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        raise InvalidModelSpec(f"ONNX shape inference fails: {exc}") from exc


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    graph = model.graph
    values = (*graph.input, *graph.output, *graph.value_info)
    return {v.name: v.type.tensor_type.elem_type for v in values}


def measure_shapes(model: onnx.ModelProto, sample: np.ndarray) -> Shapes:
    """Every tensor's shape for one sample, as onnxruntime really computes it.

    Shape inference loses sizes that the graph computes from its dynamic batch
    dimension (a ``Reshape`` to ``[N, C, H*W]``); running the graph does not.
    """
    exposed = expose_all(model)
    session = create_session(exposed, RuntimeSettings(device="cpu"))
    names = [output.name for output in session.get_outputs()]
    values = session.run(names, {graph_input(model.graph).name: sample[:1]})
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    shapes.update({n: tuple(v.shape) for n, v in zip(names, values, strict=True)})
    shapes[graph_input(model.graph).name] = tuple(sample[:1].shape)
    return shapes


def _numel(shapes: Shapes, name: str) -> int:
    return math.prod(shapes.get(name, ()))


def _node_flops(node: onnx.NodeProto, shapes: Shapes) -> int:
    out = _numel(shapes, node.output[0]) if node.output else 0
    if node.op_type not in _MAC_OPS or len(node.input) < 2:
        return out
    weight = shapes.get(node.input[1], ())
    if node.op_type == "Conv":
        return out * math.prod(weight[1:])
    if node.op_type == "ConvTranspose":
        return _numel(shapes, node.input[0]) * math.prod(weight[1:])
    first = shapes.get(node.input[0], ())
    trans_a = any(a.name == "transA" and a.i for a in node.attribute)
    inner = (first[0] if trans_a else first[-1]) if first else 1
    return out * inner


def _scope(node: onnx.NodeProto) -> list[str]:
    """The module path in a torch-exported node name, ``/layer1/layer1.0/conv1/Conv``.

    torch writes each level qualified by its parent (``layer1``, ``layer1.0``): those
    fold into one segment, giving ``["layer1.0", "conv1"]``.
    """
    path: list[str] = []
    for part in node.name.split("/")[:-1]:
        if path and part.startswith(path[-1] + "."):
            path[-1] = part
        elif part:
            path.append(part)
    return path


def _label(nodes: Sequence[onnx.NodeProto], index: int) -> str:
    scopes = [scope for scope in map(_scope, nodes) if scope]
    if not scopes:
        return f"block{index}"
    common: list[str] = []
    for parts in zip(*scopes, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    if common:
        return ".".join(common)
    first, last = scopes[0][0], scopes[-1][0]
    return f"{first}..{last}"


def segments(
    model: onnx.ModelProto, boundaries: Sequence[tuple[int, str]], shapes: Shapes
) -> list[Segment]:
    """The segments between ``boundaries`` (cut points, in order), with their FLOPs."""
    graph = model.graph
    nodes = stateful_nodes(graph)
    edges = [(0, graph_input(graph).name), *boundaries, (len(nodes), graph.output[0].name)]
    found = []
    for index, ((start, first), (stop, last)) in enumerate(itertools.pairwise(edges)):
        part = nodes[start:stop]
        flops = sum(_node_flops(node, shapes) for node in part)
        found.append(Segment(start, stop, first, last, flops, _label(part, index)))
    return found


def _merge(a: Segment, b: Segment, nodes: Sequence[onnx.NodeProto], index: int) -> Segment:
    return replace(
        a,
        stop=b.stop,
        output=b.output,
        flops=a.flops + b.flops,
        name=_label(nodes[a.start : b.stop], index),
    )


def merge_tiny(
    model: onnx.ModelProto,
    found: Sequence[Segment],
    shapes: Shapes,
    min_share: float = MIN_BLOCK_SHARE,
) -> list[Segment]:
    """Merge tiny segments into a neighbour, by the rule in the module docstring."""
    blocks = list(found)
    nodes = stateful_nodes(model.graph)
    limit = min_share * sum(block.flops for block in blocks)
    while len(blocks) > 1:
        tiny = [i for i in range(len(blocks) - 1) if blocks[i].flops < limit]
        if not tiny:
            break
        i = min(tiny, key=lambda k: (blocks[k].flops, k))
        before = _numel(shapes, blocks[i].input) if i > 0 else -1
        after = _numel(shapes, blocks[i].output)
        j = i - 1 if before >= after else i
        blocks[j : j + 2] = [_merge(blocks[j], blocks[j + 1], nodes, j)]
    return blocks


def choose_boundaries(
    model: onnx.ModelProto,
    shapes: Shapes,
    cut_at: Sequence[str] = (),
    min_share: float = MIN_BLOCK_SHARE,
) -> list[Segment]:
    """The blocks of a shape-inferred model: at the tensors named, else merged cut points.

    ``shapes`` are the tensors' measured shapes (:func:`measure_shapes`).

    Raises:
        InvalidModelSpec: A name in ``cut_at`` is not a cut point (the message lists some).
    """
    cuts = _float_cuts(model)
    if not cut_at:
        return _numbered(merge_tiny(model, segments(model, cuts, shapes), shapes, min_share))
    positions = {name: position for position, name in cuts}
    unknown = [name for name in cut_at if name not in positions]
    if unknown:
        examples = ", ".join(name for _, name in cuts[:8]) or "none"
        raise InvalidModelSpec(
            f"{unknown[0]!r} is not a cut point of the graph (a tensor that alone carries "
            f"the state forward); there are {len(cuts)}: {examples}"
            + (", ..." if len(cuts) > 8 else "")
        )
    chosen = sorted({(positions[name], name) for name in cut_at})
    return _numbered(segments(model, chosen, shapes))


def _numbered(parts: Sequence[Segment]) -> list[Segment]:
    """Tell apart blocks of one module (a transformer layer's attention and MLP halves)."""
    counts = Counter(part.name for part in parts)
    seen: Counter[str] = Counter()
    named = []
    for part in parts:
        seen[part.name] += 1
        suffix = f"#{seen[part.name]}" if counts[part.name] > 1 else ""
        named.append(replace(part, name=part.name + suffix))
    return named


def _float_cuts(model: onnx.ModelProto) -> list[tuple[int, str]]:
    types = _elem_types(model)
    found = find_cut_points(model.graph)
    return [(at, name) for at, name in found if types.get(name, _FLOAT) in _FLOAT_TYPES]


def cut_points(model: onnx.ModelProto) -> list[str]:
    """The names of a graph's cut points, in order, before tiny blocks are merged.

    Only floating-point tensors count: a lone shape or index tensor is no boundary.

    Raises:
        InvalidModelSpec: The graph has not exactly one input and one output, or its
            shapes cannot be inferred.
    """
    return [name for _, name in _float_cuts(infer_shapes(model))]


def extract(model: onnx.ModelProto, parts: Sequence[Segment]) -> list[onnx.ModelProto]:
    """Each segment as its own graph ``input -> output`` with a dynamic batch dimension.

    ``model`` must be shape-inferred, so that every boundary tensor has a type.
    """
    extractor = onnx.utils.Extractor(model)
    graphs = []
    for part in parts:
        try:
            block = extractor.extract_model([part.input], [part.output])
        except (ValueError, KeyError) as exc:
            raise InvalidModelSpec(f"cannot extract block {part.name}: {exc}") from exc
        _rename(block.graph, {part.input: INPUT, part.output: OUTPUT})
        graphs.append(block)
    return graphs


def _rename(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    for value in (*graph.input, *graph.output):
        value.name = names.get(value.name, value.name)
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_param = "batch"
