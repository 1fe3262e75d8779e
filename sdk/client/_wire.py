"""When a response's body was on the wire, timed where it arrives.

A link estimate from a request's round trip less the gateway's own time counts as wire
time everything else the round trip holds: the request's send, the gateway's HTTP
parsing and event loop before its timer starts and after it stops, the client's own
scheduling. On a link that is not the bottleneck that is nearly all of it: on loopback,
with a second job loading the storage side, 32 KB responses measured the link at
33 Mbit/s (the head to head, 2026-12-02), and the planner then priced a fetch of 44.7 MB
of blocks at 11 s.

The body is read in two parts instead: a first piece, whose arrival starts the clock,
and the rest, whose arrival stops it. Bytes that had arrived before the clock started
are not counted: the HTTP client's reader holds at most one buffer of them, and the
kernel's receive queue holds what it says (``FIONREAD`` on the socket, read as the clock
starts). A reader that comes late (its thread waited for the interpreter lock or a core
while the body arrived) found most of the body waiting: counted, those bytes had priced
the link at the speed of a memory copy. So the figure errs low, the direction in which a
plan keeps the pushdown it has, never high. A body too small to time so, or one whose
socket's queue cannot be read, leaves no span (:attr:`WireSpan.nbytes` 0).
"""

from __future__ import annotations

import io
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

if sys.platform != "win32":
    import fcntl
    import termios

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
    first piece took to arrive: less :data:`BUFFERED` and what the socket's receive
    queue held when the clock started (:func:`queued_bytes`)."""
    first = body.read(FIRST_PIECE)
    queued = queued_bytes(body)
    start = clock()
    rest = body.read()
    end = clock()
    timed = 0 if queued is None else max(0, len(rest) - BUFFERED - queued)
    return first + rest, WireSpan(timed, start, end)


def queued_bytes(body: object) -> int | None:
    """Bytes that have arrived in the receive queue of the socket ``body`` is read from
    (botocore's ``StreamingBody``, urllib3's and ``http.client``'s responses) and are not
    read yet: 0 for a body read from no socket, ``None`` where the queue cannot be read
    (a platform without ``FIONREAD``, a socket already closed)."""
    sock = _socket_of(body)
    if sock is None:
        return 0
    if sys.platform == "win32":  # no FIONREAD on a socket there
        return None
    try:
        (queued,) = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))
    except (OSError, ValueError):
        return None
    pending = getattr(sock, "pending", None)  # TLS: records already decrypted
    return int(queued) + (int(pending()) if callable(pending) else 0)


def _socket_of(body: Any) -> socket.socket | None:
    """The socket under an HTTP response body, through the clients' private attributes
    (botocore, urllib3 and ``http.client`` have no public way to it)."""
    stream = getattr(body, "_raw_stream", body)  # botocore's StreamingBody
    stream = getattr(stream, "_fp", stream)  # urllib3's response: http.client's
    reader = getattr(stream, "fp", None)  # http.client's buffered reader
    sock = getattr(getattr(reader, "raw", None), "_sock", None)  # socket.SocketIO's
    return sock if isinstance(sock, socket.socket) else None
