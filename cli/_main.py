"""The ``hapi`` command group, its console-script entry point and ``hapi store``."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from pathlib import Path

import click

from hapi.protocol import UserError

from ._demo import demo
from ._up import DEFAULT_STATE_DIR, up


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
    envvar="HAPI_BACKEND_ACCESS_KEY_ID",
    help="Store credentials "
    "[env HAPI_BACKEND_ACCESS_KEY_ID]; generated and kept in DIR when unset.",
)
@click.option(
    "--secret-access-key",
    envvar="HAPI_BACKEND_SECRET_ACCESS_KEY",
    help="[env HAPI_BACKEND_SECRET_ACCESS_KEY]",
)
def store(
    data_dir: Path, port: int, access_key_id: str | None, secret_access_key: str | None
) -> None:
    """Run the embedded S3 store (SeaweedFS) in the foreground until Ctrl-C."""
    from hapi.store import (
        StoreError,
        StoreSettings,
        load_or_create_credentials,
        locate_weed,
        run_store,
    )

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


cli.add_command(up)
cli.add_command(demo)


def main() -> None:
    """Console-script entry point."""
    for entry in entry_points(group="hapi.commands"):
        cli.add_command(entry.load(), entry.name)
    cli(prog_name="hapi")
