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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from hapi.protocol import Credentials, ListedObject, parse_error, parse_list_page

from ._errors import BackendError
from ._operation import object_path
from ._settings import GatewaySettings
from ._signing import UNSIGNED_PAYLOAD, sign_request

_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})


@functools.lru_cache(maxsize=8)
def _timeouts(read_s: float, connect_s: float) -> dict[str, float | None]:
    """httpx's timeout extension for a request sent straight to a transport (built once:
    :meth:`StoreClient.acting_as` makes a client per request)."""
    return httpx.Timeout(read_s, connect=connect_s).as_dict()


@dataclass(frozen=True)
class StoreClient:
    """Signed S3 requests from the gateway to its store, over the app's upstream client.

    Args:
        settings: Where the store is (``backend_url``) and the region to sign for.
        client: Getter of the upstream HTTP client (the app's lifespan owns it).
        credentials: The identity the requests act as; ``None`` sends them unsigned.
        send: Sends a built request straight to the client's transports (the response's
            body still to read), for the per-object GETs of pushdown: a general-purpose
            client's per-request machinery (URL merging, auth and redirect handling,
            cookies) cost them about a tenth of the event loop's time. ``None``: the
            client's own ``send``.
    """

    settings: GatewaySettings
    client: Callable[[], httpx.AsyncClient]
    credentials: Credentials | None
    send: Callable[[httpx.Request], Awaitable[httpx.Response]] | None = None

    @classmethod
    def of(
        cls,
        settings: GatewaySettings,
        client: Callable[[], httpx.AsyncClient],
        send: Callable[[httpx.Request], Awaitable[httpx.Response]] | None = None,
    ) -> StoreClient:
        """The client acting as the gateway's backend identity."""
        return cls(settings, client, settings.backend_credentials, send)

    def acting_as(self, credentials: Credentials | None) -> StoreClient:
        """The same client acting as ``credentials`` (``None``: unsigned requests, which
        the store judges as anonymous)."""
        return replace(self, credentials=credentials)

    def url(self, bucket: str, key: str = "", query: Mapping[str, str] | None = None) -> str:
        """The path-style URL of ``bucket`` (or of its object ``key``), with ``query``
        encoded the way SigV4 canonicalizes it."""
        url = self.settings.backend_url + (object_path(bucket, key) if bucket else "/")
        if query:
            url += "?" + urlencode(sorted(query.items()), quote_via=quote)
        return url

    def sign(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        payload_sha256: str = UNSIGNED_PAYLOAD,
    ) -> dict[str, str]:
        """``headers`` plus this client's signature (unchanged when it is anonymous)."""
        if self.credentials is None:
            return dict(headers or {})
        return sign_request(
            method=method,
            url=url,
            headers=headers or {},
            credentials=self.credentials,
            region=self.settings.region,
            payload_sha256=payload_sha256,
        )

    async def request(
        self,
        method: str,
        bucket: str,
        key: str = "",
        *,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        payload_sha256: str = UNSIGNED_PAYLOAD,
        timeout: float | None = None,
    ) -> httpx.Response:
        """Send one signed request and read its reply (any status).

        A refused connection is retried once for idempotent methods (a store restarting,
        a pooled connection the store closed); other transport errors are raised.
        """
        url = self.url(bucket, key, query)
        signed = self.sign(method, url, headers, payload_sha256)
        for attempt in (1, 2):
            try:
                return await self._send(method, url, signed, content, timeout)
            except httpx.ConnectError:
                if attempt == 2 or method not in _IDEMPOTENT:
                    raise
        raise AssertionError("unreachable")

    async def _send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        content: bytes | None,
        timeout: float | None,
    ) -> httpx.Response:
        """One signed request, its reply read whole: straight to the transports when the
        app gave a ``send`` (a cache hit's HEAD and GET spent more of the event loop in
        the client's machinery than on the wire), else through the client."""
        if self.send is None:
            request = self.client().build_request(method, url, headers=headers, content=content)
            if timeout is not None:
                request.extensions["timeout"] = httpx.Timeout(timeout).as_dict()
            return await self.client().send(request)
        request = httpx.Request(
            method, url, headers=headers, content=content, extensions=self._extensions(timeout)
        )
        reply = await self.send(request)
        try:
            await reply.aread()
        finally:
            await reply.aclose()
        return reply

    def _extensions(self, timeout: float | None = None) -> dict[str, Any]:
        """httpx's extensions of a request sent straight to a transport: its timeouts
        (``timeout`` for every phase, else the settings' read and connect timeouts)."""
        if timeout is not None:
            return {"timeout": _timeouts(timeout, timeout)}
        return {"timeout": _timeouts(self.settings.read_timeout_s, self.settings.connect_timeout_s)}

    @contextlib.asynccontextmanager
    async def stream(self, bucket: str, key: str) -> AsyncIterator[httpx.Response]:
        """A signed GET whose body is read as it arrives (any status)."""
        url = self.url(bucket, key)
        if self.send is None:
            async with self.client().stream("GET", url, headers=self.sign("GET", url)) as reply:
                yield reply
            return
        request = httpx.Request(
            "GET",
            url,
            headers=self.sign("GET", url),
            extensions=self._extensions(),
        )
        reply = await self.send(request)
        try:
            yield reply
        finally:
            await reply.aclose()

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
