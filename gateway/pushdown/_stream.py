"""Pushdown responses, sent as windows of samples complete: the whole tensor is never held.

safetensors puts one JSON header before the raw bytes, naming each tensor's shape and
byte range; everything it needs (the number of samples, their keys and labels) is known
once the objects are listed, before any sample is decoded. So the header goes first, then
the feature rows window by window, then the labels. The JSON summary (``hapi-format=json``)
keeps running figures instead of the rows and is sent whole at the end.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hapi.models import Manifest
from hapi.protocol import (
    WIRE_CODES,
    WIRE_ITEMSIZE,
    end_frame,
    raw_frames,
    safetensors_header,
    to_wire_dtype,
    word_frames,
)

from .._types import ASGISend
from ._cached import view_dict
from ._params import Params


@dataclass
class Answer:
    """What one pushdown request answers: which samples, which failed, how long it took."""

    manifest: Manifest
    params: Params
    samples: Sequence[Any]  # PendingSample, or CachedSample (key, label, meta)
    row_shape: tuple[int, ...]
    errors: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    batch_size: int = 0
    cache: str = "bypass"  # the x-hapi-cache answer: hit, miss or bypass
    started: float | None = None  # time.perf_counter() when the request reached pushdown

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.samples), *self.row_shape)

    @functools.cached_property
    def _labels(self) -> np.ndarray | None:
        if not any(s.label is not None for s in self.samples):
            return None
        return np.array([-1 if s.label is None else s.label for s in self.samples], np.int64)

    def labels(self) -> np.ndarray | None:
        """The samples' labels (-1 for none), or ``None`` when no sample has one."""
        return self._labels

    def metadata(self) -> dict[str, str]:
        meta = {
            "model": self.manifest.name,
            "version": str(self.manifest.version),
            "split": str(self.params.split),
            "keys": json.dumps([s.key for s in self.samples]),
        }
        if self.errors:
            meta["errors"] = json.dumps(self.errors)
        if any(s.meta for s in self.samples):
            meta["samples"] = json.dumps([s.meta for s in self.samples])
        views = self.views()
        if views is not None:
            meta["views"] = json.dumps(views, separators=(",", ":"))
        return meta

    def views(self) -> list[dict[str, Any] | None] | None:
        """Each sample's augmented view as drawn (``None`` without ``augment``)."""
        if self.params.augment is None:
            return None
        return [view_dict(s) for s in self.samples]

    @functools.cached_property
    def _tensors(self) -> list[tuple[str, str, tuple[int, ...], int]]:
        """(name, dtype code, shape, bytes) of each tensor the answer sends (its samples,
        row shape and dtype are fixed once it is made)."""
        code, itemsize = WIRE_CODES[self.params.dtype], WIRE_ITEMSIZE[self.params.dtype]
        tensors = [("features", code, self.shape, itemsize * math.prod(self.shape))]
        if self.labels() is not None:
            tensors.append(("labels", "I64", (len(self.samples),), 8 * len(self.samples)))
        return tensors

    def tensor_bytes(self) -> int:
        """The tensors' bytes, the safetensors header left out."""
        return sum(size for *_, size in self._tensors)

    def safetensors_head(self) -> tuple[bytes, int]:
        """The safetensors header (length prefix included) and the whole payload's size."""
        head = safetensors_header(self._tensors, self.metadata())
        return head, len(head) + self.tensor_bytes()

    def server_timing(self) -> dict[str, float]:
        """The stages' milliseconds so far, and ``total``: the gateway's whole time since
        the request arrived (the stages overlap, a window decoding while the previous one
        runs, and leave out the time queued behind other requests), so that a client can
        tell its time on the wire from the gateway's."""
        timings = dict(self.timings)
        if self.started is not None:
            timings["total"] = (time.perf_counter() - self.started) * 1000
        return timings

    def response_headers(
        self, content_type: bytes, length: int | None
    ) -> list[tuple[bytes, bytes]]:
        """The answer's headers; ``length`` ``None``: a body whose length is known at its
        end only (sent chunked)."""
        timing = ", ".join(f"{name};dur={ms:.2f}" for name, ms in self.server_timing().items())
        sized = [] if length is None else [(b"content-length", str(length).encode())]
        coding = self.params.encoding
        encoded = [] if coding == "dense" else [(b"x-hapi-encoding", coding.encode())]
        return [
            (b"content-type", content_type),
            *sized,
            *encoded,
            (b"x-hapi-model", self.manifest.ref.encode()),
            (b"x-hapi-split", str(self.params.split).encode()),
            (b"x-hapi-shape", ",".join(str(n) for n in self.shape).encode()),
            (b"x-hapi-dtype", self.params.dtype.encode()),
            (b"x-hapi-batch-size", str(self.batch_size).encode()),
            (b"x-hapi-cache", self.cache.encode()),
            (b"server-timing", timing.encode()),
            *self._view_header(),
        ]

    def _view_header(self) -> list[tuple[bytes, bytes]]:
        """``x-hapi-view``: the one sample's drawn view, for a request of one sample."""
        views = self.views()
        if views is None or len(views) != 1:
            return []
        return [(b"x-hapi-view", json.dumps(views[0], separators=(",", ":")).encode())]


def _wire(outputs: np.ndarray, dtype: str) -> bytes | memoryview:
    """The rows' wire bytes: float32 rows as they are, without a copy (a sample of an
    early split is hundreds of KB, copied on the event loop otherwise); converted for the
    other dtypes. The rows are never written to after they are sent."""
    if dtype == "float32" and outputs.dtype == np.dtype("<f4") and outputs.flags.c_contiguous:
        return memoryview(outputs.data).cast("B")
    return to_wire_dtype(outputs, dtype)[1]


WHOLE_RESPONSE_BYTES = 1 << 20
"""A features response whose tensors are at most this size is sent whole once every window is computed, so
that its ``Server-Timing`` covers all of them and a client can tell its time on the wire
from the gateway's; a larger one streams from its first window (its ``Server-Timing`` then
covers the first window only)."""


class FeatureStream:
    """Sends an :class:`Answer`'s rows (``safetensors``): whole when its tensors are at
    most :data:`WHOLE_RESPONSE_BYTES`, else as they come; in ``zeros`` frames when the
    request asked for them (:mod:`hapi.protocol`'s ``_zeros``: each window of rows one frame).

    A streamed response starts with the first rows, so that an error in the first window
    is still an S3 XML error; an error after that can only cut the body short (its
    ``Content-Length`` tells the client, or, encoded, the missing end frame). A whole one
    is an S3 XML error up to its end.
    """

    def __init__(self, send: ASGISend, answer: Answer) -> None:
        self._send = send
        self._answer = answer
        self._started = False
        self._zeros = answer.params.encoding == "zeros"
        # The rows held until the end (a whole response), or None (streamed).
        whole = answer.tensor_bytes() <= WHOLE_RESPONSE_BYTES
        self._held: list[bytes | memoryview] | None = [] if whole else None

    async def rows(self, outputs: np.ndarray) -> None:
        """Send (or hold) the next rows ``[n, ...]`` (float32; converted to the wire dtype
        here; rows are never written to once given, so holding them needs no copy)."""
        body = _wire(outputs, self._answer.params.dtype)
        if self._zeros:
            body = b"".join(word_frames(body, WIRE_ITEMSIZE[self._answer.params.dtype]))
        if self._held is not None:
            self._held.append(body)
            return
        if not self._started:
            await self._start(None)
        await self._send({"type": "http.response.body", "body": body, "more_body": True})

    async def finish(self) -> None:
        """Send the labels and end the body (with every held row before them)."""
        labels = self._answer.labels()
        tail: bytes | memoryview = (
            b"" if labels is None else np.ascontiguousarray(labels, "<i8").tobytes()
        )
        if self._zeros:
            total = self._answer.safetensors_head()[1]
            tail = b"".join([*raw_frames(tail), end_frame(total)])
        held, self._held = self._held or [], None
        if not self._started:
            await self._start(sum(len(part) for part in held) + len(tail))
        # One part goes as it is: joining copies it (hundreds of KB at an early split).
        body = held[0] if len(held) == 1 and not tail else b"".join([*held, tail])
        await self._send({"type": "http.response.body", "body": body})

    async def _start(self, rest: int | None) -> None:
        """Send the headers and the safetensors header; ``rest``: the bytes that follow
        the header, when known (a whole response), for ``Content-Length``."""
        self._started = True
        head, total = self._answer.safetensors_head()
        if self._zeros:
            head = b"".join(raw_frames(head))
            # Encoded, a streamed body's length is known at its end only.
            length = None if rest is None else len(head) + rest
        else:
            length = total
        headers = self._answer.response_headers(b"application/octet-stream", length)
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        await self._send({"type": "http.response.body", "body": head, "more_body": True})


class SummaryStream:
    """Keeps running figures of the rows and sends a JSON summary at the end (``json``)."""

    def __init__(self, send: ASGISend, answer: Answer) -> None:
        self._send = send
        self._answer = answer
        self._count = 0
        self._sum = 0.0
        self._min: float | None = None
        self._max: float | None = None
        self._first: list[float] = []

    async def rows(self, outputs: np.ndarray) -> None:
        """Fold the next rows into the figures."""
        if not outputs.size:
            return
        self._count += outputs.size
        self._sum += float(outputs.sum(dtype=np.float64))
        low, high = float(outputs.min()), float(outputs.max())
        self._min = low if self._min is None else min(self._min, low)
        self._max = high if self._max is None else max(self._max, high)
        if len(self._first) < 8:
            self._first += [float(v) for v in outputs.reshape(-1)[: 8 - len(self._first)]]

    async def finish(self) -> None:
        """Send the summary."""
        body = json.dumps(self.summary(), indent=1).encode()
        headers = self._answer.response_headers(b"application/json", len(body))
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})

    def summary(self) -> dict[str, Any]:
        answer = self._answer
        labels = answer.labels()
        return {
            **answer.metadata(),
            "keys": [s.key for s in answer.samples],
            "errors": answer.errors,
            **({} if answer.params.augment is None else {"views": answer.views()}),
            "shape": list(answer.shape),
            "dtype": answer.params.dtype,
            "min": self._min,
            "max": self._max,
            "mean": self._sum / self._count if self._count else None,
            "first_values": self._first,
            "labels": None if labels is None else labels.tolist(),
            "storage_batch_size": answer.batch_size,
            "timings_ms": {k: round(v, 2) for k, v in answer.timings.items()},
            "bytes_as_safetensors": answer.safetensors_head()[1],
        }


def open_stream(send: ASGISend, answer: Answer) -> FeatureStream | SummaryStream:
    """The writer for the format the request asked for."""
    if answer.params.format == "json":
        return SummaryStream(send, answer)
    return FeatureStream(send, answer)
