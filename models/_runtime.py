"""onnxruntime sessions, shared by the gateway and the SDK.

``onnxruntime-gpu`` lists ``CUDAExecutionProvider`` as available even on a machine
without a GPU or without the CUDA libraries, and logs an error when a session then asks
for it. So the CUDA provider is used only after a quiet probe: the CUDA driver must
report a device, and a one-node session must really land on the CUDA provider. The
answer is cached for the life of the process.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import json
import os
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from ._errors import SessionError

Device = Literal["auto", "cpu", "cuda"]
ConvSearch = Literal["exhaustive", "heuristic", "default"]
_CUDA = "CUDAExecutionProvider"
_CPU = "CPUExecutionProvider"
_ORT_DEFAULT_SEVERITY = 2  # onnxruntime's own default: warnings and above


@dataclass(frozen=True, kw_only=True)
class RuntimeSettings:
    """How sessions are created.

    Args:
        device: ``auto`` (CUDA when usable, else CPU), ``cpu``, or ``cuda`` (fail without one).
        device_id: CUDA device ordinal.
        intra_op_threads: Threads inside one operator; 0 lets onnxruntime choose.
        inter_op_threads: Threads across operators; 0 lets onnxruntime choose.
        gpu_mem_limit: Byte cap of the CUDA arena; ``None`` for no cap.
        tf32: Let the CUDA provider compute float32 convolutions and matrix products in
            TF32 (onnxruntime's own default). Off here: on an H100 it moved ResNet, VGG and
            EfficientNet features by 4e-4 to 1e-3 of their largest value from the CPU's
            (1e-6 with it off), past the 1e-4 hapi promises between pushdown and local.
        conv_search: How the CUDA provider picks each convolution's cuDNN algorithm:
            ``heuristic`` (cuDNN's heuristics, no timing), ``exhaustive`` (onnxruntime's
            own default: times every algorithm for each new input shape) or ``default``
            (one fixed algorithm). Heuristic here: the gateway's batches change size
            with its windows and tenants, so under ``exhaustive`` every new batch size
            paid a search; behind the gateway on an H200 ResNet50 split 9 ran at 330
            samples/s with ``heuristic`` against 159-190 with ``exhaustive``.
        spinning: Let onnxruntime's idle intra-op threads spin between operators
            (onnxruntime's own default). Off here: hapi decodes images on the same cores
            while a batch runs, and spinning threads took the cores the decoders needed
            (ResNet18 split 1 behind the gateway on two cores: 6.1 CPU-ms per sample with
            spinning, 4.2 without; the same outputs).
    """

    device: Device = "auto"
    device_id: int = 0
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    gpu_mem_limit: int | None = None
    tf32: bool = False
    conv_search: ConvSearch = "heuristic"
    spinning: bool = False

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.conv_search not in typing.get_args(ConvSearch):
            raise ValueError(
                f"conv_search must be {', '.join(typing.get_args(ConvSearch))}, "
                f"not {self.conv_search!r}"
            )
        if min(self.device_id, self.intra_op_threads, self.inter_op_threads) < 0:
            raise ValueError("device_id and thread counts must be >= 0")


def _driver_has_device() -> bool:
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            driver = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return False
        return count.value > 0
    return False


def _identity_model() -> bytes:
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@functools.cache
def cuda_usable() -> bool:
    """Whether onnxruntime can really run on a CUDA device here (probed once, quietly)."""
    if _CUDA not in ort.get_available_providers() or not _driver_has_device():
        return False
    with contextlib.redirect_stdout(io.StringIO()):
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
    options = ort.SessionOptions()
    options.log_severity_level = 4
    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(_identity_model(), options, providers=[_CUDA, _CPU])
        return bool(session.get_providers()[0] == _CUDA)
    except Exception:  # any failure to start CUDA means: not usable
        return False
    finally:
        ort.set_default_logger_severity(_ORT_DEFAULT_SEVERITY)


def runs_on_cuda(device: Device) -> bool:
    """Whether sessions for ``device`` land on the CUDA provider here (``cpu`` never;
    ``auto`` and ``cuda`` when it is usable)."""
    return device != "cpu" and cuda_usable()


def providers(settings: RuntimeSettings) -> list[str | tuple[str, dict[str, Any]]]:
    """The provider list for ``settings`` (CUDA first only when usable).

    Raises:
        SessionError: ``device="cuda"`` but no usable CUDA device.
    """
    use_cuda = runs_on_cuda(settings.device)
    if settings.device == "cuda" and not use_cuda:
        raise SessionError("device 'cuda' requested, but onnxruntime finds no usable CUDA GPU")
    if not use_cuda:
        return [_CPU]
    options: dict[str, Any] = {
        "device_id": settings.device_id,
        "arena_extend_strategy": "kSameAsRequested",
        "use_tf32": "1" if settings.tf32 else "0",
        "cudnn_conv_algo_search": settings.conv_search.upper(),
    }
    if settings.gpu_mem_limit is not None:
        options["gpu_mem_limit"] = settings.gpu_mem_limit
    return [(_CUDA, options), _CPU]


def create_session(
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    settings: RuntimeSettings | None = None,
    *,
    profile_prefix: str | None = None,
) -> ort.InferenceSession:
    """Create an onnxruntime session for a block or a composed graph.

    Args:
        model: An ONNX model, its serialized bytes, or a file path.
        settings: Device and thread settings; defaults when omitted.
        profile_prefix: Profile every run (onnxruntime's per-node trace) until
            ``session.end_profiling()``, which writes the trace to a file named from
            this prefix and returns its path (see :func:`block_times`).

    Raises:
        SessionError: The graph is invalid, or the requested device is unusable.
    """
    settings = settings or RuntimeSettings()
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.log_severity_level = 3
    spin = "1" if settings.spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    source: bytes | str
    if isinstance(model, onnx.ModelProto):
        source = model.SerializeToString()
    else:
        source = model if isinstance(model, bytes) else os.fspath(model)
    chosen = providers(settings)
    try:
        with _quiet_default_logger(on_cuda=chosen[0] != _CPU):
            return ort.InferenceSession(source, options, providers=chosen)
    except SessionError:
        raise
    except Exception as exc:  # onnxruntime raises its own untyped pybind errors
        raise SessionError(f"onnxruntime cannot load the graph: {exc}") from exc


@contextlib.contextmanager
def _quiet_default_logger(*, on_cuda: bool) -> Iterator[None]:
    """onnxruntime 1.31 warns "No registered plugin EP device found for
    'CUDAExecutionProvider'" through its process-wide logger at every CUDA session it
    then creates on CUDA all the same (seen on an H100); only errors pass meanwhile."""
    if not on_cuda:
        yield
        return
    ort.set_default_logger_severity(3)
    try:
        yield
    finally:
        ort.set_default_logger_severity(_ORT_DEFAULT_SEVERITY)


def block_times(trace_path: str | os.PathLike[str], blocks: int) -> tuple[float, ...]:
    """Per-block kernel microseconds from an onnxruntime profile of a composed graph.

    :func:`hapi.models.compose` prefixes every block's node names with ``b{i}.``, and
    onnxruntime keeps that prefix on the nodes it fuses; the few nodes it adds itself
    (layout reorders) are left out. The trace file is read, not removed.
    """
    with open(trace_path) as trace:
        events = json.load(trace)
    times = [0.0] * blocks
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        index = _block_index(name)
        if index is not None and index < blocks:
            times[index] += float(event.get("dur", 0))
    return tuple(times)


def _block_index(node: str) -> int | None:
    head, dot, _ = node.partition(".")
    if not dot or not head.startswith("b") or not head[1:].isdigit():
        return None
    return int(head[1:])
