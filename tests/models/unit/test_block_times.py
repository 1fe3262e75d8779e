"""Per-block times from onnxruntime's profile of a composed graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hapi.models import RuntimeSettings, block_times, create_session
from hapi.models.testing import compose

WIDTH, ROWS = 512, 256
"""The blocks' width and a batch's rows: a matmul of 33M multiply-adds, milliseconds of
kernel time, so that one preemption of the test (a loaded machine) cannot make one matmul
look as long as six; at 256 wide and 32 rows each kernel took tens of microseconds, and
a profile once gave the two blocks 0.50 and 0.50."""


def _block(size: int, repeats: int) -> onnx.ModelProto:
    """``input [N, size] -> output [N, size]``: ``repeats`` matmuls with a weight."""
    weight = numpy_helper.from_array(np.eye(size, dtype=np.float32), "w")
    names = ["input", *(f"h{i}" for i in range(repeats - 1)), "output"]
    nodes = [
        helper.make_node("MatMul", [names[i], "w"], [names[i + 1]], name=f"mm{i}")
        for i in range(repeats)
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", size])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_composed_graphs_profile_is_divided_by_block(tmp_path: Path) -> None:
    graph = compose([_block(WIDTH, 1), _block(WIDTH, 6)])
    settings = RuntimeSettings(device="cpu", intra_op_threads=1)
    session = create_session(graph, settings, profile_prefix=str(tmp_path / "trace"))
    batch = np.ones((ROWS, WIDTH), np.float32)
    for _ in range(3):
        session.run(None, {"input": batch})
    path = session.end_profiling()
    first, second = block_times(path, 2)
    assert first > 0 and second > 0
    assert second > first  # six matmuls against one
    assert block_times(path, 1) == (first,)  # blocks past the count are left out
    # Profiling has ended: the session keeps serving.
    assert session.run(None, {"input": batch})[0].shape == (ROWS, WIDTH)
