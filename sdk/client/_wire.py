"""When a response's body was on the wire, timed where it arrives.

A link estimate from a request's round trip less the gateway's own time counts as wire
time everything else the round trip holds: the request's send, the gateway's HTTP
parsing and event loop before its timer starts and after it stops, the client's own
scheduling. On a link that is not the bottleneck that is nearly all of it: on loopback,
with a second job loading the storage side, 32 KB responses measured the link at
33 Mbit/s (the head to head, 2026-12-02), and the planner then priced a fetch of 44.7 MB
of blocks at 11 s.

The body is read in two parts instead: a first piece, whose arrival starts the clock,
and the rest, whose arrival stops it. What the client's socket buffer held before the
clock started is not known, so the rest is counted less one buffer (the most it can
hold): the figure errs low, the direction in which a plan keeps the pushdown it has,
never high. A body too small to time so leaves no span (:attr:`WireSpan.nbytes` 0).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

FIRST_PIECE = 4 * 1024
"""Bytes read before the clock starts: the piece that may have come with the headers."""
BUFFERED = io.DEFAULT_BUFFER_SIZE
"""The most bytes the HTTP client's buffered socket reader holds ahead of a read (the
buffer ``http.client`` reads through); they may have arrived before the clock started."""


class _Body(Protocol):
    def read(self, amt: int | None = None) -> bytes: ...


@dataclass(frozen=True)
class WireSpan:
    """``nbytes`` of a response body that arrived between ``start`` and ``end``
    (``time.perf_counter()``); ``nbytes`` 0: too small to time."""

    nbytes: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def read_timed(
    body: _Body, clock: Callable[[], float] = time.perf_counter
) -> tuple[bytes, WireSpan]:
    """All of ``body`` (an unread HTTP response body), and the span its bytes after the
    first piece (less :data:`BUFFERED`) took to arrive."""
    first = body.read(FIRST_PIECE)
    start = clock()
    rest = body.read()
    end = clock()
    return first + rest, WireSpan(max(0, len(rest) - BUFFERED), start, end)
