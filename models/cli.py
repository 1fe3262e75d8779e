"""What every ``hapi`` subcommand shares: one-line errors for bad input, one way to name
the registry (``--endpoint``, ``--bucket``), and opening it.

Each package's subcommands (``hapi serve``, ``hapi models``, ``hapi plan``, ``hapi cache``,
``hapi bench``) import these from here, the lowest layer they may all import that may use
click: the protocol layer stays free of CLI libraries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from hapi.protocol import DEFAULT_REGISTRY_BUCKET

from ._errors import ExportError, InvalidModelSpec, ModelError, NoSuchModel
from ._registry import Registry

__all__ = ["UserError", "cli_errors", "open_registry", "store_options"]

F = TypeVar("F", bound=Callable[..., Any])


class UserError(click.ClickException):
    """A one-line error caused by the user's input; exit code 2, like click's usage errors."""

    exit_code = 2


def store_options(command: F) -> F:
    """Add ``--endpoint`` and ``--bucket``, so every command finds the registry the same way."""
    command = click.option(
        "--bucket",
        default=DEFAULT_REGISTRY_BUCKET,
        show_default=True,
        envvar="HAPI_REGISTRY_BUCKET",
        help="Registry bucket [env HAPI_REGISTRY_BUCKET].",
    )(command)
    return click.option(
        "--endpoint",
        envvar=["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"],
        help="S3 endpoint: the store or the gateway [env AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL].",
    )(command)


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn the package's errors into one-line CLI errors (exit 2 for bad input)."""
    try:
        yield
    except (InvalidModelSpec, NoSuchModel, ExportError) as exc:
        raise UserError(_one_line(exc)) from exc
    except ModelError as exc:
        raise click.ClickException(_one_line(exc)) from exc


def _one_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def open_registry(endpoint: str | None, bucket: str) -> Registry:
    """The registry in ``bucket`` at ``endpoint`` (boto3's own endpoint chain when ``None``)."""
    import boto3
    from botocore.config import Config

    # Stores other than AWS (SeaweedFS, MinIO, the gateway) expect path-style requests.
    config = Config(s3={"addressing_style": "path"}) if endpoint else None
    return Registry(boto3.client("s3", endpoint_url=endpoint, config=config), bucket)
