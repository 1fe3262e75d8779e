"""Feature tensors on the wire: safetensors, with float16 and bfloat16 as well as float32.

The format (https://huggingface.co/docs/safetensors) is an 8-byte little-endian header
length, a JSON header naming each tensor's dtype, shape and byte range, then the raw
little-endian bytes. numpy has no bfloat16, so it is written here by hand: the upper 16
bits of each float32, rounded to nearest even. Shared by the gateway (encode) and the SDK
(decode), which is why it lives in the lowest layer.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._errors import InvalidValue

DTYPES = ("float32", "float16", "bfloat16")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes of one value of each wire dtype."""
CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
"""The safetensors name of each wire dtype."""
_CODES = {**CODES, "int64": "I64", "uint8": "U8"}
_NUMPY = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "U8": np.uint8}


def to_wire_dtype(array: np.ndarray, dtype: str) -> tuple[str, bytes]:
    """Convert a float32 array to ``dtype``; returns the safetensors code and the bytes.

    Raises:
        InvalidValue: ``dtype`` is not one of :data:`DTYPES`.
    """
    if dtype == "float32":
        return "F32", np.ascontiguousarray(array, dtype="<f4").tobytes()
    if dtype == "float16":
        return "F16", np.ascontiguousarray(array, dtype="<f2").tobytes()
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(array, dtype="<f4").view("<u4")
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
        return "BF16", rounded.astype("<u2").tobytes()
    raise InvalidValue(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")


def encode(
    features: np.ndarray,
    *,
    dtype: str = "float32",
    labels: np.ndarray | None = None,
    metadata: Mapping[str, str] | None = None,
) -> bytes:
    """Serialize features (and labels) as safetensors.

    Args:
        features: float32 array ``[N, ...]``.
        dtype: Wire dtype of ``features``.
        labels: Optional int64 array ``[N]``.
        metadata: String-to-string ``__metadata__``.
    """
    tensors: list[tuple[str, str, tuple[int, ...], bytes]] = []
    code, data = to_wire_dtype(features, dtype)
    tensors.append(("features", code, tuple(features.shape), data))
    if labels is not None:
        tensors.append(
            ("labels", "I64", tuple(labels.shape), np.ascontiguousarray(labels, "<i8").tobytes())
        )
    layout = [(name, code, shape, len(data)) for name, code, shape, data in tensors]
    return header(layout, metadata) + b"".join(t[3] for t in tensors)


def header(
    tensors: Sequence[tuple[str, str, Sequence[int], int]], metadata: Mapping[str, str] | None
) -> bytes:
    """The safetensors header, length prefix included, of tensors laid out in order.

    Written once for :func:`encode` and for a gateway that streams the data after it.

    Args:
        tensors: ``(name, safetensors dtype code, shape, byte length)`` of each tensor, in
            the order their bytes follow the header.
        metadata: String-to-string ``__metadata__``.
    """
    fields: dict[str, Any] = {"__metadata__": dict(metadata or {})}
    offset = 0
    for name, code, shape, size in tensors:
        fields[name] = {
            "dtype": code,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(fields, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw


def decode(body: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Parse safetensors bytes into float32 (or int64) numpy arrays and the metadata.

    Raises:
        InvalidValue: The bytes are not a safetensors payload.
    """
    if len(body) < 8:
        raise InvalidValue("not a safetensors payload: shorter than its header length")
    (size,) = struct.unpack("<Q", body[:8])
    try:
        header = json.loads(body[8 : 8 + size])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidValue(f"not a safetensors payload: {exc}") from exc
    metadata = header.pop("__metadata__", {}) or {}
    data = memoryview(body)[8 + size :]
    return {name: _array(spec, data) for name, spec in header.items()}, metadata


def _array(spec: Mapping[str, Any], data: memoryview) -> np.ndarray:
    start, stop = spec["data_offsets"]
    raw = data[start:stop]
    shape = tuple(spec["shape"])
    if spec["dtype"] == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype("<u4") << 16
        return bits.view("<f4").reshape(shape)
    array = np.frombuffer(raw, dtype=_NUMPY[spec["dtype"]]).reshape(shape)
    return array.astype(np.float32) if spec["dtype"] == "F16" else array
