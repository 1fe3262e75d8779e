"""Operations endpoints under ``/_hapi/`` and ``/metrics`` (JSON or Prometheus text)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ._errors import InvalidArgument, ServiceUnavailable
from ._sigv4 import sign_request

if TYPE_CHECKING:
    from ._app import Gateway

MAX_PROBE_BYTES = 1024**3
_PROBE_CHUNK = bytes(256 * 1024)


def ops_routes(gateway: Gateway) -> list[Route]:
    """The operations routes of one gateway."""

    async def health(_request: Request) -> Response:
        settings = gateway.settings
        url = settings.backend_url + "/"
        headers = sign_request(
            method="GET",
            url=url,
            headers={},
            credentials=settings.backend_credentials,
            region=settings.region,
        )
        try:
            reply = await gateway.upstream.get().get(url, headers=headers, timeout=3.0)
        except httpx.HTTPError as exc:
            return JSONResponse({"status": "degraded", "backend": f"unreachable: {exc!r}"}, 503)
        if reply.status_code >= 500:
            return JSONResponse({"status": "degraded", "backend": f"HTTP {reply.status_code}"}, 503)
        backend = "ok" if reply.status_code == 200 else f"reachable, HTTP {reply.status_code}"
        return JSONResponse({"status": "ok", "backend": backend})

    async def live(_request: Request) -> Response:
        return JSONResponse({"status": "alive"})  # the event loop answers; the store is not asked

    async def metrics(_request: Request) -> Response:
        body, content_type = gateway.metrics.render()
        return Response(body, media_type=content_type)

    async def models(_request: Request) -> Response:
        registry = _pushdown(gateway).tenants.registry
        manifests = await asyncio.to_thread(registry.list_models)
        return JSONResponse([_model_summary(m) for m in manifests])

    async def model(request: Request) -> Response:
        manifest = await _pushdown(gateway).tenants.manifest(request.path_params["name"])
        data = _model_summary(manifest)
        data["blocks"] = [dataclasses.asdict(block) for block in manifest.blocks]
        data["preprocess"] = manifest.preprocess.to_dict()
        data["served"] = [
            t
            for t in _pushdown(gateway).tenants.stats()["tenants"]
            if any(s.startswith(manifest.ref + ":") for s in t["served_as"])
        ]
        return JSONResponse(data)

    async def stats(_request: Request) -> Response:
        return JSONResponse(_pushdown(gateway).tenants.stats())

    async def probe(request: Request) -> Response:
        try:
            size = int(request.query_params.get("bytes", str(64 * 1024**2)))
        except ValueError:
            raise InvalidArgument("bytes must be an integer") from None
        if not 0 < size <= MAX_PROBE_BYTES:
            raise InvalidArgument(f"bytes must be in 1..{MAX_PROBE_BYTES}")
        return StreamingResponse(
            _zeros(size),
            media_type="application/octet-stream",
            headers={"content-length": str(size), "cache-control": "no-store"},
        )

    return [
        Route("/_hapi/health", health),
        Route("/_hapi/live", live),
        Route("/metrics", metrics),
        Route("/_hapi/models", models),
        Route("/_hapi/models/{name:path}", model),
        Route("/_hapi/stats", stats),
        Route("/_hapi/probe", probe),
    ]


def _pushdown(gateway: Gateway) -> Any:
    if gateway.proxy.pushdown is None:
        raise ServiceUnavailable(
            "pushdown is not running (the gateway is starting or stopping)", retry_after=1
        )
    return gateway.proxy.pushdown


def _model_summary(manifest: Any) -> dict[str, Any]:
    return {
        "name": manifest.name,
        "version": manifest.version,
        "ref": manifest.ref,
        "family": manifest.family,
        "freeze": manifest.freeze,
        "blocks": len(manifest.blocks),
        "bytes": manifest.size,
        "parent": manifest.parent,
        "created": manifest.created,
    }


async def _zeros(size: int) -> AsyncIterator[bytes]:
    while size > 0:
        chunk = _PROBE_CHUNK[: min(size, len(_PROBE_CHUNK))]
        size -= len(chunk)
        yield chunk
