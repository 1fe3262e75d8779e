"""The gateway's ASGI application: ``create_app(settings, upstream=..., registry=..., runner=...)``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from hapi.protocol import Placement

from ._control import ControlPlane
from ._exchange import Incoming, Outgoing
from ._metrics import Metrics
from ._observe import Observe
from ._router import Router
from ._settings import GatewaySettings
from ._store import StoreClient
from ._types import ASGIReceive, ASGISend, Scope
from .edge._proxy import Proxy
from .edge._transport import UpstreamTransport
from .pushdown._handler import Pushdown
from .pushdown._registry import AsyncRegistry
from .pushdown._resources import open_pushdown
from .pushdown._tenants import SessionFactory

CONTROL_PREFIX = "/_hapi/"


class _Upstream:
    """Holds the upstream client: an injected one (owned by the caller, usable at once),
    or one this app creates in its lifespan and closes there.

    The pass-through and the store client send straight to the client's transports
    (:meth:`exchange`): neither wants a general-purpose client's per-request machinery (URL
    merging, auth and redirect handling, cookie extraction), which cost the pass-through
    about a sixth of its CPU per small request.
    """

    def __init__(self, settings: GatewaySettings, injected: httpx.AsyncClient | None) -> None:
        self._settings = settings
        self._injected = injected
        self._client = injected
        self._transports: dict[str, httpx.AsyncBaseTransport] | None = None

    def get(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("the gateway's upstream client is used outside its lifespan")
        return self._client

    async def exchange(self, outgoing: Outgoing) -> Incoming:
        """Send ``outgoing`` (the pass-through's and the store client's requests, encoded
        already); the response's body is still to be read. Straight to the lean transport
        where it serves the scheme, else through httpx's models."""
        transport = None if self._transports is None else self._transports[outgoing.scheme]
        if isinstance(transport, UpstreamTransport):
            return await transport.exchange(outgoing)
        if transport is None:
            response = await self.get().send(outgoing.to_httpx(), stream=True)
        else:
            response = await transport.handle_async_request(outgoing.to_httpx())
        return Incoming.of(response)

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        if self._injected is not None:
            yield
            return
        transports = upstream_transports(self._settings)
        async with new_upstream_client(self._settings, transports=transports) as client:
            self._client, self._transports = client, transports
            yield
        self._client, self._transports = None, None


def upstream_transports(settings: GatewaySettings) -> dict[str, httpx.AsyncBaseTransport]:
    """The upstream transports by URL scheme: hapi's own lean one for ``http://``, httpx's
    default one for ``https://`` (TLS is not worth a second implementation)."""
    limits = httpx.Limits(
        max_connections=settings.max_upstream_connections,
        max_keepalive_connections=settings.max_upstream_connections,
        keepalive_expiry=30,
    )
    return {
        "http": UpstreamTransport(limits=limits),
        "https": httpx.AsyncHTTPTransport(limits=limits, trust_env=False),
    }


def new_upstream_client(
    settings: GatewaySettings,
    transport: httpx.AsyncBaseTransport | None = None,
    *,
    transports: dict[str, httpx.AsyncBaseTransport] | None = None,
) -> httpx.AsyncClient:
    """An HTTP client sized for proxying: pooled keep-alive connections, no redirects, and
    nothing of its own added to requests: no default headers (a proxy sends what the client
    sent; an added ``Accept-Encoding`` could make the store compress), and no cookie jar (an
    upstream ``Set-Cookie`` must not be replayed for every other user).

    ``transports`` (by scheme) are :func:`upstream_transports` unless given; ``transport``
    replaces them all (tests pass an ``httpx.MockTransport``).
    """
    timeout = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
    mounts: dict[str, httpx.AsyncBaseTransport] | None = None
    if transport is None:
        transports = transports or upstream_transports(settings)
        transport, mounts = transports["http"], {"https://": transports["https"]}
    client = httpx.AsyncClient(
        transport=transport,
        mounts=mounts,
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
    )
    for name in list(client.headers):  # the setter would put httpx's defaults back
        del client.headers[name]
    return client


class Gateway:
    """ASGI entry point: ``/_hapi/*`` and ``/metrics`` to the control plane, all else to S3.

    Its lifespan (run by the server, or ``async with gateway.lifespan(gateway)`` in tests)
    opens the upstream client and pushdown's pools and closes them.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        upstream: httpx.AsyncClient | None = None,
        *,
        registry: AsyncRegistry | None = None,
        runner: SessionFactory | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.upstream = _Upstream(settings, upstream)
        self.proxy = Proxy(settings, self.upstream.get, self.upstream.exchange)
        self.router = Router(settings, self.proxy, self.metrics)
        self.store = StoreClient.of(settings, self.upstream.get, self.upstream.exchange)
        self._registry = registry
        self._runner = runner
        self._placement = placement
        self.metrics.queued_samples.set_function(self._queued_samples)
        self.control = ControlPlane(self)
        self._observed_control = Observe(self.control, self.metrics)
        self._observed_s3 = Observe(self.router, self.metrics)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Any = None) -> AsyncIterator[None]:
        """Open the upstream client and pushdown (pools, registry, batchers); close them."""
        async with (
            self.upstream.lifespan(),
            open_pushdown(
                self.settings,
                self.store,
                self.metrics,
                registry=self._registry,
                runner=self._runner,
                placement=self._placement,
            ) as pushdown,
        ):
            self.router.pushdown = pushdown
            yield
            self.router.pushdown = None

    @property
    def pushdown(self) -> Pushdown | None:
        """Pushdown, while the lifespan runs."""
        return self.router.pushdown

    def _queued_samples(self) -> float:
        pushdown = self.router.pushdown
        return float(pushdown.tenants.queued_samples()) if pushdown is not None else 0.0

    async def __call__(self, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "lifespan":
            await self.control.app(scope, receive, send)
            return
        # Each request records its principal, signature and counters in scope["state"]: give
        # it a copy of the lifespan state of its own, as uvicorn does, whatever the server.
        scope["state"] = dict(scope.get("state") or {})
        if scope["path"].startswith(CONTROL_PREFIX) or scope["path"] == "/metrics":
            await self._observed_control(scope, receive, send)
        else:
            await self._observed_s3(scope, receive, send)


def create_app(
    settings: GatewaySettings,
    *,
    upstream: httpx.AsyncClient | None = None,
    registry: AsyncRegistry | None = None,
    runner: SessionFactory | None = None,
    placement: Placement | None = None,
) -> Gateway:
    """Build the gateway ASGI app.

    Args:
        settings: Validated settings.
        upstream: An HTTP client for the backend (tests pass one with a mock transport);
            when omitted, the app creates its own in its lifespan and closes it there.
        registry: Where manifests and blocks come from (tests pass an in-memory one); by
            default the registry bucket of the backend, read async over the upstream client
            with the backend credentials.
        runner: Builds the function that runs one batch through blocks ``[0, split)`` of a
            manifest (tests pass a fake); by default an onnxruntime session of the blocks.
        placement: Which hosts hold each object, by which pushdown's fetches are counted as
            local or remote (tests pass a fake; the caller closes it); by default the lookup
            of ``settings.placement``, made and closed in the lifespan.
    """
    return Gateway(settings, upstream, registry=registry, runner=runner, placement=placement)
