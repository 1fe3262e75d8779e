"""``hapi serve``: the gateway in front of an existing S3 store, under uvicorn.

Bad input, and a port already in use, end with one line on stderr and exit code 2 (click's
usage-error convention). On start it writes one block to stderr: where it listens, the
backend and whether it answers, the registry bucket, device, memory budget and limits.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from hapi.models.cli import UserError

from ._knobs import Knob
from ._server import listen, print_startup_block, run_gateway
from ._settings import GatewaySettings, settings_knobs

F = TypeVar("F", bound=Callable[..., Any])


class _KnobType(click.ParamType[Any]):
    """A flag's text through its knob's parser, so the command gets typed values."""

    def __init__(self, item: Knob) -> None:
        self.item = item
        self.name = item.field

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.item.parse(value)
        except ValueError as exc:
            self.fail(f"{value!r}: {exc}", param, ctx)


def _help(item: Knob) -> str:
    default = f"; default {item.default}" if item.default is not None else ""
    return f"{item.help} [env {item.env}{default}]"


def _option(item: Knob) -> Callable[[F], F]:
    if item.is_bool:
        name = item.flag.removeprefix("--")
        return click.option(f"{item.flag}/--no-{name}", item.field, default=None, help=_help(item))
    return click.option(
        item.flag,
        item.field,
        type=_KnobType(item),
        multiple=item.repeatable,
        default=None,
        metavar=item.metavar,
        help=_help(item),
    )


def settings_options(command: F) -> F:
    """Add one flag per :class:`GatewaySettings` field (generated, so none is left out)."""
    for item in reversed(settings_knobs()):
        command = _option(item)(command)
    return command


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to listen on.")
@settings_options
def serve(host: str, port: int, **flags: Any) -> None:
    """Run the gateway in front of an existing S3 store.

    Every setting has a flag and an environment variable (flags win). Credentials come
    from the environment or files, never from flags: upstream, HAPI_BACKEND_ACCESS_KEY_ID
    and HAPI_BACKEND_SECRET_ACCESS_KEY (or --backend-credentials-file); clients,
    HAPI_ACCESS_KEY_ID and HAPI_SECRET_ACCESS_KEY and/or --credentials-file.
    """
    values = {name: _joined(value) for name, value in flags.items()}
    try:
        settings = GatewaySettings.from_env(os.environ, **values)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    sock = listen(host, port)  # a busy port is one line and exit 2, before any start-up work
    url = f"http://{host}:{port}"
    run_gateway(
        settings, host, port, sock=sock, on_started=lambda: print_startup_block(settings, url)
    )


def _joined(value: Any) -> Any:
    """A repeatable flag's values, each possibly comma-separated, as one tuple (None if unset)."""
    if isinstance(value, tuple):
        return tuple(item for part in value for item in part) or None
    return value
