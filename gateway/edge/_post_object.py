"""POST Object: a browser form upload, verified here and stored with an ordinary PUT.

The form's fields arrive before its file. The gateway reads them (bounded), verifies the
policy (``_post_policy``), then streams the file to the store as a PUT signed with the
backend credentials, checking ``content-length-range`` on the way: a file that leaves the
range ends the upstream request early, so the store discards it (as it does any cut-off
body) and nothing is written. A form with no authentication fields is anonymous: it goes
to the store as it came, unsigned, for the store to judge.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit
from xml.sax.saxutils import escape

import httpx

from .._access import check_form_upload
from .._errors import (
    EntityTooLarge,
    EntityTooSmall,
    InvalidArgument,
    InvalidRequest,
    ServiceUnavailable,
)
from .._identities import Caller, caller_of
from .._operation import check_key, object_path
from .._settings import GatewaySettings
from .._signing import sign_request
from .._types import ASGIReceive, ASGISend, Message, Scope, request_state
from ._form import FilePart, FormReader
from ._post_policy import AUTH_FIELDS, PostPolicy, verify_form

__all__ = ["PostObject"]

_MAX_FIELDS_BYTES = 1024 * 1024
_MAX_TRAILING_BYTES = 64 * 1024
# Form fields that become headers of the PUT (x-amz-meta-* too).
_HEADER_FIELDS = frozenset(
    {
        "cache-control",
        "content-disposition",
        "content-encoding",
        "content-type",
        "expires",
        "x-amz-storage-class",
        "x-amz-website-redirect-location",
        "x-amz-server-side-encryption",
        "x-amz-server-side-encryption-aws-kms-key-id",
        "x-amz-server-side-encryption-context",
        "x-amz-server-side-encryption-bucket-key-enabled",
    }
)
_KEEP_REPLY = frozenset({b"etag", b"x-amz-version-id", b"x-amz-server-side-encryption"})
_KEEP_ERROR = frozenset({b"content-type", b"x-amz-request-id"})

Unsigned = Callable[[ASGIReceive], Awaitable[None]]


class PostObject:
    """Serves form uploads.

    Args:
        settings: The gateway's settings (client secrets, backend URL and credentials).
        client: Getter of the upstream HTTP client.
        now: The clock policies expire by.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        client: Callable[[], httpx.AsyncClient],
        now: Callable[[], datetime],
    ) -> None:
        self._settings = settings
        self._client = client
        self._now = now

    async def __call__(
        self,
        scope: Scope,
        receive: ASGIReceive,
        send: ASGISend,
        *,
        bucket: str,
        boundary: bytes,
        forward_unsigned: Unsigned,
    ) -> None:
        """Serve one form upload.

        Args:
            scope, receive, send: The ASGI request.
            bucket: The bucket it was posted to.
            boundary: The form's multipart boundary.
            forward_unsigned: Sends the request upstream unsigned with the given receive
                (for a form without authentication fields) and relays the answer.
        """
        body = _Body(receive, request_state(scope))
        form = FormReader(body.chunks(), boundary, max_fields_bytes=_MAX_FIELDS_BYTES)
        fields, file = await form.fields()
        if not AUTH_FIELDS & fields.keys():
            await forward_unsigned(_replay(bytes(form.received), body, receive))
            return
        policy = verify_form(fields, self._settings.client_secrets, self._now())
        key = fields.get("key")
        if not key:
            raise InvalidRequest(
                "Bucket POST must contain a field named 'key'. If it is specified, please "
                "check the order of the fields."
            )
        if file is None:
            raise InvalidArgument("POST requires exactly one file upload per request.")
        policy.check(fields, bucket)
        settings = self._settings
        caller = caller_of(policy.access_key_id, settings.clients, settings.backend_credentials)
        check_form_upload(caller, settings, bucket)
        key = key.replace("${filename}", file.filename)
        check_key(key)
        status, headers, reply = await self._put(caller, bucket, key, fields, file, form, policy)
        await form.rest(_MAX_TRAILING_BYTES)
        if status != 200:  # the store's refusal, as it sent it
            await _send(send, status, headers, reply)
            return
        await _answer(send, scope, fields, bucket, key, headers)

    async def _put(
        self,
        caller: Caller,
        bucket: str,
        key: str,
        fields: dict[str, str],
        file: FilePart,
        form: FormReader,
        policy: PostPolicy,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """PUT the file upstream as ``caller``'s store identity: the store's status, headers
        worth passing on, and body."""
        assert caller.upstream is not None  # a verified policy's key acts as someone
        url = self._settings.backend_url + object_path(bucket, key)
        signed = sign_request(
            method="PUT",
            url=url,
            headers=_put_headers(fields, file),
            credentials=caller.upstream,
            region=self._settings.region,
            now=self._now(),
        )
        pieces = _within_range(form.file(), policy)
        first = await anext(pieces, b"")
        content: bytes | AsyncIterator[bytes] = _chain(first, pieces) if first else b""
        wire = [(n.encode(), v.encode("latin-1")) for n, v in signed.items()]
        request = self._client().build_request("PUT", url, headers=wire, content=content)
        try:
            response = await self._client().send(request, stream=True)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"the backend store at {self._settings.backend_url} cannot be reached: {exc!r}",
                retry_after=1,
            ) from exc
        try:
            reply = await response.aread()
        finally:
            await response.aclose()
        keep = _KEEP_REPLY if response.status_code == 200 else _KEEP_ERROR
        headers = [(n, v) for n, v in response.headers.raw if n.lower() in keep]
        return response.status_code, headers, reply


def _put_headers(fields: dict[str, str], file: FilePart) -> dict[str, str]:
    """The PUT's headers from the form: values as UTF-8 bytes, decoded as latin-1 (the
    convention of ``sign_request``, which signs the bytes that are sent)."""
    headers = {n: v for n, v in fields.items() if n in _HEADER_FIELDS or _is_meta(n)}
    if "acl" in fields:
        headers["x-amz-acl"] = fields["acl"]
    if "content-type" not in headers and file.content_type:
        headers["content-type"] = file.content_type
    return {n: v.encode().decode("latin-1") for n, v in headers.items()}


class _Body:
    """The request body as an async iterator, remembering whether it has all arrived."""

    def __init__(self, receive: ASGIReceive, state: dict[str, Any]) -> None:
        self._receive = receive
        self._state = state
        self.complete = False

    async def chunks(self) -> AsyncIterator[bytes]:
        while not self.complete:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ConnectionAbortedError("client disconnected during upload")
            self.complete = not message.get("more_body", False)
            chunk: bytes = message.get("body", b"")
            if chunk:
                self._state["received"] = self._state.get("received", 0) + len(chunk)
                yield chunk


async def _within_range(pieces: AsyncIterator[bytes], policy: PostPolicy) -> AsyncIterator[bytes]:
    """The file's bytes, held back by one piece until its size is known to be in range."""
    size, held = 0, b""
    async for piece in pieces:
        size += len(piece)
        if policy.max_length is not None and size > policy.max_length:
            raise EntityTooLarge("Your proposed upload exceeds the maximum allowed size.")
        if held:
            yield held
        held = piece
    if size < policy.min_length:
        raise EntityTooSmall("Your proposed upload is smaller than the minimum allowed size.")
    if held:
        yield held


async def _chain(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for piece in rest:
        yield piece


def _replay(received: bytes, body: _Body, receive: ASGIReceive) -> ASGIReceive:
    """A receive that hands out what the form reader already read, then the rest."""
    pending = [received]

    async def replay() -> Message:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": not body.complete}
        if body.complete:
            return {"type": "http.request", "body": b"", "more_body": False}
        return await receive()

    return replay


async def _answer(
    send: ASGISend,
    scope: Scope,
    fields: dict[str, str],
    bucket: str,
    key: str,
    kept: list[tuple[bytes, bytes]],
) -> None:
    """S3's answer to a stored upload: a redirect, 201 with XML, 200 or 204."""
    etag = next((v.decode("latin-1") for n, v in kept if n.lower() == b"etag"), "")
    redirect = fields.get("success_action_redirect") or fields.get("redirect")
    if redirect and redirect.isprintable() and urlsplit(redirect).scheme in ("http", "https"):
        query = urlencode({"bucket": bucket, "key": key, "etag": etag})
        location = redirect + ("&" if urlsplit(redirect).query else "?") + query
        await _send(send, 303, [*kept, (b"location", location.encode())], b"")
        return
    status = {"200": 200, "201": 201}.get(fields.get("success_action_status", ""), 204)
    body = b""
    if status == 201:
        location = _object_url(scope, bucket, key)
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<PostResponse><Location>{escape(location)}</Location>"
            f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
            f"<ETag>{escape(etag)}</ETag></PostResponse>"
        ).encode()
        kept = [*kept, (b"content-type", b"application/xml")]
    await _send(
        send, status, [*kept, (b"location", _object_url(scope, bucket, key).encode())], body
    )


async def _send(
    send: ASGISend, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _object_url(scope: Scope, bucket: str, key: str) -> str:
    host = next((v.decode("latin-1") for n, v in scope["headers"] if n == b"host"), "")
    scheme = scope.get("scheme", "http")
    return f"{scheme}://{host}/{quote(bucket, safe='')}/{quote(key, safe='/-_.~')}"


def _is_meta(name: str) -> bool:
    return name.startswith("x-amz-meta-")
