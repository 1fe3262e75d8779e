"""The one place where exceptions become S3 XML, plus access logs and metrics.

Every request passes through :class:`Observe`: it assigns a request id, turns an
:class:`~hapi.gateway._errors.S3Error` raised before the response started into an S3 XML
error response, and, once the response is done, writes one access-log line and records
the request in the metrics. An error after the response started cannot be reported in
the body any more: the connection is dropped, so a truncated body never looks complete.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any
from xml.sax.saxutils import escape

from ._errors import S3Error, ServiceUnavailable
from ._metrics import Metrics
from ._types import ASGIApp, ASGIReceive, ASGISend, Message, Scope, request_state

log = logging.getLogger("hapi.gateway.access")
errors_log = logging.getLogger("hapi.gateway")


class InternalError(S3Error):
    """An unexpected failure inside the gateway."""

    code = "InternalError"
    status = 500


class RequestIds:
    """Request ids: 20 upper-case hex digits, unique across processes and restarts (a
    random prefix per process, then a counter), at a fraction of a uuid4's cost."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex().upper()
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):012X}"


def error_body(exc: S3Error, request_id: str) -> bytes:
    """S3-style XML for an error."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{exc.code}</Code><Message>{escape(exc.message)}</Message>"
        f"<Resource>{escape(exc.resource)}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()


class Observe:
    """ASGI middleware: request ids, S3 XML errors, access log, metrics."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self._app = app
        self._metrics = metrics
        self._ids = RequestIds()

    async def __call__(self, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        state = request_state(scope)
        state["request_id"] = request_id = self._ids.next()
        started = time.perf_counter()
        response_started = False
        self._metrics.requests_in_flight += 1

        async def tracked_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.body":
                state["sent"] = state.get("sent", 0) + len(message.get("body", b""))
            elif message["type"] == "http.response.start":
                response_started = True
                state["status"] = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-hapi-request-id", request_id.encode()),
                ]
            await send(message)

        try:
            await self._app(scope, receive, tracked_send)
        except ConnectionAbortedError:
            state["status"] = 499  # the client went away; nobody is left to answer
        except Exception as exc:
            if isinstance(exc, ServiceUnavailable):
                self._metrics.upstream_errors.labels("unreachable").inc()
            if response_started:
                self._metrics.upstream_errors.labels("aborted").inc()
                state["status"] = 599  # aborted mid-body: the client sees a broken connection
                errors_log.warning("request %s aborted mid-response: %r", request_id, exc)
                raise
            await self._send_error(send, _as_s3_error(exc, state), state)
        finally:
            self._metrics.requests_in_flight -= 1
            self._finish(scope, state, time.perf_counter() - started)

    async def _send_error(self, send: ASGISend, exc: S3Error, state: dict[str, Any]) -> None:
        body = error_body(exc, state["request_id"])
        headers = [
            (b"content-type", b"application/xml"),
            (b"content-length", str(len(body)).encode()),
            (b"x-hapi-request-id", state["request_id"].encode()),
        ]
        if exc.retry_after is not None:
            headers.append((b"retry-after", str(exc.retry_after).encode()))
        if state.get("close_connection"):  # an unread request body is still on it
            headers.append((b"connection", b"close"))
        state["status"] = exc.status
        state["error"] = exc.code
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _finish(self, scope: Scope, state: dict[str, Any], seconds: float) -> None:
        operation = state.get(
            "operation", "Hapi" if scope["path"].startswith("/_hapi") else "Unknown"
        )
        status = state.get("status", 500)
        sent, received = state.get("sent", 0), state.get("received", 0)
        self._metrics.observe(operation, status, seconds, sent, received)
        # The resource and caller as the request was parsed and verified (the one reading
        # every decision used), else the path as received.
        log.info(
            "%s %s %s %s status=%d sent=%d received=%d ms=%.2f%s%s",
            state["request_id"],
            operation,
            scope["method"],
            state.get("resource", scope["path"]),
            status,
            sent,
            received,
            seconds * 1000,
            f" caller={state['caller']}" if "caller" in state else "",
            f" error={state['error']}" if "error" in state else "",
        )


async def s3_error_handler(request: Any, exc: Exception) -> Any:
    """Starlette exception handler for the operations routes: the same XML as above.

    Starlette answers unhandled exceptions itself before :class:`Observe` sees them, so
    its routes get this handler; the body comes from :func:`error_body` all the same.
    """
    from starlette.responses import Response

    state = request.scope.setdefault("state", {})
    error = _as_s3_error(exc, state)
    state["status"], state["error"] = error.status, error.code
    headers = {"retry-after": str(error.retry_after)} if error.retry_after is not None else {}
    return Response(
        error_body(error, state.get("request_id", "")), error.status, headers, "application/xml"
    )


def _as_s3_error(exc: Exception, state: dict[str, Any]) -> S3Error:
    if isinstance(exc, S3Error):
        if not exc.resource:
            exc.resource = state.get("resource", "")
        return exc
    errors_log.exception("request %s failed", state.get("request_id"))
    return InternalError(
        f"internal error ({type(exc).__name__}); see the gateway log for request "
        f"{state.get('request_id')}",
        resource=state.get("resource", ""),
    )
