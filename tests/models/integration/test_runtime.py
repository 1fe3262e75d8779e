"""The onnxruntime session factory: quiet GPU probe, CPU fallback, settings."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from hapi.models import (
    ExportedModel,
    RuntimeSettings,
    SessionError,
    create_session,
    cuda_usable,
)
from hapi.models._runtime import providers
from hapi.models.testing import compose

_HAS_GPU = Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def test_probe_agrees_with_the_machine() -> None:
    if not _HAS_GPU:
        assert cuda_usable() is False
    assert providers(RuntimeSettings(device="cpu")) == ["CPUExecutionProvider"]
    assert providers(RuntimeSettings())[-1] == "CPUExecutionProvider"


def test_probe_is_quiet() -> None:
    code = "from hapi.models import cuda_usable, create_session; print(cuda_usable())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() in {"True", "False"}
    assert done.stderr == ""


@pytest.mark.skipif(_HAS_GPU, reason="the machine has a GPU")
def test_cuda_requested_without_a_gpu_fails_clearly() -> None:
    with pytest.raises(SessionError, match="no usable CUDA GPU"):
        providers(RuntimeSettings(device="cuda"))


def test_sessions_run_and_respect_thread_settings(effnet_export) -> None:
    settings = RuntimeSettings(device="cpu", intra_op_threads=1, inter_op_threads=1)
    session = create_session(effnet_export.blocks[-1].data, settings)
    assert session.get_providers() == ["CPUExecutionProvider"]
    options = session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
    out = session.run(None, {"input": np.zeros((3, 1280), np.float32)})[0]
    assert out.shape == (3, 1000)


def test_idle_threads_do_not_spin_unless_asked(effnet_export) -> None:
    """hapi decodes on the cores a batch runs on: spinning onnxruntime threads would take
    them. The outputs are the same either way."""
    block = effnet_export.blocks[-1].data
    inputs = {"input": np.random.default_rng(0).random((4, 1280), np.float32)}
    outputs = {}
    for spinning in (False, True):
        session = create_session(block, RuntimeSettings(device="cpu", spinning=spinning))
        options = session.get_session_options()
        for pool in ("intra_op", "inter_op"):
            entry = options.get_session_config_entry(f"session.{pool}.allow_spinning")
            assert entry == ("1" if spinning else "0")
        outputs[spinning] = session.run(None, inputs)[0]
    np.testing.assert_array_equal(outputs[False], outputs[True])
    assert RuntimeSettings().spinning is False


def test_invalid_graph_and_settings() -> None:
    with pytest.raises(SessionError, match="cannot load the graph"):
        create_session(b"not onnx", RuntimeSettings(device="cpu"))
    with pytest.raises(ValueError, match="device"):
        RuntimeSettings(device="tpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        RuntimeSettings(intra_op_threads=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not _HAS_GPU, reason="needs a CUDA GPU")
def test_cuda_session_when_a_gpu_is_there(resnet18_export) -> None:
    assert cuda_usable()
    session = create_session(resnet18_export.blocks[0].data, RuntimeSettings(device="cuda"))
    assert session.get_providers()[0] == "CUDAExecutionProvider"


def _blocks(exported: ExportedModel, stop: int) -> bytes:
    graph = compose([onnx.load_from_string(b.data) for b in exported.blocks[:stop]])
    return bytes(graph.SerializeToString())


def _inputs(exported: ExportedModel, size: int, seed: int) -> np.ndarray:
    shape = (size, *exported.preprocess.sample_shape)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not _HAS_GPU, reason="needs a CUDA GPU")
def test_the_gpu_path_equals_the_cpu_at_every_split(resnet18_export) -> None:
    """Sessions on the CUDA provider (TF32 off, as the gateway makes them) against the CPU
    provider, at every split of ResNet18: float32 rounding."""
    assert cuda_usable()
    batch = _inputs(resnet18_export, 8, 7)
    for stop in range(1, len(resnet18_export.blocks) + 1):
        blocks = _blocks(resnet18_export, stop)
        want = create_session(blocks, RuntimeSettings(device="cpu")).run(None, {"input": batch})[0]
        session = create_session(blocks, RuntimeSettings(device="cuda"))
        assert session.get_providers()[0] == "CUDAExecutionProvider"
        got = session.run(None, {"input": batch})[0]
        assert float(np.abs(got - want).max()) <= 1e-5 * float(np.abs(want).max()), stop
