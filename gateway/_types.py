"""ASGI type aliases and per-request state shared by the gateway's handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIReceive = Callable[[], Awaitable[Message]]
ASGISend = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, ASGIReceive, ASGISend], Awaitable[None]]


def request_state(scope: Scope) -> dict[str, Any]:
    """The mutable per-request record (request id, operation, status, bytes)."""
    state: dict[str, Any] = scope.setdefault("state", {})
    return state
