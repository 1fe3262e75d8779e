"""The CUDA provider's options, as hapi asks for them (the seam: whether CUDA is usable)."""

from __future__ import annotations

import pytest

from hapi.models import RuntimeSettings
from hapi.models import _runtime as runtime


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "cuda_usable", lambda: True)


def _cuda_options(settings: RuntimeSettings) -> dict[str, object]:
    (name, options), cpu = runtime.providers(settings)
    assert (name, cpu) == ("CUDAExecutionProvider", "CPUExecutionProvider")
    return dict(options)


def test_float32_means_float32_on_the_gpu_unless_tf32_is_allowed(gpu: None) -> None:
    # onnxruntime's CUDA provider runs float32 convolutions in TF32 unless told not to: on
    # an H100 that moved features by up to 1e-3 of their largest value from the CPU's.
    assert _cuda_options(RuntimeSettings())["use_tf32"] == "0"
    assert _cuda_options(RuntimeSettings(tf32=True))["use_tf32"] == "1"


def test_the_arena_grows_by_what_is_asked_and_respects_its_cap(gpu: None) -> None:
    options = _cuda_options(RuntimeSettings(device_id=1, gpu_mem_limit=2**30))
    assert options["arena_extend_strategy"] == "kSameAsRequested"
    assert (options["device_id"], options["gpu_mem_limit"]) == (1, 2**30)
    assert runtime.providers(RuntimeSettings(device="cpu")) == ["CPUExecutionProvider"]


def test_cudnn_picks_algorithms_by_heuristics_unless_told(gpu: None) -> None:
    # onnxruntime's own default times every algorithm for each new input shape; the
    # gateway's batches change size, and on an H200 that cut ResNet50 split 9 to about half.
    assert _cuda_options(RuntimeSettings())["cudnn_conv_algo_search"] == "HEURISTIC"
    for search in ("exhaustive", "heuristic", "default"):
        options = _cuda_options(RuntimeSettings(conv_search=search))  # type: ignore[arg-type]
        assert options["cudnn_conv_algo_search"] == search.upper()
    with pytest.raises(ValueError, match="conv_search must be"):
        RuntimeSettings(conv_search="fastest")  # type: ignore[arg-type]
