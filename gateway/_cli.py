"""The ``hapi`` command line: ``store``, ``serve``, ``up``, and the registry's ``models``.

Bad input ends with one line on stderr and exit code 2 (click's usage-error convention).
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points
from pathlib import Path

import click

from ._settings import GatewaySettings

DEFAULT_STATE_DIR = ".state"


class UserError(click.ClickException):
    """A one-line error caused by the user's input; exit code 2."""

    exit_code = 2


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
    type=click.Path(path_type=Path),
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
    from ._store import StoreSettings, load_or_create_credentials, run_store

    creds = load_or_create_credentials(data_dir, access_key_id, secret_access_key)
    run_store(
        StoreSettings(
            data_dir=data_dir,
            port=port,
            access_key_id=creds.access_key_id,
            secret_access_key=creds.secret_access_key,
        )
    )


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--backend", envvar="HAPI_BACKEND_URL", help="URL of the S3 store [env HAPI_BACKEND_URL]."
)
@click.option(
    "--credentials-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='Client credentials, JSON {"KEY_ID": "SECRET", ...} [env HAPI_CREDENTIALS_FILE].',
)
@click.option(
    "--allow-anonymous", is_flag=True, help="Forward unsigned requests (signed upstream)."
)
@click.option(
    "--domain",
    "domains",
    multiple=True,
    help="Domain for virtual-hosted-style addressing (BUCKET.DOMAIN); repeatable "
    "[env HAPI_DOMAINS, comma-separated].",
)
@click.option(
    "--memory-budget", help="Inference memory on CPU, e.g. 2GiB [env HAPI_MEMORY_BUDGET]."
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    help="Where blocks run [env HAPI_DEVICE].",
)
@click.option(
    "--max-queue-delay-ms",
    type=float,
    help="Longest wait for a fuller batch [env HAPI_MAX_QUEUE_DELAY_MS].",
)
@click.option(
    "--registry-bucket", help="Bucket holding the model registry [env HAPI_REGISTRY_BUCKET]."
)
def serve(
    host: str,
    port: int,
    backend: str | None,
    credentials_file: Path | None,
    allow_anonymous: bool,
    domains: tuple[str, ...],
    memory_budget: str | None,
    device: str | None,
    max_queue_delay_ms: float | None,
    registry_bucket: str | None,
) -> None:
    """Run the gateway in front of an existing S3 store.

    Upstream credentials: HAPI_BACKEND_ACCESS_KEY_ID / HAPI_BACKEND_SECRET_ACCESS_KEY.
    Client credentials: HAPI_ACCESS_KEY_ID / HAPI_SECRET_ACCESS_KEY or --credentials-file.
    """
    env = dict(os.environ)
    if credentials_file is not None:
        env["HAPI_CREDENTIALS_FILE"] = str(credentials_file)
    flags = {
        "HAPI_MEMORY_BUDGET": memory_budget,
        "HAPI_DEVICE": device,
        "HAPI_MAX_QUEUE_DELAY_MS": None if max_queue_delay_ms is None else str(max_queue_delay_ms),
        "HAPI_REGISTRY_BUCKET": registry_bucket,
    }
    env.update({name: value for name, value in flags.items() if value is not None})
    try:
        settings = GatewaySettings.from_env(
            env,
            backend_url=backend,
            allow_anonymous=allow_anonymous or None,
            virtual_host_domains=domains or None,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    run_gateway(settings, host, port)


def run_gateway(settings: GatewaySettings, host: str, port: int) -> None:
    """Serve the gateway with uvicorn until interrupted."""
    import uvicorn

    from ._app import create_app

    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level="warning",
        loop="uvloop",
        http="httptools",
        lifespan="on",
        server_header=False,
    )


def main() -> None:
    """Console-script entry point."""
    from ._up import up

    cli.add_command(up)
    for entry in entry_points(group="hapi.commands"):
        cli.add_command(entry.load(), entry.name)
    cli(prog_name="hapi")
