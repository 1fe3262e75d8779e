"""ONNX graph plumbing: canonical bytes, hashing, composition, activation profiles.

Canonical bytes make content addressing work: the same weights exported twice give the
same SHA-256. The exporter's free-form fields (producer, doc strings) are cleared and
every internal tensor name is replaced by one derived from its position, so numbering
quirks of the exporter cannot change a hash. Graph input and output are always named
``input`` and ``output``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import onnx
import onnx.compose

INPUT = "input"
OUTPUT = "output"


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def _has_subgraphs(graph: onnx.GraphProto) -> bool:
    return any(attr.type in (attr.GRAPH, attr.GRAPHS) for n in graph.node for attr in n.attribute)


def _rename_values(graph: onnx.GraphProto) -> None:
    """Rename every tensor except graph input/output by first appearance."""
    fixed = {v.name for v in graph.input} | {v.name for v in graph.output}
    initializers = {t.name for t in graph.initializer}
    names: dict[str, str] = {}

    def rename(name: str) -> str:
        if not name or name in fixed:
            return name
        if name not in names:
            names[name] = f"{'w' if name in initializers else 't'}{len(names)}"
        return names[name]

    for node in graph.node:
        node.input[:] = [rename(n) for n in node.input]
        node.output[:] = [rename(n) for n in node.output]
    for tensor in graph.initializer:
        tensor.name = rename(tensor.name)
    for info in graph.value_info:
        info.name = rename(info.name)
    graph.initializer.sort(key=lambda t: (len(t.name), t.name))


def canonical_bytes(model: onnx.ModelProto) -> bytes:
    """Clear free-form fields, rename internal tensors, serialize deterministically.

    ``model`` is modified in place. Its single input and output must already be named
    ``input`` and ``output``.
    """
    model.producer_name = "hapi"
    model.producer_version = ""
    model.doc_string = ""
    model.domain = ""
    del model.metadata_props[:]
    graph = model.graph
    graph.name = "block"
    graph.doc_string = ""
    for node in graph.node:
        node.doc_string = ""
    for value in (*graph.input, *graph.output, *graph.value_info):
        value.doc_string = ""
    if not _has_subgraphs(graph):
        _rename_values(graph)
    return bytes(model.SerializeToString(deterministic=True))


def _prefixed(block: onnx.ModelProto, index: int, last: bool) -> onnx.ModelProto:
    model = onnx.compose.add_prefix(block, f"b{index}.")
    graph = model.graph
    keep = {f"b{index}.{INPUT}": INPUT} if index == 0 else {}
    if last:
        keep[f"b{index}.{OUTPUT}"] = OUTPUT
    for value in (*graph.input, *graph.output):
        value.name = keep.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [keep.get(n, n) for n in node.input]
        node.output[:] = [keep.get(n, n) for n in node.output]
    return model


def compose(blocks: Sequence[onnx.ModelProto]) -> onnx.ModelProto:
    """Chain blocks (each ``input -> output``) into one graph ``input -> output``.

    Uses :func:`onnx.compose.merge_models`; every block's names get a ``b{i}.`` prefix
    so that identical blocks can appear twice.
    """
    if not blocks:
        raise ValueError("compose() needs at least one block")
    if len(blocks) == 1:
        return blocks[0]
    ir_version = max(block.ir_version for block in blocks)
    parts = [_prefixed(b, i, i == len(blocks) - 1) for i, b in enumerate(blocks)]
    merged = parts[0]
    for i, part in enumerate(parts[1:], start=1):
        merged.ir_version = part.ir_version = ir_version
        source = merged.graph.output[0].name
        merged = onnx.compose.merge_models(merged, part, io_map=[(source, f"b{i}.{INPUT}")])
    merged.graph.name = "composed"
    return merged


def peak_activation_bytes(model: onnx.ModelProto, sizes: Mapping[str, int]) -> int:
    """Largest sum of activations alive at once, weights and constants excluded.

    Walks the nodes in graph order; a tensor is alive from the node that produces it
    (the graph input from the start) to its last consumer (the graph output to the end).

    Args:
        model: The graph.
        sizes: Bytes of each tensor by name (tensors not listed count as zero).
    """
    graph = model.graph
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    last_use = {name: i for i, node in enumerate(graph.node) for name in node.input}
    last_use.update({v.name: len(graph.node) for v in graph.output})
    alive = {v.name for v in graph.input} - constants
    peak = sum(sizes.get(name, 0) for name in alive)
    for i, node in enumerate(graph.node):
        alive |= {name for name in node.output if name not in constants}
        peak = max(peak, sum(sizes.get(name, 0) for name in alive))
        alive = {name for name in alive if last_use.get(name, -1) > i}
    return peak


def expose_all(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose every node output is also a graph output (for profiling)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    known = {value.name for value in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in known:
                exposed.graph.output.append(onnx.ValueInfoProto(name=name))
                known.add(name)
    return exposed
