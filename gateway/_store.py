"""The gateway's own calls to its store: one client for the registry, the feature cache,
pushdown's fetches and the control plane's health check.

URLs are built, requests signed, idempotent requests retried once on a refused connection,
ListObjectsV2 pages followed and S3 error replies parsed here and nowhere else. It is also
the one place that decides which store identity a call acts as: the backend credentials
(the gateway's own calls), a caller's own identity (:meth:`StoreClient.acting_as`, for
pushdown's fetches and the cache's HEADs), or none at all (an unsigned request, which the
store's own ACLs and bucket policies judge).

Transport failures (``httpx.TransportError``) pass through unchanged: each caller knows
what one means for it (a registry error, a cache miss, ``503 ServiceUnavailable``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypedDict, Unpack
from urllib.parse import quote, urlencode

import httpx

from hapi.protocol import Credentials, ListedObject, parse_error, parse_list_page

from ._errors import BackendError
from ._exchange import Backend, Exchange, Incoming, Outgoing
from ._operation import object_path
from ._settings import GatewaySettings
from ._signing import UNSIGNED_PAYLOAD, sign_target

_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
_WITH_BODY = frozenset({"PUT", "POST"})  # sent with a Content-Length even when empty


def _query(query: Mapping[str, str]) -> str:
    """A query encoded the way SigV4 canonicalizes it."""
    return urlencode(sorted(query.items()), quote_via=quote)


@functools.lru_cache(maxsize=8)
def _timeouts(read_s: float, connect_s: float) -> dict[str, float | None]:
    """httpx's timeouts of one request, by phase (built once: :meth:`StoreClient.acting_as`
    makes a client per request)."""
    return httpx.Timeout(read_s, connect=connect_s).as_dict()


class RequestOptions(TypedDict, total=False):
    """What a request to the store may add to its method, bucket and key."""

    query: Mapping[str, str] | None  # encoded the way SigV4 canonicalizes it
    headers: Mapping[str, str] | None  # signed with the rest
    content: bytes | None  # the body, sent with its Content-Length
    payload_sha256: str  # the body's hex SHA-256 (default: UNSIGNED-PAYLOAD)
    timeout: float | None  # for every phase (default: the settings' timeouts)


@dataclass(frozen=True)
class StoreClient:
    """Signed S3 requests from the gateway to its store.

    Args:
        settings: Where the store is (``backend_url``) and the region to sign for.
        client: Getter of the upstream HTTP client (the app's lifespan owns it).
        credentials: The identity the requests act as; ``None`` sends them unsigned.
        exchange: Sends a request as it goes on the wire (:class:`._exchange.Outgoing`)
            straight to the app's lean transport: a general-purpose client's request and
            response models (URL parsing, header objects, auth and redirect handling) cost
            pushdown's per-object GET more of the event loop than its signature did.
            ``None``: through ``client``.
    """

    settings: GatewaySettings
    client: Callable[[], httpx.AsyncClient]
    credentials: Credentials | None
    exchange: Exchange | None = None

    @classmethod
    def of(
        cls,
        settings: GatewaySettings,
        client: Callable[[], httpx.AsyncClient],
        exchange: Exchange | None = None,
    ) -> StoreClient:
        """The client acting as the gateway's backend identity."""
        return cls(settings, client, settings.backend_credentials, exchange)

    def acting_as(self, credentials: Credentials | None) -> StoreClient:
        """The same client acting as ``credentials`` (``None``: unsigned requests, which
        the store judges as anonymous)."""
        return replace(self, credentials=credentials)

    async def request(
        self, method: str, bucket: str, key: str = "", **options: Unpack[RequestOptions]
    ) -> httpx.Response:
        """Send one signed request and read its reply (any status).

        A refused connection is retried once for idempotent methods (a store restarting,
        a pooled connection the store closed); other transport errors are raised.
        """
        outgoing = self.outgoing(method, bucket, key, **options)
        for attempt in (1, 2):
            try:
                reply = await self._send(outgoing)
                return httpx.Response(
                    reply.status, headers=reply.headers, content=await reply.read()
                )
            except httpx.ConnectError:
                if attempt == 2 or method not in _IDEMPOTENT:
                    raise
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def stream(self, bucket: str, key: str) -> AsyncIterator[Incoming]:
        """A signed GET whose body is read as it arrives (any status)."""
        reply = await self._send(self.outgoing("GET", bucket, key))
        try:
            yield reply
        finally:
            await reply.body.aclose()

    def outgoing(
        self, method: str, bucket: str, key: str = "", **options: Unpack[RequestOptions]
    ) -> Outgoing:
        """One request to the store as it goes on the wire: path-style, signed as this
        client's identity (``Host`` and the body's length among its headers)."""
        query, headers = options.get("query"), options.get("headers")
        content = options.get("content")
        payload_sha256 = options.get("payload_sha256", UNSIGNED_PAYLOAD)
        backend = Backend.of(self.settings.backend_url)
        path = backend.prefix + (object_path(bucket, key) if bucket else "/")
        encoded = _query(query) if query else ""
        if self.credentials is None:
            signed = {name.lower(): value for name, value in (headers or {}).items()}
            signed.setdefault("host", backend.host_header)
        else:
            signed = sign_target(
                method=method,
                host=backend.host_header,
                path=path,
                query=encoded,
                headers=headers or {},
                credentials=self.credentials,
                region=self.settings.region,
                payload_sha256=payload_sha256,
            )
        if content is not None or method in _WITH_BODY:
            signed["content-length"] = str(len(content or b""))
        wire = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in signed.items()]
        return Outgoing(
            method,
            backend.scheme,
            backend.host,
            backend.port,
            (path + "?" + encoded if encoded else path).encode("ascii"),
            wire,
            content,
            self._timeouts(options.get("timeout")),
        )

    async def _send(self, outgoing: Outgoing) -> Incoming:
        """Straight to the app's transport when it gave an ``exchange``, else through the
        client (tests' mocks)."""
        if self.exchange is not None:
            return await self.exchange(outgoing)
        return Incoming.of(await self.client().send(outgoing.to_httpx(), stream=True))

    def _timeouts(self, timeout: float | None = None) -> dict[str, float | None]:
        """A request's timeouts: ``timeout`` for every phase, else the settings' read and
        connect timeouts."""
        if timeout is not None:
            return _timeouts(timeout, timeout)
        return _timeouts(self.settings.read_timeout_s, self.settings.connect_timeout_s)

    async def list_objects(self, bucket: str, prefix: str) -> AsyncIterator[ListedObject]:
        """Every object under ``prefix``, page after page; nothing when the bucket does not
        exist.

        Raises:
            BackendError: The store refused a page (or answered something not a listing).
        """
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            reply = await self.request("GET", bucket, query=query)
            if reply.status_code == 404:
                return
            if reply.status_code != 200:
                raise backend_error(reply.status_code, reply.content, f"/{bucket}?prefix={prefix}")
            try:
                page = parse_list_page(reply.content)
            except ValueError as exc:
                raise BackendError("BackendError", reply.status_code, str(exc)) from exc
            for item in page.objects:
                yield item
            if page.next_token is None:
                return
            token = page.next_token


def backend_error(status: int, body: bytes, resource: str) -> BackendError:
    """The store's error reply as the gateway's :class:`BackendError`."""
    error = parse_error(body)
    return BackendError(
        error.code or "BackendError",
        status,
        error.message or f"the backend answered HTTP {status}",
        resource=resource,
    )
