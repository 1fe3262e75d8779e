"""onnxruntime's IO binding with the output in one reused host buffer, pinned on a GPU:
the alternative to ``session.run`` that ``make bench-device`` measures.

On the H200 (docs/results.md, 2026-12-04) it lost to ``session.run`` at every early split
(ResNet50 split 4, batch 128: 799 samples/s against 2,627): copying the output out of the
pinned buffer into a new array, which the gateway needs since a batch's rows outlive the
next run, costs more than the pageable copy it saves. So the gateway and the bare loop
use ``session.run``, and this stays here, measured.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from hapi.models import SessionError

OutputMemory = Literal["cpu", "cuda_pinned"]


class _HostBuffer:
    """One reusable output buffer in host memory: page-locked (``cudaHostAlloc``) for
    ``cuda_pinned``, plain for ``cpu``; it grows to the largest batch seen."""

    def __init__(self, memory: OutputMemory) -> None:
        self._cudart: Any = _cudart() if memory == "cuda_pinned" else None
        self._pointer = ctypes.c_void_p()
        self._plain: np.ndarray | None = None
        self._bytes = 0

    def array(self, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        if 4 * size > self._bytes:
            self.free()
            if self._cudart is None:
                self._plain = np.empty(size, np.float32)
            elif self._cudart.cudaHostAlloc(ctypes.byref(self._pointer), 4 * size, 0) != 0:
                self._pointer = ctypes.c_void_p()
                raise MemoryError(f"cudaHostAlloc could not pin {4 * size} bytes for an output")
            self._bytes = 4 * size
        if self._plain is not None:
            return self._plain[:size].reshape(shape)
        raw = (ctypes.c_float * size).from_address(self._pointer.value or 0)
        return np.ctypeslib.as_array(raw).reshape(shape)

    def free(self) -> None:
        if self._cudart is not None and self._pointer.value:
            self._cudart.cudaFreeHost(self._pointer)
        self._pointer, self._plain, self._bytes = ctypes.c_void_p(), None, 0

    def __del__(self) -> None:
        self.free()


@functools.cache
def _cudart() -> Any:
    """The CUDA runtime onnxruntime's CUDA provider loaded (``cudaHostAlloc``)."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise SessionError("the CUDA runtime (libcudart) is not loadable, so no pinned outputs")


def bound_runner(
    session: ort.InferenceSession, *, output: OutputMemory
) -> Callable[[np.ndarray], np.ndarray]:
    """A batch run through onnxruntime's IO binding: the batch is bound as a host input and
    the first output is written into one reused host buffer, then copied out as a new array.

    On a CUDA session ``cuda_pinned`` makes that buffer page-locked, so the device copies
    the output at full speed, where ``session.run`` copies it into pageable memory (thought
    to bound early splits, whose outputs are megabytes a sample). ``cpu`` is the same path
    with a plain buffer (a CPU session: the tests). Runs are serialized (one buffer); the
    array returned is the caller's. An output whose shape is not fixed apart from the
    batch runs through ``session.run``.

    Raises:
        SessionError: ``cuda_pinned`` without a loadable CUDA runtime.
    """
    input_name = session.get_inputs()[0].name
    first = session.get_outputs()[0]
    fixed = first.shape[1:]
    if not all(isinstance(d, int) for d in fixed):
        return lambda batch: np.asarray(session.run(None, {input_name: batch})[0])
    buffer = _HostBuffer(output)
    lock = threading.Lock()

    def run(batch: np.ndarray) -> np.ndarray:
        batch = np.ascontiguousarray(batch, np.float32)
        with lock:
            out = buffer.array((len(batch), *fixed))
            binding = session.io_binding()
            binding.bind_cpu_input(input_name, batch)
            binding.bind_output(first.name, "cpu", 0, np.float32, out.shape, out.ctypes.data)
            session.run_with_iobinding(binding)
            return out.copy()

    return run
