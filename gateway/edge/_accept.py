"""The gateway's event loop: uvloop, accepting every waiting connection at each wake-up.

uvloop (libuv underneath) accepts one connection per turn of the event loop. The kernel
completes a TCP handshake before the server accepts, so a client sees its connection open
and sends its request at once; the request then waits in the accept queue for its turn.
Under load a turn takes milliseconds: 150 connections opened at once (wrk, in front of a
busy gateway) drained from the accept queue over 0.65-0.75 s, one per turn, and their
first requests waited with them. That start-up queue was the whole of the pass-through
p99 of ``make bench-proxy`` (a request's path through the gateway, first byte in to last
byte out, never took more than 0.12 s in the same runs).

:class:`EdgeLoop` serves a listening socket as asyncio's own loop does: at each wake-up it
accepts every pending connection (up to the socket's backlog) and hands each to uvloop's
transports (:meth:`asyncio.AbstractEventLoop.connect_accepted_socket`), so everything
after the accept is uvloop's as before. It serves a gateway of one process; worker
processes sharing a socket keep uvloop's one accept per turn, which spreads a burst over
them (the first to wake would otherwise take it all).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvloop

__all__ = ["AcceptingServer", "EdgeLoop", "new_event_loop"]

logger = logging.getLogger("hapi.gateway")

# Out of descriptors or memory: accepting again at once would spin on the same error; a
# second's pause (asyncio's own choice) lets connections close first.
_PAUSE_S = 1.0
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class EdgeLoop(uvloop.Loop):
    """uvloop, whose servers on a given listening socket accept every pending connection
    at each wake-up (:class:`AcceptingServer`); anything else is uvloop's own."""

    async def create_server(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: Any = None,
        port: Any = None,
        *,
        sock: socket.socket | None = None,
        backlog: int = 100,
        ssl: Any = None,
        **kwargs: Any,
    ) -> asyncio.AbstractServer:
        if sock is None or ssl is not None or kwargs.get("start_serving") is False:
            return await super().create_server(
                protocol_factory, host, port, sock=sock, backlog=backlog, ssl=ssl, **kwargs
            )
        server = AcceptingServer(self, sock, protocol_factory, backlog)
        server.start()
        return server


def new_event_loop() -> EdgeLoop:
    """A new :class:`EdgeLoop` (uvicorn's ``loop`` setting names this factory)."""
    return EdgeLoop()


class AcceptingServer(asyncio.AbstractServer):
    """Serves one listening socket: accepts up to ``backlog`` pending connections at each
    wake-up and opens a uvloop transport with a new protocol for each.

    Args:
        loop: The running loop.
        sock: A bound, listening socket.
        protocol_factory: Makes each connection's protocol.
        backlog: Most connections accepted in one wake-up (the socket's backlog: the most
            that can be waiting), so one wake-up cannot hold the loop for long.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        backlog: int,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._factory = protocol_factory
        self._burst = max(1, backlog)
        self._serving = False
        self._paused: asyncio.TimerHandle | None = None
        self._opening: set[asyncio.Task[Any]] = set()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self._sock,) if self._sock.fileno() >= 0 else ()

    def start(self) -> None:
        self._sock.setblocking(False)
        self._loop.add_reader(self._sock.fileno(), self._accept_pending)
        self._serving = True

    def _accept_pending(self) -> None:
        for _ in range(self._burst):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # none left (an aborted one was the client's own going away)
            except OSError as exc:
                if exc.errno not in _EXHAUSTED:
                    raise
                logger.warning("cannot accept connections for %.0f s: %s", _PAUSE_S, exc)
                self._loop.remove_reader(self._sock.fileno())
                self._paused = self._loop.call_later(_PAUSE_S, self._resume)
                return
            task = self._loop.create_task(self._open(conn))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    def _resume(self) -> None:
        self._paused = None
        if self._serving:
            self._loop.add_reader(self._sock.fileno(), self._accept_pending)

    async def _open(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except Exception:  # the connection's alone: the server goes on accepting
            logger.exception("cannot open an accepted connection")
            conn.close()

    def close(self) -> None:
        """Stop accepting and close the listening socket (connections stay open)."""
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
        if self._serving:
            self._serving = False
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()

    async def wait_closed(self) -> None:
        """Wait until connections accepted before :meth:`close` have their transports."""
        if self._opening:
            await asyncio.gather(*self._opening, return_exceptions=True)

    def is_serving(self) -> bool:
        return self._serving

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def start_serving(self) -> None:
        """Serving starts with the server; nothing to do."""

    async def serve_forever(self) -> None:
        """Serve until the task is cancelled; the server closes then."""
        try:
            await self._loop.create_future()
        finally:
            self.close()
