"""The S3 pass-through: verify the client's signature, sign again upstream, stream both ways.

Bodies are never buffered whole: request bodies flow from the client through the
aws-chunked decoder into the upstream request, and response bodies flow back chunk by
chunk, with ASGI back-pressure bounding what is held in memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx

from ._addressing import Target, resolve
from ._chunked import decode_body
from ._errors import InvalidRequest, ServiceUnavailable
from ._operations import classify
from ._pushdown import Pushdown, parse_params
from ._settings import GatewaySettings
from ._sigv2 import QUERY_PARAMS as V2_PARAMS
from ._sigv2 import is_presigned_v2, verify_presigned_v2
from ._sigv4 import Verified, canonical_query_string, sign_request, verify_request
from ._types import ASGIReceive, ASGISend, Scope, request_state

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
    }
)
_DROP_RESPONSE = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"server", b"date"})
# Headers we sign upstream besides host and x-amz-*: the ones S3 requires to be signed.
_SIGN_EXTRA = frozenset({"content-md5", "content-type"})


class Proxy:
    """ASGI handler for every S3 request that is not a pushdown.

    Args:
        settings: The gateway's settings.
        client: The upstream HTTP client (owned by the caller).
        now: Clock, injectable for tests of skew handling.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        client: Callable[[], httpx.AsyncClient],
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._settings = settings
        self._client = client
        self._now = now
        self.pushdown: Pushdown | None = None

    def authenticate(self, scope: Scope, target: Target) -> Verified | None:
        """Verify the client's signature; None for an allowed anonymous request.

        SigV4 in any form, or a legacy V2 presigned URL (what boto3 and the AWS CLI still
        presign with by default).

        Raises:
            S3Error: ``AccessDenied``, ``SignatureDoesNotMatch``, ... (see ``_sigv4``).
        """
        headers = _decoded_headers(scope)
        if self._settings.allow_anonymous and _is_anonymous(scope, headers):
            return None
        raw_path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        raw_query = scope["query_string"].decode("latin-1")
        if is_presigned_v2(raw_query):
            resource = (
                raw_path
                if raw_path.startswith(f"/{target.bucket}")
                else f"/{target.bucket}{raw_path}"
            )
            return verify_presigned_v2(
                method=scope["method"],
                resource_path=resource if target.bucket else raw_path,
                raw_query=raw_query,
                headers=headers,
                secrets=self._settings.client_secrets,
                now=self._now(),
            )
        return verify_request(
            method=scope["method"],
            raw_path=raw_path,
            raw_query=raw_query,
            headers=headers,
            secrets=self._settings.client_secrets,
            now=self._now(),
        )

    def target(self, scope: Scope) -> Target:
        """The bucket and key of a request."""
        host = ""
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
                break
        raw_path = scope.get("raw_path") or scope["path"].encode()
        return resolve(raw_path.decode("latin-1"), host, self._settings.virtual_host_domains)

    async def __call__(self, scope: Scope, receive: ASGIReceive, send: ASGISend) -> None:
        target = self.target(scope)
        state = request_state(scope)
        headers = _decoded_headers(scope)
        names = {name for name, _ in headers}
        query = scope["query_string"].decode("latin-1")
        state["operation"] = classify(
            scope["method"], target.bucket, target.key, _query_names(query), names
        )
        state["resource"] = f"/{target.bucket}/{target.key}" if target.bucket else "/"
        verified = self.authenticate(scope, target)
        if self.pushdown is not None and await self._pushdown(
            scope, receive, send, target, verified
        ):
            return
        await self.forward(scope, receive, send, target=target, verified=verified)

    async def _pushdown(
        self,
        scope: Scope,
        receive: ASGIReceive,
        send: ASGISend,
        target: Target,
        verified: Verified | None,
    ) -> bool:
        """Serve the request by pushdown if it asks for it; False for a plain request."""
        assert self.pushdown is not None
        state = request_state(scope)
        method, query = scope["method"], scope["query_string"].decode("latin-1")
        if method == "GET" and target.key:
            params = parse_params(dict(_decoded_headers(scope)), query)
            if params is None:
                return False
            state["operation"] = "GetFeatures"
            await self.pushdown.get(send, receive, target.bucket, target.key, params)
            return True
        if (
            method == "POST"
            and target.bucket
            and not target.key
            and "hapi-batch" in _query_names(query)
        ):
            body = await self._read_body(scope, receive, verified)
            headers = dict(_decoded_headers(scope))
            await self.pushdown.batch(
                send, receive, target.bucket, body, headers=headers, query=query
            )
            return True
        return False

    async def _read_body(
        self, scope: Scope, receive: ASGIReceive, verified: Verified | None
    ) -> bytes:
        headers = _decoded_headers(scope)
        length = _payload_length(headers, verified)
        if length is None or length > 1024 * 1024:
            raise InvalidRequest("a hapi-batch body needs a Content-Length of at most 1 MiB")
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
        target: Target,
        verified: Verified | None,
    ) -> None:
        """Send the request upstream and stream the response back."""
        request = self._upstream_request(scope, receive, target, verified)
        try:
            response = await self._client().send(request, stream=True)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"the backend store at {self._settings.backend_url} cannot be reached: {exc!r}",
                resource=request_state(scope).get("resource", ""),
                retry_after=1,
            ) from exc
        try:
            await _relay(response, send)
        finally:
            await response.aclose()

    def _upstream_request(
        self, scope: Scope, receive: ASGIReceive, target: Target, verified: Verified | None
    ) -> httpx.Request:
        method: str = scope["method"]
        headers = _decoded_headers(scope)
        raw_query = scope["query_string"].decode("latin-1")
        if is_presigned_v2(raw_query):
            raw_query = "&".join(
                p for p in raw_query.split("&") if p.split("=", 1)[0] not in V2_PARAMS
            )
        query = canonical_query_string(raw_query)
        url = self._settings.backend_url + target.upstream_path + ("?" + query if query else "")
        to_sign: dict[str, str] = {}
        plain: dict[str, str] = {}
        for name, value in headers:
            if name in _DROP_REQUEST or (name == "content-encoding" and "aws-chunked" in value):
                continue
            bucket = to_sign if name.startswith("x-amz-") or name in _SIGN_EXTRA else plain
            bucket[name] = f"{bucket[name]},{value}" if name in bucket else value
        encoding = _content_encoding_without_chunked(headers)
        if encoding:
            plain["content-encoding"] = encoding
        signed = sign_request(
            method=method,
            url=url,
            headers=to_sign,
            credentials=self._settings.backend_credentials,
            region=self._settings.region,
            now=self._now(),
        )
        length = _payload_length(headers, verified)
        content: AsyncIterator[bytes] | None = None
        if length is not None:
            plain["content-length"] = str(length)
            # An empty aws-chunked body still has a final chunk and trailers to verify.
            if length or (verified is not None and verified.payload_mode.startswith("streaming")):
                content = decode_body(
                    _receive_body(receive, request_state(scope)),
                    verified,
                    content_length=length,
                    headers=dict(headers),
                    # CompleteMultipartUpload's checksum headers describe the whole object.
                    check_header_checksums=request_state(scope).get("operation")
                    != "CompleteMultipartUpload",
                )
        elif _has_body(headers):
            raise InvalidRequest(
                "a request body needs a Content-Length (S3 has no chunked uploads)"
            )
        return self._client().build_request(
            method, url, headers={**plain, **signed}, content=content
        )


async def _relay(response: httpx.Response, send: ASGISend) -> None:
    headers, length = [], -1
    for name, value in response.headers.raw:
        lower = name.lower()
        if lower == b"content-length" and value.isdigit():
            length = int(value)
        if lower not in _DROP_RESPONSE:
            headers.append((name, value))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    # The chunk that completes a known length ends the response: no extra empty message.
    sent = 0
    async for chunk in response.aiter_raw():
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
        if chunk:
            received += len(chunk)
            state["received"] = received
            yield chunk
        if not message.get("more_body", False):
            return


def _decoded_headers(scope: Scope) -> list[tuple[str, str]]:
    state = request_state(scope)
    cached: list[tuple[str, str]] | None = state.get("headers")
    if cached is None:
        cached = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in scope["headers"]]
        state["headers"] = cached
    return cached


def _is_anonymous(scope: Scope, headers: Sequence[tuple[str, str]]) -> bool:
    query = scope["query_string"]
    return not any(name == "authorization" for name, _ in headers) and (
        b"X-Amz-Signature" not in query and b"Signature=" not in query
    )


def _query_names(query: str) -> set[str]:
    return {part.split("=", 1)[0] for part in query.split("&") if part}


def _content_encoding_without_chunked(headers: Sequence[tuple[str, str]]) -> str:
    for name, value in headers:
        if name == "content-encoding":
            return ",".join(
                part.strip() for part in value.split(",") if part.strip() != "aws-chunked"
            )
    return ""


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
