"""Running the gateway under uvicorn: the listening socket, the start-up block, clean stops.

The socket is bound before anything else starts, so a busy port is one clear error instead
of uvicorn's bind traceback. SIGINT and SIGTERM stop the server gracefully and
:func:`run_gateway` then returns, instead of re-raising the signal as uvicorn does (which
ends a click command with ``Aborted!`` and exit status 1).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from hapi.models import cuda_usable
from hapi.models.cli import UserError
from hapi.protocol import format_bytes

from ._app import create_app
from ._identities import backend_actors
from ._settings import GatewaySettings
from .edge._http import edge_config

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def listen(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port``; a port in use is one line for the user.

    Raises:
        UserError: The address is in use, or cannot be bound (exit code 2).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} on {host} is already in use (another hapi?); "
                "stop that process or choose another port with --port"
            ) from None
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def run_gateway(
    settings: GatewaySettings,
    host: str,
    port: int,
    *,
    sock: socket.socket | None = None,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Serve the gateway with uvicorn until SIGINT or SIGTERM, then return.

    Args:
        settings: The gateway's settings.
        host: The address to listen on (also what the start-up block names).
        port: The port.
        sock: An already listening socket (from :func:`listen`); bound here when omitted.
        on_started: Called once the server accepts connections.

    With ``settings.workers`` above 1, that many processes serve the one socket (each
    with ``1/workers`` of the memory budget; see :func:`edge_config`).

    Raises:
        UserError: The port is in use.
    """
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    config = edge_config(settings, host, port, _app_factory)
    listener = sock or listen(host, port)

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            freeze_startup_heap()
            if self.started and on_started is not None:
                on_started()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    with listener:
        if config.workers > 1:  # the supervisor handles the signals and its workers
            listener.set_inheritable(True)  # as uvicorn's own bind_socket leaves it
            if on_started is not None:
                on_started()
            with contextlib.suppress(KeyboardInterrupt):
                Multiprocess(config, sockets=[listener]).run()
            return
        server = _Server(config)
        server.run(sockets=[listener])
        if not server.started:
            raise SystemExit(STARTUP_FAILURE)


_YOUNG_THRESHOLD = 20_000
"""Allocations between collections of the youngest generation (CPython's default is 700).
A request allocates some hundreds of tracked objects that die with it, so at 700 the
collector ran every request or two; at 20,000 it runs every few dozen and walks no more
survivors: 4 KiB GETs from 150 connections, interleaved runs, 166-171 us of CPU a request
against 173-184 us (docs/results.md)."""


def freeze_startup_heap() -> None:
    """Move what start-up allocated (modules, the app, pools: hundreds of thousands of
    objects) out of the collector's reach, so a full collection while serving walks only
    what requests allocate: its pauses are what a loaded gateway's slowest requests wait
    for. Then collect the young generation less often (see ``_YOUNG_THRESHOLD``)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(_YOUNG_THRESHOLD, older, oldest)


def _decoder(settings: GatewaySettings) -> str:
    from .pushdown._decoders import chosen_decoder

    try:
        chosen = chosen_decoder(settings)
    except ValueError as exc:
        return f"{settings.decoder} (cannot run here: {exc})"
    return chosen if settings.decoder != "auto" else f"auto ({chosen})"


def startup_block(settings: GatewaySettings, url: str) -> str:
    """What ``hapi serve`` says when it starts: where it listens and what it runs with."""
    device: str = settings.device
    if device == "auto":
        device = "auto (cuda)" if cuda_usable() else "auto (cpu: no usable CUDA device)"
    limits = (
        f"objects up to {format_bytes(settings.max_object_bytes, binary=True)} for pushdown, "
        f"{settings.max_image_pixels:,} pixels per image, "
        f"{settings.max_queue_samples} queued samples, "
        f"{settings.max_upstream_connections} upstream connections"
    )
    return "\n".join(
        [
            f"hapi gateway listening on {url}",
            f"  backend:         {settings.backend_url} ({backend_status(settings.backend_url)})",
            f"  registry bucket: {settings.registry_bucket}",
            f"  device:          {device}",
            f"  decoder:         {_decoder(settings)}",
            f"  memory budget:   {format_bytes(settings.memory_budget_bytes, binary=True)} (on CPU; GPU: free memory)",
            f"  limits:          {limits}",
            f"  clients:         {_clients(settings)}",
            *_backend_actors(settings),
            *([f"  placement:       {_placement(settings)}"] if settings.placement else []),
        ]
    )


def backend_status(url: str) -> str:
    """Whether the store at ``url`` answers HTTP at all (any status counts), in words."""
    try:
        response = httpx.get(url, timeout=2.0, trust_env=False)
    except httpx.HTTPError as exc:
        return f"does not answer: {type(exc).__name__}"
    return f"answers, HTTP {response.status_code}"


def print_startup_block(settings: GatewaySettings, url: str) -> None:
    """Write :func:`startup_block` to stderr, where logs go."""
    print(startup_block(settings, url), file=sys.stderr, flush=True)


def _clients(settings: GatewaySettings) -> str:
    count = len(settings.clients)
    admins = sum(key.role == "admin" for key in settings.clients.values())
    anonymous = "; anonymous requests forwarded" if settings.allow_anonymous else ""
    return f"{count} credential{'s' if count != 1 else ''} ({admins} admin){anonymous}"


def _backend_actors(settings: GatewaySettings) -> list[str]:
    """The start-up line naming client keys that act as the backend identity, if any."""
    actors = backend_actors(settings.clients)
    if not actors:
        return []
    return [
        f"  as backend:     client keys acting upstream as the backend identity "
        f"({settings.backend_credentials.access_key_id}), so the store does not judge them: "
        + ", ".join(actors)
    ]


def _placement(settings: GatewaySettings) -> str:
    if not settings.node_address:
        return f"{settings.placement} (no node address: every fetch counts as unknown)"
    return f"{settings.placement} (this node: {settings.node_address})"


class _AppFactory:
    """Builds the gateway app in the process that serves it (picklable for spawned workers)."""

    def __init__(self, settings: GatewaySettings, log_level: int) -> None:
        self.settings = settings
        self.log_level = log_level

    def __call__(self) -> Any:
        root = logging.getLogger()
        if not root.handlers:  # a spawned worker: log as the parent was told to
            logging.basicConfig(level=self.log_level, format="%(message)s")
            logging.getLogger("httpx").setLevel(logging.WARNING)
        return create_app(self.settings)


def _app_factory(settings: GatewaySettings) -> _AppFactory:
    return _AppFactory(settings, logging.getLogger().getEffectiveLevel())
