"""The ``hapi`` command group, its console-script entry point and ``hapi store``."""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points
from pathlib import Path

import click

from hapi.models.cli import UserError

from ._demo import demo
from ._up import DEFAULT_STATE_DIR, up

_ENV_KEY_ID = "HAPI_BACKEND_ACCESS_KEY_ID"
_ENV_SECRET = "HAPI_BACKEND_SECRET_ACCESS_KEY"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-v", "--verbose", is_flag=True, help="Log every request (access log) to stderr.")
def cli(verbose: bool) -> None:
    """hapi: an S3 gateway that runs frozen layers next to the data.

    Start with `hapi up` (embedded store + gateway on loopback), or put `hapi serve`
    in front of an existing S3 store.
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise


@cli.command()
@click.option(
    "--dir",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path, resolve_path=True),
    default=Path(DEFAULT_STATE_DIR) / "store",
    show_default=True,
    help="Where the store keeps its data.",
)
@click.option("--port", type=int, default=8333, show_default=True, help="S3 port (loopback only).")
@click.option(
    "--access-key-id",
    envvar=_ENV_KEY_ID,
    help=f"The key the store accepts [env {_ENV_KEY_ID}]; its secret comes from "
    f"{_ENV_SECRET} or --secret-file. With neither, a pair is generated and kept in DIR.",
)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"A file holding the secret of --access-key-id (read instead of {_ENV_SECRET}).",
)
def store(data_dir: Path, port: int, access_key_id: str | None, secret_file: Path | None) -> None:
    """Run the embedded S3 store (SeaweedFS) in the foreground until Ctrl-C.

    Credentials never go on the command line: the secret comes from the environment or a
    file.
    """
    from hapi.store import (
        StoreError,
        StoreSettings,
        load_or_create_credentials,
        locate_weed,
        run_store,
    )

    secret_access_key = _secret(access_key_id, secret_file)
    try:
        locate_weed()
    except StoreError as exc:  # the store extra is missing: not the user's input
        raise click.ClickException(str(exc)) from exc
    try:
        creds = load_or_create_credentials(data_dir, access_key_id, secret_access_key)
        settings = StoreSettings(
            data_dir=data_dir,
            port=port,
            access_key_id=creds.access_key_id,
            secret_access_key=creds.secret_access_key,
        )
    except (ValueError, StoreError) as exc:
        raise UserError(str(exc)) from exc
    try:
        run_store(settings)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc


def _secret(access_key_id: str | None, secret_file: Path | None) -> str | None:
    """The store's secret: read from ``secret_file``, else from the environment; given
    exactly when ``access_key_id`` is."""
    secret = _read_secret(secret_file) if secret_file else os.environ.get(_ENV_SECRET)
    if bool(access_key_id) != bool(secret):
        raise UserError(
            f"give both --access-key-id (or {_ENV_KEY_ID}) and its secret "
            f"({_ENV_SECRET} or --secret-file), or neither"
        )
    return secret or None


def _read_secret(path: Path) -> str:
    """The secret held in ``path``, without the line end an editor adds."""
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read --secret-file {path}: {exc}") from exc
    if not secret:
        raise UserError(f"--secret-file {path} is empty")
    return secret


cli.add_command(up)
cli.add_command(demo)


def main() -> None:
    """Console-script entry point."""
    for entry in entry_points(group="hapi.commands"):
        cli.add_command(entry.load(), entry.name)
    cli(prog_name="hapi")
