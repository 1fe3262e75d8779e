"""``hapi serve``: the gateway in front of an existing S3 store, under uvicorn.

Bad input, and a port already in use, end with one line on stderr and exit code 2 (click's
usage-error convention). On start it writes one block to stderr: where it listens, the
backend and whether it answers, the registry bucket, device, memory budget and limits.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from hapi.models import UserError

from ._server import listen, print_startup_block, run_gateway
from ._settings import GatewaySettings


@click.command()
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
    sock = listen(host, port)  # a busy port is one line and exit 2, before any start-up work
    url = f"http://{host}:{port}"
    run_gateway(
        settings, host, port, sock=sock, on_started=lambda: print_startup_block(settings, url)
    )
