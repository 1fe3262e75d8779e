"""The S3 pass-through: verify the client's signature, sign again upstream, stream both ways.

Bodies are never buffered whole: request bodies flow from the client through the
aws-chunked decoder into the upstream request, and response bodies flow back chunk by
chunk, with ASGI back-pressure bounding what is held in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from .._access import check_form_upload
from .._errors import AccessDenied, InvalidRequest, ServiceUnavailable
from .._exchange import Backend, Exchange, Incoming, Outgoing
from .._identities import Caller, caller_of
from .._operation import COPY_SOURCE, S3Operation
from .._settings import GatewaySettings
from .._signing import sign_target
from .._types import ASGIReceive, ASGISend, Scope, request_state
from ._chunked import decode_body
from ._form import form_boundary
from ._post_object import PostObject
from ._sigv2 import verify_presigned_v2
from ._sigv4 import Verified, verify_request

# Never forwarded: hop-by-hop headers, the client's own signature, and the aws-chunked
# framing headers (the upstream body is the decoded payload).
_DROP_REQUEST = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "transfer-encoding",
        "expect",
        "authorization",
        "x-amz-date",
        "x-amz-content-sha256",
        "x-amz-security-token",
        "x-amz-decoded-content-length",
        "x-amz-trailer",
        "x-amz-sdk-checksum-algorithm",
        "content-length",
        COPY_SOURCE,  # sent as parsed, encoded anew
    }
)
_DROP_RESPONSE = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"server", b"date"})
# Headers we sign upstream besides host and x-amz-*: the ones S3 requires to be signed.
_SIGN_EXTRA = frozenset({"content-md5", "content-type"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # an empty body is Content-Length: 0
# A rejected request's unread body up to this size is read and dropped, so its connection
# stays usable; beyond it (or when it does not come in time) the connection is closed.
_DRAIN_BYTES = 64 * 1024
_DRAIN_TIMEOUT_S = 5.0
# Query parameters that make a request signed (SigV4 presigned, or V2 presigned).
_SIGNATURE_PARAMS = frozenset(
    {"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature", "AWSAccessKeyId", "Signature"}
)


class Proxy:
    """The S3 edge: verifies who sent an operation, and forwards it upstream as them.

    The router (:mod:`hapi.gateway._router`) parses each request once, decides, and calls
    in here; nothing here reads the raw request for its meaning again.

    Args:
        settings: The gateway's settings.
        client: The upstream HTTP client (owned by the caller).
        send: Sends an upstream request and returns its response, body unread (the app's
            ``_Upstream.exchange``: the lean transport, or the injected client).
        now: Clock, injectable for tests of skew handling.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        client: Callable[[], httpx.AsyncClient],
        send: Exchange,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._settings = settings
        self._client = client
        self._send = send
        self._timeout = httpx.Timeout(
            settings.read_timeout_s, connect=settings.connect_timeout_s
        ).as_dict()
        self._backend = Backend.of(settings.backend_url)
        self._now = now
        self._post_object = PostObject(settings, client, now)

    def authenticate(self, scope: Scope, operation: S3Operation) -> Verified | None:
        """Verify the client's signature; None for an unsigned request.

        SigV4 in any form, or a legacy V2 presigned URL (what boto3 and the AWS CLI still
        presign with by default). An unsigned request goes upstream unsigned, for the
        store's ACLs and bucket policies to judge, unless anonymous requests are refused.

        Raises:
            S3Error: ``AccessDenied``, ``SignatureDoesNotMatch``, ... (see ``_sigv4``).
        """
        headers = decoded_headers(scope)
        if is_unsigned(operation):
            if not self._settings.allow_anonymous:
                raise AccessDenied("Anonymous access is refused by this gateway; sign requests.")
            return None
        if operation.presigned_v2:
            return verify_presigned_v2(
                method=operation.method,
                resource_path=operation.client_path,
                raw_query=operation.raw_query,
                headers=headers,
                secrets=self._settings.client_secrets,
                now=self._now(),
            )
        return verify_request(
            method=operation.method,
            raw_path=operation.raw_path,
            raw_query=operation.raw_query,
            headers=headers,
            secrets=self._settings.client_secrets,
            now=self._now(),
            max_skew=timedelta(seconds=self._settings.max_skew_s),
            region=self._settings.region,
        )

    def caller(self, verified: Verified | None) -> Caller:
        """Who a request is: the key it was verified with, or the anonymous caller."""
        if verified is None:
            return Caller.anonymous()
        settings = self._settings
        return caller_of(verified.access_key_id, settings.clients, settings.backend_credentials)

    async def form_upload(
        self, scope: Scope, receive: ASGIReceive, send: ASGISend, operation: S3Operation
    ) -> bool:
        """Serve a browser form upload (POST Object); False for any other request."""
        if operation.name != "PostObject" or not is_unsigned(operation):
            return False
        boundary = form_boundary(operation.headers.get("content-type", ""))
        if boundary is None:
            return False

        async def forward_unsigned(replay: ASGIReceive) -> None:
            self.authenticate(scope, operation)  # refuses it if anonymous requests are
            caller = Caller.anonymous()
            check_form_upload(caller, self._settings, operation.bucket)
            await self.forward(
                scope, replay, send, operation=operation, verified=None, caller=caller
            )

        await self._post_object(
            scope,
            receive,
            send,
            bucket=operation.bucket,
            boundary=boundary,
            forward_unsigned=forward_unsigned,
        )
        return True

    async def read_body(
        self, scope: Scope, receive: ASGIReceive, verified: Verified | None, *, max_bytes: int
    ) -> bytes:
        """The whole verified body of a small request (a pushdown batch).

        Raises:
            InvalidRequest: It has no Content-Length, or one over ``max_bytes``.
        """
        headers = decoded_headers(scope)
        length = _payload_length(headers, verified)
        if length is None or length > max_bytes:
            raise InvalidRequest(
                f"a hapi-batch body needs a Content-Length of at most {max_bytes} bytes"
            )
        parts = [
            piece
            async for piece in decode_body(
                _receive_body(receive, request_state(scope)),
                verified,
                content_length=length,
                headers=dict(headers),
            )
        ]
        return b"".join(parts)

    async def forward(
        self,
        scope: Scope,
        receive: ASGIReceive,
        send: ASGISend,
        *,
        operation: S3Operation,
        verified: Verified | None,
        caller: Caller,
    ) -> None:
        """Send the operation upstream, as ``caller``'s store identity, and stream the
        response back.

        Nothing goes upstream before the body's first verified piece is in hand (the whole
        body, when it fits one read): a request head followed by the connection's end is,
        for some stores (SeaweedFS), an empty object, so a body rejected or abandoned
        early must never have had its head sent.
        """
        length, content = await self._upstream_body(scope, receive, verified)
        request = self._upstream_request(operation, caller, length, content)
        try:
            response = await self._send(request)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"the backend store at {self._settings.backend_url} cannot be reached: {exc!r}",
                resource=request_state(scope).get("resource", ""),
                retry_after=1,
            ) from exc
        try:
            await _relay(response, send)
        finally:
            await response.body.aclose()

    async def _upstream_body(
        self, scope: Scope, receive: ASGIReceive, verified: Verified | None
    ) -> tuple[int | None, AsyncIterator[bytes] | None]:
        """The payload's length and its verified pieces, the first one already read.

        Raises:
            S3Error: The body failed verification before its first piece was complete.
            ConnectionAbortedError: The client went away first.
        """
        headers = decoded_headers(scope)
        length = _payload_length(headers, verified)
        if length is None and not _has_body(headers):
            return None, None
        # Transfer-Encoding: chunked without a length streams on, chunked upstream.
        pieces = decode_body(
            _receive_body(receive, request_state(scope)),
            verified,
            content_length=length,
            headers=dict(headers),
            # CompleteMultipartUpload's checksum headers describe the whole object.
            check_header_checksums=request_state(scope).get("operation")
            != "CompleteMultipartUpload",
        )
        return length, await _primed(pieces)

    def _upstream_request(
        self,
        operation: S3Operation,
        caller: Caller,
        length: int | None,
        content: AsyncIterator[bytes] | None,
    ) -> Outgoing:
        """The upstream request, built from the parsed operation: its path, query and copy
        source encoded anew, its headers the parsed ones (one value a name)."""
        path = self._backend.prefix + operation.upstream_path()
        query = operation.upstream_query()
        to_sign: dict[str, str] = {}
        plain: dict[str, str] = {}
        for name, value in operation.headers.items():
            if name in _DROP_REQUEST:
                continue
            if name == "content-encoding":
                value = without_aws_chunked(value)
                if not value:
                    continue
            bucket = to_sign if name.startswith("x-amz-") or name in _SIGN_EXTRA else plain
            bucket[name] = value
        if operation.copy_source is not None:
            to_sign[COPY_SOURCE] = operation.copy_source.header
        if length is not None:
            plain["content-length"] = str(length)
        elif content is not None:
            plain["transfer-encoding"] = "chunked"
        elif operation.method in _BODY_METHODS:
            plain["content-length"] = "0"
        to_sign.setdefault("host", self._backend.host_header)
        # Signed as the caller's own store identity; an anonymous caller's request goes
        # unsigned (the backend's credentials never sign for it).
        signed = (
            to_sign
            if caller.upstream is None
            else sign_target(
                method=operation.method,
                host=self._backend.host_header,
                path=path,
                query=query,
                headers=to_sign,
                credentials=caller.upstream,
                region=self._settings.region,
                now=self._now(),
            )
        )
        return Outgoing(
            operation.method,
            self._backend.scheme,
            self._backend.host,
            self._backend.port,
            (path + "?" + query if query else path).encode("ascii"),
            _latin1({**plain, **signed}),
            content,
            self._timeout,
        )


async def _primed(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes] | None:
    """``pieces`` with its first piece already read; None for an empty payload.

    ``decode_body`` holds back its last piece until the whole body is verified, so the
    first piece exists only once the body is verified or more of it has arrived.
    """
    try:
        first = await anext(pieces)
    except StopAsyncIteration:
        return None

    async def chained() -> AsyncIterator[bytes]:
        yield first
        async for piece in pieces:
            yield piece

    return chained()


async def _relay(response: Incoming, send: ASGISend) -> None:
    headers, length = [], -1
    for name, value in response.headers:
        lower = name.lower()
        if lower == b"content-length" and value.isdigit():
            length = int(value)
        if lower not in _DROP_RESPONSE:
            headers.append((name, value))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    # The chunk that completes a known length ends the response: no extra empty message.
    # The raw stream as the transport yields it: no decoding, no re-chunking.
    sent = 0
    async for chunk in response.body:
        sent += len(chunk)
        await send({"type": "http.response.body", "body": chunk, "more_body": sent != length})
    if sent != length or not sent:
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _receive_body(receive: ASGIReceive, state: dict[str, Any]) -> AsyncIterator[bytes]:
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("client disconnected during upload")
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        state["body_done"] = not more  # before the yield: its consumer may stop there
        if chunk:
            received += len(chunk)
            state["received"] = received
            yield chunk
        if not more:
            return


async def settle_body(scope: Scope, receive: ASGIReceive) -> None:
    """Leave the connection ready for its next request before an error answers this one.

    A body left unread would be parsed as the next request: a small one is read and
    dropped, a large one (or one that does not come) makes the answer close the connection.
    """
    state = request_state(scope)
    headers = decoded_headers(scope)
    if state.get("body_done") or not _declares_body(headers):
        return
    left = _DRAIN_BYTES + 1
    for name, value in headers:
        if name == "content-length" and value.isdigit():
            left = int(value) - state.get("received", 0)
    if left <= 0:
        return
    try:
        if left > _DRAIN_BYTES:
            raise TimeoutError
        async with asyncio.timeout(_DRAIN_TIMEOUT_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect" or not message.get("more_body"):
                    return
    except TimeoutError:
        state["close_connection"] = True


def decoded_headers(scope: Scope) -> list[tuple[str, str]]:
    state = request_state(scope)
    cached: list[tuple[str, str]] | None = state.get("headers")
    if cached is None:
        cached = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in scope["headers"]]
        state["headers"] = cached
    return cached


def is_unsigned(operation: S3Operation) -> bool:
    """Whether a request carries no signature at all: no Authorization, no presign query."""
    if "authorization" in operation.headers:
        return False
    return not operation.query_names() & _SIGNATURE_PARAMS


def _latin1(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    # Values hold the client's bytes decoded as latin-1; send those bytes back unchanged.
    return [(name.encode(), value.encode("latin-1")) for name, value in headers.items()]


def without_aws_chunked(encoding: str) -> str:
    """A Content-Encoding with the ``aws-chunked`` token removed and the rest as written."""
    if "aws-chunked" not in encoding:
        return encoding
    kept = [part for part in encoding.split(",") if part.strip() != "aws-chunked"]
    return ",".join(kept).strip()


def _payload_length(headers: Sequence[tuple[str, str]], verified: Verified | None) -> int | None:
    if verified is not None and verified.decoded_content_length is not None:
        return verified.decoded_content_length
    for name, value in headers:
        if name == "content-length":
            try:
                return int(value)
            except ValueError as exc:
                raise InvalidRequest(f"Content-Length is not a number: {value!r}") from exc
    return None


def _has_body(headers: Sequence[tuple[str, str]]) -> bool:
    return any(name == "transfer-encoding" for name, _ in headers)


def _declares_body(headers: Sequence[tuple[str, str]]) -> bool:
    return any(
        name == "transfer-encoding" or (name == "content-length" and value.strip() != "0")
        for name, value in headers
    )
