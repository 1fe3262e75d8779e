"""One exchange with the store, as plain data: the request as it goes on the wire and the
reply whose body is still to be read.

Both halves of the gateway talk to the store this way: the pass-through forwards a
caller's request (:mod:`.edge._proxy`), and the store client sends the gateway's own
(:mod:`._store`: pushdown's fetches, the cache, the registry). The lean transport that
carries an exchange is the edge's (:class:`.edge._transport.UpstreamTransport`); the app
hands each half a callable that sends an :class:`Outgoing` and returns an
:class:`Incoming`, so neither builds httpx's URL, header and response models per request.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import httpx

from ._signing import DEFAULT_PORTS, host_from_url

__all__ = ["Backend", "Exchange", "Headers", "Incoming", "Outgoing", "Timeouts"]

Timeouts = Mapping[str, Any]
Headers = Sequence[tuple[bytes, bytes]]


class Backend(NamedTuple):
    """Where the store is, parsed once from ``backend_url``: what every :class:`Outgoing`
    to it carries."""

    scheme: str
    host: str
    port: int
    host_header: str  # the Host header: the host, and a port other than the scheme's
    prefix: str  # a path the store is served under ("" for none)

    @classmethod
    @functools.lru_cache(maxsize=8)
    def of(cls, url: str) -> Backend:
        parts = urlsplit(url)
        return cls(
            parts.scheme,
            parts.hostname or "",
            parts.port or DEFAULT_PORTS.get(parts.scheme, 80),
            host_from_url(parts),
            parts.path.rstrip("/"),
        )


class Outgoing(NamedTuple):
    """A request as it goes on the wire.

    ``headers`` go out as they are, so they carry ``Host`` and the body's framing
    (``Content-Length``, or ``Transfer-Encoding: chunked`` for a body of unknown length).

    ``body`` held whole (``bytes``) may be sent again on a fresh connection when a reused
    one turns out stale; a streamed one is sent once.
    """

    method: str
    scheme: str
    host: str
    port: int
    target: bytes  # the path and query, percent-encoded
    headers: Headers
    body: bytes | AsyncIterable[bytes] | None
    timeouts: Timeouts

    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.target.decode('ascii')}"

    def to_httpx(self) -> httpx.Request:
        """The same request for an httpx transport or client (https://, tests' mocks)."""
        return httpx.Request(
            self.method,
            self.url(),
            headers=list(self.headers),
            content=self.body,
            extensions={"timeout": dict(self.timeouts)},
        )


class Incoming(NamedTuple):
    """A response whose body is still to be read: iterate ``body``, then ``aclose`` it."""

    status: int
    headers: Headers
    body: httpx.AsyncByteStream

    @classmethod
    def of(cls, response: httpx.Response) -> Incoming:
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        return cls(response.status_code, response.headers.raw, stream)

    def fields(self) -> dict[str, str]:
        """The headers by lowercase name (latin-1, as sent); the first of a repeated one."""
        return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in reversed(self.headers)}

    async def read(self) -> bytes:
        """The whole body (then closed)."""
        try:
            return b"".join([chunk async for chunk in self.body])
        finally:
            await self.body.aclose()


Exchange = Callable[[Outgoing], Awaitable[Incoming]]
"""Sends an :class:`Outgoing`; the :class:`Incoming`'s body is still to be read.

Raises ``httpx.TransportError`` when connecting, writing or reading fails or times out."""
