"""Every S3 request's one path: read it once, decide once, hand it to one half.

The request becomes an :class:`~._operation.S3Operation` before anything else looks at it;
then its caller is verified (the S3 edge), the access decision is made on the operation
(:mod:`._access`), and the operation goes either to pushdown (``GetFeatures``,
``HapiBatch``) or through the pass-through, which builds the upstream request from the same
operation. The two halves never import each other; this module is the only place that
knows both.
"""

from __future__ import annotations

import ipaddress

from ._access import check_access
from ._errors import ServiceUnavailable
from ._identities import Caller
from ._limits import InFlight
from ._metrics import Metrics
from ._operation import S3Operation, parse_operation
from ._settings import GatewaySettings
from ._types import ASGIReceive, ASGISend, Scope, request_state
from .edge._proxy import Proxy, decoded_headers, settle_body
from .edge._sigv4 import Verified
from .pushdown._handler import Pushdown
from .pushdown._params import MAX_BATCH_BODY


class Router:
    """ASGI handler for every S3 request (everything but ``/_hapi/*`` and ``/metrics``).

    Args:
        settings: The gateway's settings.
        proxy: The S3 edge: signatures, form uploads, the pass-through.
        metrics: Where refusals for an identity's bounds are counted.
    """

    def __init__(
        self, settings: GatewaySettings, proxy: Proxy, metrics: Metrics | None = None
    ) -> None:
        self._settings = settings
        self.proxy = proxy
        self.pushdown: Pushdown | None = None  # set for the app's lifespan
        self.upstream_in_flight = InFlight(
            settings.identity_upstream_requests,
            bound="upstream",
            setting="HAPI_IDENTITY_UPSTREAM_REQUESTS",
            metrics=metrics,
        )
        self.pushdown_in_flight = InFlight(
            settings.identity_pushdown_requests,
            bound="pushdown",
            setting="HAPI_IDENTITY_PUSHDOWN_REQUESTS",
            metrics=metrics,
        )

    async def __call__(self, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        try:
            await self._serve(scope, receive, send)
        except ConnectionAbortedError:
            raise
        except Exception:
            if "status" not in request_state(scope):  # the error response is still to come
                await settle_body(scope, receive)
            raise

    def parse(self, scope: Scope) -> S3Operation:
        """The operation a request is (the one reading every later step uses).

        Raises:
            S3Error: The request can be read more than one way.
        """
        raw_path = scope.get("raw_path") or scope["path"].encode()
        return parse_operation(
            scope["method"],
            raw_path.decode("latin-1"),
            scope["query_string"].decode("latin-1"),
            decoded_headers(scope),
            self._settings.virtual_host_domains,
        )

    async def _serve(self, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        operation = self.parse(scope)
        state = request_state(scope)
        state["operation"], state["resource"] = operation.name, operation.resource
        if await self.proxy.form_upload(scope, receive, send, operation):
            return
        verified = self.proxy.authenticate(scope, operation)
        caller = self.proxy.caller(verified)
        state["caller"] = caller.name
        check_access(caller, self._settings, operation)
        if operation.is_pushdown:
            with self.pushdown_in_flight.hold(caller.name):
                await self._pushdown(scope, receive, send, operation, verified, caller)
            return
        with self.upstream_in_flight.hold(caller.name):
            await self.proxy.forward(
                scope, receive, send, operation=operation, verified=verified, caller=caller
            )

    async def _pushdown(
        self,
        scope: Scope,
        receive: ASGIReceive,
        send: ASGISend,
        operation: S3Operation,
        verified: Verified | None,
        caller: Caller,
    ) -> None:
        if self.pushdown is None:
            raise ServiceUnavailable("pushdown is not running yet", retry_after=1)
        pushdown = self.pushdown.acting_as(caller)
        colocated = _loopback_client(scope)
        if operation.name == "GetFeatures":
            await pushdown.get(
                send, receive, operation.bucket, operation.key, operation.hapi, colocated=colocated
            )
            return
        body = await self.proxy.read_body(scope, receive, verified, max_bytes=MAX_BATCH_BODY)
        await pushdown.batch(
            send, receive, operation.bucket, body, operation.hapi, colocated=colocated
        )


def _loopback_client(scope: Scope) -> bool:
    """Whether the client connected from this machine (then it shares our cores)."""
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(str(client[0]).split("%")[0]).is_loopback
    except ValueError:
        return False
