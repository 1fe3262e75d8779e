"""The control plane: ``/_hapi/*`` and ``/metrics``, a FastAPI sub-application.

FastAPI earns its place here (typed response models, an OpenAPI document at
``/_hapi/openapi.json``, interactive docs at ``/_hapi/docs``, validated query
parameters); the S3 data plane stays a lean ASGI path without framework routing.

Who may call what: ``/_hapi/live`` and ``/_hapi/health`` are open and answer up or down,
nothing more. Everything else, the OpenAPI document and the docs included, needs a
request SigV4-signed by a configured client credential (checked by the same verifier as
the data plane), unless the operator made it public (``public_control``,
``public_metrics``). The bandwidth probe is capped per call and metered per credential.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

import httpx
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from hapi.models import Manifest, ModelError
from hapi.protocol import (
    BlockProfile,
    GatewayStats,
    ModelProfile,
    ModelSummary,
    StorageProfile,
)

from ._errors import InvalidArgument, S3Error, ServiceUnavailable, SlowDown
from ._metrics import ALL_IDENTITIES, Metrics
from ._observe import s3_error_handler
from ._types import ASGIReceive, ASGISend, Scope, request_state
from .edge._sigv4 import verify_request

if TYPE_CHECKING:
    from ._settings import GatewaySettings
    from ._store import StoreClient
    from .pushdown._handler import Pushdown


class Gateway(Protocol):
    """What the control plane reads of the app it serves (``_app.Gateway`` is one)."""

    settings: GatewaySettings
    metrics: Metrics
    store: StoreClient

    @property
    def pushdown(self) -> Pushdown | None: ...

    def lifespan(self, app: Any = None) -> contextlib.AbstractAsyncContextManager[None]: ...


OPEN_PATHS = frozenset({"/_hapi/live", "/_hapi/health"})
METRICS_PATH = "/metrics"
DEFAULT_PROBE_BYTES = 64 * 1024**2
_PROBE_CHUNK = bytes(256 * 1024)


class Status(BaseModel):
    """Up or down, and nothing else (the open endpoints reveal no details)."""

    status: Literal["alive", "ok", "degraded"]


class ProbeMeter:
    """Probe bytes per credential per minute: a token bucket for each caller.

    Args:
        per_minute: Bytes one caller may draw per minute (also the burst).
        clock: Seconds, monotonic (injectable for tests).
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._capacity = float(per_minute)
        self._rate = per_minute / 60.0
        self._clock = clock
        self._levels: dict[str, tuple[float, float]] = {}

    def take(self, caller: str, size: int) -> None:
        """Draw ``size`` bytes for ``caller``.

        Raises:
            SlowDown: Not enough left; ``Retry-After`` says when there will be.
        """
        now = self._clock()
        level, then = self._levels.get(caller, (self._capacity, now))
        level = min(self._capacity, level + (now - then) * self._rate)
        if size > level:
            wait = math.ceil((size - level) / self._rate)
            raise SlowDown(
                f"probe rate exceeded: {self._capacity:.0f} bytes per minute per credential",
                retry_after=max(1, wait),
            )
        self._levels[caller] = (level - size, now)
        if len(self._levels) > 4096:  # callers at full allowance need no record
            self._levels = {k: v for k, v in self._levels.items() if v[0] < self._capacity}


class ControlPlane:
    """ASGI app for the control paths: authentication first, then the FastAPI routes."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._settings = gateway.settings
        self.meter = ProbeMeter(gateway.settings.probe_bytes_per_minute)
        self.app = _fastapi(gateway, self.meter)

    async def __call__(self, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "http":
            request_state(scope)["principal"] = self.authenticate(scope)
        await self.app(scope, receive, send)

    def authenticate(self, scope: Scope) -> str:
        """Who is calling: the verified access key id, or the client address where open.

        Raises:
            S3Error: ``AccessDenied``, ``SignatureDoesNotMatch``, ... (see ``_sigv4``).
        """
        path = scope["path"]
        public = (
            self._settings.public_metrics if path == METRICS_PATH else self._settings.public_control
        )
        if path in OPEN_PATHS or public:
            client = scope.get("client")
            return f"address:{client[0]}" if client else "address:unknown"
        headers = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in scope["headers"]]
        verified = verify_request(
            method=scope["method"],
            raw_path=(scope.get("raw_path") or scope["path"].encode()).decode("latin-1"),
            raw_query=scope["query_string"].decode("latin-1"),
            headers=headers,
            secrets=self._settings.client_secrets,
            max_skew=timedelta(seconds=self._settings.max_skew_s),
        )
        return verified.access_key_id


def _fastapi(gateway: Gateway, meter: ProbeMeter) -> FastAPI:
    app = FastAPI(
        title="hapi gateway control plane",
        summary="Health, models, batching figures, bandwidth probe and metrics.",
        openapi_url="/_hapi/openapi.json",
        docs_url="/_hapi/docs",
        redoc_url=None,
        lifespan=gateway.lifespan,
    )
    app.add_exception_handler(S3Error, s3_error_handler)
    app.add_exception_handler(RequestValidationError, _invalid_argument)
    app.add_exception_handler(HTTPException, _route_error)
    _health_routes(app, gateway)
    _model_routes(app, gateway)
    _probe_route(app, gateway, meter)
    return app


def _health_routes(app: FastAPI, gateway: Gateway) -> None:
    @app.get("/_hapi/live", response_model=Status)
    async def live() -> Status:
        """The event loop answers; the store is not asked."""
        return Status(status="alive")

    @app.get("/_hapi/health", response_model=Status, responses={503: {"model": Status}})
    async def health() -> Response:
        """Ready when the store answers (503 ``degraded`` otherwise)."""
        up = await _backend_up(gateway)
        return JSONResponse({"status": "ok" if up else "degraded"}, 200 if up else 503)

    @app.get(METRICS_PATH, response_class=Response)
    async def metrics(request: Request) -> Response:
        """Prometheus text exposition: every identity's series for an admin key, a
        client key's own, none on a public page."""
        principal = request.scope["state"].get("principal", "")
        key = gateway.settings.clients.get(principal)
        if key is not None and key.role == "admin":
            shown: str | None = ALL_IDENTITIES
        else:
            shown = principal if key is not None else None
        body, content_type = gateway.metrics.render(shown)
        return Response(body, media_type=content_type)


async def _backend_up(gateway: Gateway) -> bool:
    try:
        reply = await gateway.store.request("GET", "", timeout=3.0)
    except httpx.HTTPError:
        return False
    return reply.status_code < 500


def _model_routes(app: FastAPI, gateway: Gateway) -> None:
    @app.get("/_hapi/models", response_model=list[ModelSummary])
    async def models() -> list[ModelSummary]:
        """The latest version of every registered model."""
        registry = _pushdown(gateway).tenants.registry
        try:
            manifests = await registry.list_models()
        except ModelError as exc:
            raise ServiceUnavailable(
                f"the model registry cannot be read: {exc}", retry_after=1
            ) from exc
        return [_summary(manifest) for manifest in manifests]

    @app.get("/_hapi/models/{name:path}", response_model=ModelProfile)
    async def model(name: str) -> ModelProfile:
        """One model (``NAME`` or ``NAME@VERSION``): its blocks, the storage side's measured
        profile (per block, decode, load; each figure with its source and age) and the
        tenants serving it."""
        tenants = _pushdown(gateway).tenants
        manifest = await tenants.manifest(name)
        return _profile(manifest, tenants.stats(), await tenants.profiler.current(manifest))

    @app.get("/_hapi/stats", response_model=GatewayStats)
    async def stats() -> GatewayStats:
        """The memory budget and every tenant's batching figures."""
        return _pushdown(gateway).tenants.stats()


def _probe_route(app: FastAPI, gateway: Gateway, meter: ProbeMeter) -> None:
    cap = gateway.settings.max_probe_bytes

    @app.get("/_hapi/probe", response_class=StreamingResponse)
    async def probe(
        request: Request, size: int = Query(DEFAULT_PROBE_BYTES, alias="bytes")
    ) -> StreamingResponse:
        """``bytes`` zeros, to time the link (capped per call, metered per credential)."""
        if not 0 < size <= cap:
            raise InvalidArgument(f"bytes must be in 1..{cap} (the gateway's probe cap)")
        meter.take(request.scope["state"]["principal"], size)
        return StreamingResponse(
            _zeros(size),
            media_type="application/octet-stream",
            headers={"content-length": str(size), "cache-control": "no-store"},
        )


def _pushdown(gateway: Gateway) -> Pushdown:
    pushdown = gateway.pushdown
    if pushdown is None:
        raise ServiceUnavailable(
            "pushdown is not running (the gateway is starting or stopping)", retry_after=1
        )
    return pushdown


async def _invalid_argument(request: Request, exc: Exception) -> Response:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    where = ", ".join(str(e.get("loc", ("?",))[-1]) for e in errors) or "the request"
    error = InvalidArgument(f"{where}: not a valid value")
    response: Response = await s3_error_handler(request, error)
    return response


class _RouteError(S3Error):
    """No such control route, or not with this method."""


async def _route_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    error = _RouteError(f"no control endpoint {request.method} {request.url.path}")
    error.code, error.status = ("MethodNotAllowed", 405) if status == 405 else ("NotFound", 404)
    response: Response = await s3_error_handler(request, error)
    return response


async def _zeros(size: int) -> AsyncIterator[bytes]:
    while size > 0:
        chunk = _PROBE_CHUNK[: min(size, len(_PROBE_CHUNK))]
        size -= len(chunk)
        yield chunk


def _summary(manifest: Manifest) -> ModelSummary:
    """One entry of ``GET /_hapi/models``."""
    return ModelSummary(**_summary_fields(manifest), blocks=len(manifest.blocks))


def _profile(manifest: Manifest, stats: GatewayStats, storage: StorageProfile) -> ModelProfile:
    """The profile of ``manifest``, with its storage-side times and the tenants of ``stats``
    that serve it."""
    return ModelProfile(
        **_summary_fields(manifest),
        blocks=[BlockProfile(**dataclasses.asdict(block)) for block in manifest.blocks],
        preprocess=manifest.preprocess.to_dict(),
        served=[t for t in stats.tenants if t.serves(manifest.ref)],
        storage=storage,
    )


def _summary_fields(manifest: Manifest) -> dict[str, Any]:
    return {
        "name": manifest.name,
        "version": manifest.version,
        "ref": manifest.ref,
        "family": manifest.family,
        "freeze": manifest.freeze,
        "bytes": manifest.size,
        "parent": manifest.parent,
        "created": manifest.created,
    }
