"""The IO-binding run that ``make bench-device`` measures against ``session.run``."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hapi.models import RuntimeSettings, create_session
from hapi_bench.micro._iobinding import bound_runner


def _conv(channels: int, *, fixed: bool = True) -> bytes:
    """A real graph: one 3x3 convolution and a ReLU, any batch size."""
    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array(
        rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), "w"
    )
    size: list[int | str] = [8, 8] if fixed else ["h", "w"]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["output"]),
        ],
        "conv",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, *size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", channels, *size])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@pytest.mark.parametrize("fixed", [True, False])
def test_it_returns_what_session_run_does_and_each_answer_is_the_callers(fixed: bool) -> None:
    """The same features as ``session.run`` at batch sizes that grow and shrink the reused
    buffer, and no answer changed by a later run into that buffer (a shape that is not
    fixed apart from the batch goes through ``session.run`` itself)."""
    session = create_session(_conv(5, fixed=fixed), RuntimeSettings(device="cpu"))
    run = bound_runner(session, output="cpu")
    rng = np.random.default_rng(11)
    answers = []
    for size in (3, 1, 7, 2):
        batch = rng.standard_normal((size, 3, 8, 8)).astype(np.float32)
        got = run(batch)
        np.testing.assert_array_equal(got, session.run(None, {"input": batch})[0])
        answers.append((got, got.copy()))
    for got, kept in answers:
        np.testing.assert_array_equal(got, kept)
