"""Serving the gateway under uvicorn: the HTTP edge's limits and the worker processes.

uvicorn's httptools protocol has no bound on a request head's size and no deadline for
receiving it (``h11_max_incomplete_event_size`` guards h11 only), and its concurrency limit
answers in plain text. :class:`EdgeProtocol` adds the first two and answers the third as
S3 XML, so every S3 client backs off and retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .._errors import RequestHeaderSectionTooLarge, SlowDown
from .._observe import RequestIds, error_body
from .._settings import GatewaySettings
from .._types import ASGIApp, ASGIReceive, ASGISend, Scope

_WORKER_STARTUP_S = 120
_SHUTDOWN_GRACE_S = 5
"""On SIGINT or SIGTERM, requests still open after this long are cancelled: a client
stalled mid-upload would otherwise hold the gateway (and ``hapi up``) forever."""


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """What one client connection may do before it is refused or closed."""

    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 30.0
    max_connections: int = 1024
    # The ids of the answers the edge gives itself, in the scheme of every other answer.
    request_ids: RequestIds = field(default_factory=RequestIds, compare=False)

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> EdgeLimits:
        return cls(settings.max_header_bytes, settings.header_timeout_s, settings.max_connections)


class EdgeConfig(uvicorn.Config):
    """A uvicorn config that carries :class:`EdgeLimits` to each connection's protocol."""

    edge = EdgeLimits()


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a bounded head size and a head-read deadline.

    Head bytes are counted as they arrive, before httptools buffers them, from a
    connection's start or the end of the previous request until the head is complete.
    """

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._limits: EdgeLimits = getattr(config, "edge", EdgeLimits())
        self._gateway_app = self.app
        self._reading_head = True
        self._head_bytes = 0
        # When the head being read began (None between requests), and the one timer that
        # checks it: moved on, not re-made, for each request of a kept-alive connection.
        self._head_since: float | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._slow_down = _slow_down(self._limits.request_ids)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # uvicorn writes a response's head and body apart: sent as one, small answers
        # cost less (4 KiB GETs from 150 connections: 228 -> 209 us of CPU a request).
        super().connection_made(_CoalescedWrites(transport, self.loop))  # type: ignore[arg-type]
        self._head_begins()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        room = self._limits.max_header_bytes - self._head_bytes
        if not self._reading_head or len(data) <= room:
            self._head_bytes += len(data) if self._reading_head else 0
            super().data_received(data)
            return
        # The read may hold the head's end and body bytes after it: let the parser see
        # what the limit allows, and refuse only if the head is still not complete.
        if room > 0:
            super().data_received(data[:room])
        if self._reading_head:
            self._refuse_head()
        elif not self.transport.is_closing():
            super().data_received(data[room:])

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begins()

    def on_headers_complete(self) -> None:
        self._reading_head, self._head_bytes = False, 0
        self._head_since = None
        busy = len(self.connections) > self._limits.max_connections
        self.app = self._slow_down if busy else self._gateway_app
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True

    def _refuse_head(self) -> None:
        error = RequestHeaderSectionTooLarge(
            f"The request head exceeds the {self._limits.max_header_bytes} bytes this "
            "gateway accepts."
        )
        body = error_body(error, self._limits.request_ids.next())
        head = (
            f"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/xml\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self._reading_head = False
        self.transport.write(head.encode() + body)
        self.transport.close()

    def _head_begins(self) -> None:
        """Start the head's clock; the connection's timer is armed only if none is
        pending (a pending one finds the new start when it fires)."""
        self._head_since = self.loop.time()
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._limits.header_timeout_s, self._head_due)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_due(self) -> None:
        """The timer fired: close the connection if the head it is reading began too long
        ago, wait on if a later head began since, stop if none is being read."""
        self._head_timer = None
        if self._head_since is None or self.transport.is_closing():
            return
        left = self._head_since + self._limits.header_timeout_s - self.loop.time()
        if left > 0:
            self._head_timer = self.loop.call_later(left, self._head_due)
        else:
            self.transport.close()


class _CoalescedWrites:
    """A connection's transport whose writes within one turn of the event loop leave in
    one send: uvicorn writes a response's head and its body separately, which made two
    segments (and two wake-ups of the client) of every small answer.

    Everything else is the transport's own: closing sends what is pending first, aborting
    drops it with the connection.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending or self._transport.is_closing():
            return
        if len(pending) == 1:
            self._transport.write(pending[0])
        else:
            self._transport.writelines(pending)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _slow_down(ids: RequestIds) -> ASGIApp:
    """The answer beyond the connection limit: 503 SlowDown, which S3 clients retry."""

    async def answer(scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        error = SlowDown("The gateway is serving as many connections as it may; retry later.")
        body = error_body(error, ids.next())
        headers = [
            (b"content-type", b"application/xml"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return answer


def edge_config(
    settings: GatewaySettings,
    host: str,
    port: int,
    app_factory: Callable[[GatewaySettings], Callable[[], Any]],
) -> EdgeConfig:
    """The uvicorn config that serves the gateway with its edge limits.

    The app is built in the serving process by what ``app_factory(settings)`` returns
    (picklable), so the config can be handed to spawned workers; with ``settings.workers``
    above 1 each gets ``1/workers`` of the memory budget.
    """
    workers = settings.workers
    if workers > 1:
        settings = settings.with_changes(
            memory_budget_bytes=max(1, settings.memory_budget_bytes // workers)
        )
    config = EdgeConfig(
        app_factory(settings),
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        # One process: uvloop, accepting every waiting connection at each wake-up (see
        # _accept). Several share the socket: uvloop's one accept per turn spreads a burst
        # over them, where the first to wake would take it all.
        loop="hapi.gateway.edge._accept:new_event_loop" if workers == 1 else "uvloop",
        http=EdgeProtocol,
        lifespan="on",
        server_header=False,
        # The gateway writes its own access log (hapi.gateway._observe); uvicorn's would
        # format every request's line only for its logger to drop it. (Its proxy headers
        # stay on: a TLS proxy on the same machine passes the client's address and scheme.)
        access_log=False,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        h11_max_incomplete_event_size=settings.max_header_bytes,
        # A spawned worker answers health checks only once it has imported the gateway,
        # which takes seconds on a busy machine: a short deadline kills it in a loop.
        timeout_worker_healthcheck=_WORKER_STARTUP_S,
        timeout_graceful_shutdown=_SHUTDOWN_GRACE_S,
    )
    config.edge = EdgeLimits.from_settings(settings)
    return config
