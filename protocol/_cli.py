"""What every ``hapi`` subcommand shares: one-line errors for bad input, and one way to
name the registry (``--endpoint``, ``--bucket``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ._layout import DEFAULT_REGISTRY_BUCKET

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
