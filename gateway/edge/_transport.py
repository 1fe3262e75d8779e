"""A lean HTTP/1.1 transport for talking to the backend store.

httpx's default transport (httpcore + h11 + anyio) costs the gateway more CPU than the
bytes it moves: every 64 KiB read enters an anyio cancel scope and goes through h11's
pure-Python framing, and every request walks the pool's machinery. This transport keeps
httpx's API (it is an ``httpx.AsyncBaseTransport``, so the client, its timeouts and
``httpx.MockTransport`` in tests stay as they are) and does the work with less:

- an ``asyncio.Protocol`` per connection, so the event loop (uvloop under uvicorn) hands
  over whatever one read returned (up to 256 KB) with no per-read task switch;
- ``httptools`` (C) parses response heads and chunked bodies; Content-Length bodies are
  counted, not parsed, so their bytes are passed on as they came;
- back-pressure: the socket stops being read while more than ``_HIGH_WATER`` bytes of body
  wait for the consumer;
- a keep-alive pool per (host, port), bounded by ``httpx.Limits``;
- :meth:`UpstreamTransport.exchange`, for a caller that has the request encoded already (the
  pass-through): an :class:`Outgoing` in, an :class:`Incoming` out, none of httpx's URL,
  header and response models on the way (building them was a fifth of the pass-through's
  CPU per small request).

Plain ``http://`` only: mount ``httpx.AsyncHTTPTransport`` for ``https://``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import socket
import struct
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import NamedTuple, cast

import httptools
import httpx

from .._exchange import Incoming, Outgoing, Timeouts

_HIGH_WATER = 2 * 1024 * 1024  # body bytes held before the socket stops being read
_LOW_WATER = 512 * 1024  # ... and resumes
_MAX_HEAD = 64 * 1024  # largest response head accepted
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "DELETE", "PUT"})
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00\r\n]")


class _Message:
    """Frames one response from the bytes of its connection; no I/O.

    The head goes to httptools whole (found by its blank line); the body is then framed
    here: none (HEAD, 1xx, 204, 304), counted (Content-Length), parsed (chunked), or up to
    the connection's end. Body chunks queue in ``chunks`` for the consumer.
    """

    def __init__(self, method: str) -> None:
        self._head_only = method == "HEAD"
        self._parser: httptools.HttpResponseParser | None = None
        self._pending = b""
        self._left: int | None = None
        self._until_eof = False
        self.status = 0
        self.reason = b""
        self.version = b"HTTP/1.1"
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = True
        self.head_done = False
        self.body_done = False
        self.received = 0
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0

    def feed(self, data: bytes) -> None:
        """Take bytes read from the connection.

        Raises:
            httpx.RemoteProtocolError: The bytes are not a valid response.
        """
        if not self.head_done:
            data = self._feed_head(data)
            if not data:
                return
        if self.body_done:
            self.keep_alive = False  # bytes past the response's end: the framing is off
        elif self._left is not None:
            self._feed_counted(data)
        elif self._parser is not None:
            self._feed_parser(data)
        else:
            self._push(data)

    def eof(self) -> None:
        """The connection ended; a body framed by it is now complete.

        Raises:
            httpx.RemoteProtocolError: The response was cut short.
        """
        if not self.head_done:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        if self._until_eof:
            self.body_done = True
        elif not self.body_done:
            expected = "the last chunk" if self._left is None else f"{self._left} more"
            raise httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body: "
                f"received {self.received} bytes, expected {expected}"
            )

    def take(self) -> bytes:
        """The oldest queued body chunk (the queue must not be empty)."""
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        return chunk

    # httptools callbacks

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self._push(body)

    def on_message_complete(self) -> None:
        if self.head_done:  # heads are parsed alone: only a chunked body ends here
            self.body_done = True
            self._parser = None

    # framing

    def _feed_head(self, data: bytes) -> bytes:
        buf = self._pending + data if self._pending else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > _MAX_HEAD:
                raise httpx.RemoteProtocolError("response head too large")
            self._pending = buf
            return b""
        self._pending = b""
        self._parse_head(memoryview(buf)[: end + 4])
        rest = buf[end + 4 :]
        if 100 <= self.status < 200:  # an interim response: the real one follows
            self.status, self.reason, self.headers = 0, b"", []
            return self._feed_head(rest) if rest else b""
        self.head_done = True
        return rest

    def _parse_head(self, head: memoryview) -> None:
        parser = httptools.HttpResponseParser(self)
        try:
            parser.feed_data(head)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            raise httpx.RemoteProtocolError(f"malformed response head: {exc}") from exc
        self.status = parser.get_status_code()
        self.version = b"HTTP/" + parser.get_http_version().encode("ascii")
        self.keep_alive = parser.should_keep_alive()
        if self.status == 101:
            raise httpx.RemoteProtocolError("unexpected 101 Switching Protocols")
        if self.status >= 200:
            self._frame(parser)

    def _frame(self, parser: httptools.HttpResponseParser) -> None:
        if self._head_only or self.status in (204, 304):
            self.body_done = True
            return
        length: bytes | None = None
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"transfer-encoding" and value.lower().endswith(b"chunked"):
                self._parser = parser  # the parser now waits for the chunked body
                return
            if lower == b"content-length":
                length = value
        if length is None:
            self._until_eof = True
            self.keep_alive = False
            return
        self._left = int(length)  # httptools has checked it is a number
        self.body_done = self._left == 0

    def _feed_counted(self, data: bytes) -> None:
        assert self._left is not None
        if len(data) > self._left:
            data = data[: self._left]
            self.keep_alive = False  # bytes past the response's end: the framing is off
        self._left -= len(data)
        self._push(data)
        self.body_done = self._left == 0

    def _feed_parser(self, data: bytes) -> None:
        assert self._parser is not None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"malformed chunked body: {exc}") from exc

    def _push(self, data: bytes) -> None:
        if data:
            self.chunks.append(data)
            self.buffered += len(data)
            self.received += len(data)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: writes requests, frames responses, one at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._message: _Message | None = None
        self._error: httpx.TransportError | None = None
        self._waiter: asyncio.Future[bool] | None = None
        self._write_paused = False
        self._read_paused = False
        self._last = False  # the request asked for the connection to close
        self.closed = False
        self.got_bytes = False  # for the current request
        self.served = 0  # responses completed on this connection
        self.idle_since = 0.0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        message = self._message
        if message is None:  # nobody asked: the connection's state is unknown
            self.close()
            return
        self.got_bytes = True
        try:
            message.feed(data)
        except httpx.RemoteProtocolError as exc:
            self._fail(exc)
            return
        if message.buffered > _HIGH_WATER and not self._read_paused:
            self._read_paused = True
            self._transport.pause_reading()  # type: ignore[union-attr]
        self._wake(True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        message = self._message
        if message is not None and self._error is None and not message.body_done:
            if exc is not None:
                self._error = httpx.ReadError(f"connection to the store broke: {exc!r}")
            else:
                try:
                    message.eof()
                except httpx.RemoteProtocolError as eof_error:
                    self._error = eof_error
        self._wake(True)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake(True)

    # used by the transport

    def begin(self, method: str, *, last: bool) -> None:
        """Expect the response to a new request; ``last`` if it asked to close after."""
        self._message = _Message(method)
        self._last = last
        self.got_bytes = False

    async def write(self, timeout: float | None, *parts: bytes) -> None:
        """Write bytes, waiting while the socket's buffer is full.

        Raises:
            httpx.WriteError, httpx.WriteTimeout
        """
        if self.closed or self._transport is None:
            raise httpx.WriteError("the connection to the store is closed")
        if len(parts) == 1:
            self._transport.write(parts[0])
        else:
            self._transport.writelines(parts)
        while self._write_paused and not self.closed:
            if not await self._wait(timeout):
                raise httpx.WriteTimeout("timed out writing to the store")
        if self.closed:
            raise httpx.WriteError("the store closed the connection during the request")

    async def read_head(self, timeout: float | None) -> _Message:
        """Wait for the response head.

        Raises:
            httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError
        """
        message = self._message
        assert message is not None
        while not message.head_done:
            if self._error is not None:
                raise self._error
            if not await self._wait(timeout):
                raise httpx.ReadTimeout("timed out waiting for the store's response")
        return message

    async def read_body(self, timeout: float | None) -> bytes:
        """The next body chunk; ``b""`` once the body is complete.

        Raises:
            httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError
        """
        message = self._message
        assert message is not None
        while not message.chunks:
            if message.body_done:
                return b""
            if self._error is not None:
                raise self._error
            if not await self._wait(timeout):
                raise httpx.ReadTimeout("timed out reading the store's response body")
        chunk = message.take()
        if self._read_paused and message.buffered <= _LOW_WATER:
            self._read_paused = False
            if not self.closed:
                self._transport.resume_reading()  # type: ignore[union-attr]
        return chunk

    def head_received(self) -> bool:
        return self._message is not None and self._message.head_done

    def reusable(self) -> bool:
        """Whether the last response was read to its end and allows another request."""
        message = self._message
        return (
            not self.closed
            and not self._last
            and self._error is None
            and message is not None
            and message.body_done
            and message.keep_alive
            and not self._read_paused
        )

    def finish(self) -> None:
        """The response was read whole; the connection waits for the next request."""
        self._message = None
        self.served += 1
        self.idle_since = time.monotonic()

    def close(self) -> None:
        """Close the connection; unsent request bytes are dropped."""
        message = self._message
        if message is not None and not message.body_done and self._error is None:
            # an unfinished body must not end cleanly, even one framed by the connection's end
            self._error = httpx.ReadError("the connection to the store was closed")
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    def reset(self) -> None:
        """Abort the connection with a TCP reset, so an unfinished request dies visibly.

        A plain close ends the stream cleanly, and a store may take a request head
        followed by a clean end for an empty body (SeaweedFS commits an empty object).
        """
        if self._transport is not None and not self.closed:
            sock = self._transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.close()

    def _fail(self, exc: httpx.TransportError) -> None:
        self._error = exc
        self.close()
        self._wake(True)

    async def _wait(self, timeout: float | None) -> bool:
        """Wait for news from the socket; False if ``timeout`` passed first."""
        waiter: asyncio.Future[bool] = self._loop.create_future()
        self._waiter = waiter
        timer = None if timeout is None else self._loop.call_later(timeout, self._wake, False)
        try:
            return await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _wake(self, news: bool) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(news)


class _Pool:
    """Connections to one (host, port): at most ``max_connections``, idle ones reused."""

    def __init__(self, host: str, port: int, limits: httpx.Limits) -> None:
        self._host = host
        self._port = port
        size = limits.max_connections
        self._slots = asyncio.Semaphore(size) if size is not None else None
        self._max_idle = limits.max_keepalive_connections
        self._expiry = limits.keepalive_expiry
        self._idle: collections.deque[_Connection] = collections.deque()
        self._open: set[_Connection] = set()

    async def acquire(self, timeouts: Timeouts, *, reuse: bool = True) -> _Connection:
        """A connection for one request: an idle one (if ``reuse``), else a new one.

        Raises:
            httpx.PoolTimeout, httpx.ConnectError, httpx.ConnectTimeout
        """
        await self._take_slot(timeouts.get("pool"))
        try:
            idle = self._reuse() if reuse else None
            return idle or await self._connect(timeouts.get("connect"))
        except BaseException:
            self._give_slot()
            raise

    def release(self, conn: _Connection) -> None:
        """Take a connection back after its request; kept only if it can serve another."""
        full = self._max_idle is not None and len(self._idle) >= self._max_idle
        if conn.reusable() and not full:
            conn.finish()
            self._idle.append(conn)
        else:
            self._drop(conn)
        self._give_slot()

    def close(self) -> None:
        """Close every connection, busy ones included."""
        for conn in list(self._open):
            self._drop(conn)
        self._idle.clear()

    async def _take_slot(self, timeout: float | None) -> None:
        if self._slots is None:
            return
        if not self._slots.locked():
            await self._slots.acquire()  # a free slot: no wait, no timer
            return
        try:
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("timed out waiting for a connection to the store") from exc

    def _give_slot(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def _reuse(self) -> _Connection | None:
        if self._expiry is not None:  # the oldest idle connections are on the left
            stale_before = time.monotonic() - self._expiry
            while self._idle and self._idle[0].idle_since < stale_before:
                self._drop(self._idle.popleft())
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._drop(conn)
        return None

    async def _connect(self, timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        where = f"{self._host}:{self._port}"
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop), self._host, self._port
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"timed out connecting to the store at {where}") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to the store at {where}: {exc}") from exc
        self._open.add(conn)
        return conn

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)


class _ResponseStream(httpx.AsyncByteStream):
    """A response body, read from its connection as the consumer asks for it."""

    def __init__(self, pool: _Pool, conn: _Connection, timeout: float | None) -> None:
        self._pool: _Pool | None = pool
        self._conn = conn
        self._timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn, timeout = self._conn, self._timeout
        while chunk := await conn.read_body(timeout):
            yield chunk

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.release(self._conn)


class _RequestHead(NamedTuple):
    """A request's encoded head, and how its body is framed."""

    data: bytes
    length: int | None  # Content-Length
    chunked: bool  # Transfer-Encoding: chunked
    close: bool  # Connection: close


class _StaleConnection(Exception):
    """A reused connection ended before any of the response arrived: try another."""


class UpstreamTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over asyncio with a keep-alive pool per (host, port); ``http://`` only.

    Args:
        limits: Pool bounds, per (host, port): ``max_connections`` (busy and idle),
            ``max_keepalive_connections`` (idle), ``keepalive_expiry`` (idle seconds).

    Timeouts come from each request's ``timeout`` extension, as httpx's client sets it:
    ``connect``, ``read`` (per wait for bytes), ``write`` (per wait for buffer space) and
    ``pool`` (wait for a free connection slot).
    """

    def __init__(self, *, limits: httpx.Limits | None = None) -> None:
        self._limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        self._pools: dict[tuple[str, int], _Pool] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return the response with its body still to be read.

        Raises:
            httpx.UnsupportedProtocol: Not an ``http://`` URL.
            httpx.TransportError: Connecting, writing or reading failed or timed out.
            Exception: Whatever the request body's iterator raised (the connection is
                closed, so the store sees a short body).
        """
        url = request.url
        stream = request.stream
        body = request.content if isinstance(stream, httpx.ByteStream) else stream
        assert not isinstance(body, httpx.SyncByteStream)
        outgoing = Outgoing(
            request.method,
            url.scheme,
            url.host,
            url.port or 80,
            url.raw_path,
            request.headers.raw,
            body,
            request.extensions.get("timeout", {}),
        )
        incoming, message = await self._send(outgoing)
        return httpx.Response(
            incoming.status,
            headers=incoming.headers,
            stream=incoming.body,
            extensions={"http_version": message.version, "reason_phrase": message.reason},
        )

    async def exchange(self, outgoing: Outgoing) -> Incoming:
        """Send ``outgoing``; the response's body is still to be read.

        Raises:
            httpx.UnsupportedProtocol: Not ``http``.
            httpx.TransportError: Connecting, writing or reading failed or timed out.
            Exception: Whatever the body's iterator raised (as above).
        """
        incoming, _ = await self._send(outgoing)
        return incoming

    async def _send(self, outgoing: Outgoing) -> tuple[Incoming, _Message]:
        pool = self._pool(outgoing.scheme, outgoing.host, outgoing.port)
        head = _encode_head(outgoing)
        replayable = outgoing.method in _IDEMPOTENT and not _streamed(outgoing.body)
        try:
            return await self._attempt(pool, outgoing, head, retry=replayable)
        except _StaleConnection:
            return await self._attempt(pool, outgoing, head, retry=False, fresh=True)

    async def aclose(self) -> None:
        """Close every connection."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def _pool(self, scheme: str, host: str, port: int) -> _Pool:
        if scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"UpstreamTransport speaks http:// only, not {scheme}://; "
                "mount httpx.AsyncHTTPTransport for other schemes"
            )
        key = (host, port)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(*key, self._limits)
        return pool

    async def _attempt(
        self,
        pool: _Pool,
        outgoing: Outgoing,
        head: _RequestHead,
        *,
        retry: bool,
        fresh: bool = False,
    ) -> tuple[Incoming, _Message]:
        """One try; ``retry`` allows another if a reused connection turns out stale."""
        timeouts = outgoing.timeouts
        conn = await pool.acquire(timeouts, reuse=not fresh)
        try:
            message = await _exchange(conn, outgoing, head)
        except BaseException as exc:
            conn.reset()  # the request may be unfinished: the store must not take it as done
            pool.release(conn)
            broke = isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError)
            if retry and broke and conn.served and not conn.got_bytes:
                raise _StaleConnection from exc
            raise
        body = _ResponseStream(pool, conn, timeouts.get("read"))
        return Incoming(message.status, message.headers, body), message


async def _exchange(conn: _Connection, outgoing: Outgoing, head: _RequestHead) -> _Message:
    """Write ``outgoing`` on ``conn`` and read the response head."""
    conn.begin(outgoing.method, last=head.close)
    timeouts = outgoing.timeouts
    write_timeout = timeouts.get("write")
    await conn.write(write_timeout, head.data)
    try:
        if head.length or head.chunked:
            await _send_body(conn, outgoing.body, head, write_timeout)
    except httpx.WriteError:
        if not conn.head_received():  # the store may have answered early, then closed
            raise
    return await conn.read_head(timeouts.get("read"))


def _encode_head(outgoing: Outgoing) -> _RequestHead:
    """The request line and headers, and how the body is framed.

    Raises:
        httpx.LocalProtocolError: A header could smuggle a line break, or a bad length.
    """
    parts = [outgoing.method.encode("ascii"), b" ", outgoing.target, b" HTTP/1.1\r\n"]
    length, chunked, close = None, False, False
    for name, value in outgoing.headers:
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise httpx.LocalProtocolError(f"invalid request header {name!r}")
        parts += (name, b": ", value, b"\r\n")
        lower = name.lower()
        if lower == b"content-length":
            length = _content_length(value)
        elif lower == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
        elif lower == b"connection":
            close = b"close" in value.lower()
    parts.append(b"\r\n")
    return _RequestHead(b"".join(parts), length, chunked and length is None, close)


def _content_length(value: bytes) -> int:
    if not value.isdigit():
        raise httpx.LocalProtocolError(f"invalid Content-Length {value!r}")
    return int(value)


async def _send_body(
    conn: _Connection,
    body: bytes | AsyncIterable[bytes] | None,
    head: _RequestHead,
    timeout: float | None,
) -> None:
    """Stream the request body: as is under Content-Length, else chunked.

    Raises:
        httpx.LocalProtocolError: The body is not as long as its Content-Length says.
    """
    left = head.length
    async for chunk in _pieces(body):
        if not chunk:
            continue
        if left is None:
            await conn.write(timeout, b"%x\r\n" % len(chunk), chunk, b"\r\n")
            continue
        left -= len(chunk)
        if left < 0:
            raise httpx.LocalProtocolError("the request body is longer than its Content-Length")
        await conn.write(timeout, chunk)
    if left:
        raise httpx.LocalProtocolError(f"the request body is {left} bytes short of its length")
    if left is None:
        await conn.write(timeout, b"0\r\n\r\n")


async def _pieces(body: bytes | AsyncIterable[bytes] | None) -> AsyncIterator[bytes]:
    if isinstance(body, bytes):
        yield body
    elif body is not None:
        async for chunk in body:
            yield chunk


def _streamed(body: bytes | AsyncIterable[bytes] | None) -> bool:
    """Whether a body is read as it is sent (so it cannot be sent twice)."""
    return body is not None and not isinstance(body, bytes)
