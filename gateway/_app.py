"""The gateway's ASGI application: ``create_app(settings, upstream=...)``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ._metrics import Metrics
from ._observe import Observe
from ._proxy import Proxy
from ._settings import GatewaySettings
from ._sigv4 import sign_request
from ._types import ASGIReceive, ASGISend, Scope

OPS_PREFIX = "/_hapi/"


class _Upstream:
    """Holds the upstream client: an injected one (owned by the caller, usable at once),
    or one this app creates in its lifespan and closes there."""

    def __init__(self, settings: GatewaySettings, injected: httpx.AsyncClient | None) -> None:
        self._settings = settings
        self._injected = injected
        self._client = injected

    def get(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("the gateway's upstream client is used outside its lifespan")
        return self._client

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        if self._injected is not None:
            yield
            return
        async with new_upstream_client(self._settings) as client:
            self._client = client
            yield
        self._client = None


def new_upstream_client(settings: GatewaySettings) -> httpx.AsyncClient:
    """An HTTP client sized for proxying: pooled keep-alive connections, no redirects."""
    limits = httpx.Limits(
        max_connections=settings.max_upstream_connections,
        max_keepalive_connections=settings.max_upstream_connections,
        keepalive_expiry=30,
    )
    timeout = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
    return httpx.AsyncClient(
        limits=limits, timeout=timeout, follow_redirects=False, trust_env=False
    )


class Gateway:
    """ASGI entry point: ``/_hapi/*`` and ``/metrics`` to the operations app, all else to S3."""

    def __init__(
        self, settings: GatewaySettings, upstream: httpx.AsyncClient | None = None
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.upstream = _Upstream(settings, upstream)
        self.proxy = Proxy(settings, self.upstream.get)
        self.ops = Starlette(
            routes=[
                Route("/_hapi/health", self._health),
                Route("/metrics", self._metrics),
            ],
            lifespan=self.upstream.lifespan,
        )
        self._observed_ops = Observe(self.ops, self.metrics)
        self._observed_proxy = Observe(self.proxy, self.metrics)

    async def __call__(self, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "lifespan":
            await self.ops(scope, receive, send)
        elif scope["path"].startswith(OPS_PREFIX) or scope["path"] == "/metrics":
            await self._observed_ops(scope, receive, send)
        else:
            await self._observed_proxy(scope, receive, send)

    async def _health(self, _request: Request) -> Response:
        url = self.settings.backend_url + "/"
        headers = sign_request(
            method="GET",
            url=url,
            headers={},
            credentials=self.settings.backend_credentials,
            region=self.settings.region,
        )
        try:
            reply = await self.upstream.get().get(url, headers=headers, timeout=3.0)
        except httpx.HTTPError as exc:
            return JSONResponse({"status": "degraded", "backend": f"unreachable: {exc!r}"}, 503)
        if reply.status_code >= 500:
            return JSONResponse({"status": "degraded", "backend": f"HTTP {reply.status_code}"}, 503)
        backend = "ok" if reply.status_code == 200 else f"reachable, HTTP {reply.status_code}"
        return JSONResponse({"status": "ok", "backend": backend})

    async def _metrics(self, _request: Request) -> Response:
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)


def create_app(settings: GatewaySettings, *, upstream: httpx.AsyncClient | None = None) -> Gateway:
    """Build the gateway ASGI app.

    Args:
        settings: Validated settings.
        upstream: An HTTP client for the backend (tests pass one with a mock transport);
            when omitted, the app creates its own in its lifespan and closes it there.
    """
    return Gateway(settings, upstream)
