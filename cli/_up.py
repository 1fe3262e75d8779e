"""``hapi up``: the embedded store and the gateway together, for a first run."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from hapi.gateway import Credentials, GatewaySettings, create_app
from hapi.models import UserError

DEFAULT_STATE_DIR = ".state"


@click.command()
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(DEFAULT_STATE_DIR),
    show_default=True,
    help="Store data, generated credentials and logs live here.",
)
@click.option("--port", type=int, default=8080, show_default=True, help="Gateway port (loopback).")
@click.option(
    "--store-port", type=int, default=8333, show_default=True, help="Store S3 port (loopback)."
)
@click.option(
    "--no-demo-model", is_flag=True, help="Do not register EfficientNet-Lite0 on first start."
)
def up(state_dir: Path, port: int, store_port: int, no_demo_model: bool) -> None:
    """Start the embedded store and the gateway on loopback, print how to use them.

    Serves until Ctrl-C, then stops both. Credentials are generated on first start and
    kept in STATE_DIR, so later starts reuse them.
    """
    from hapi.store import EmbeddedStore, StoreError, StoreSettings, load_or_create_credentials

    console = Console(stderr=False, highlight=False)
    backend = load_or_create_credentials(state_dir / "store", None, None)
    client = load_or_create_credentials(state_dir / "gateway", None, None)
    store_settings = StoreSettings(
        data_dir=state_dir / "store",
        port=store_port,
        access_key_id=backend.access_key_id,
        secret_access_key=backend.secret_access_key,
    )
    try:
        with EmbeddedStore(store_settings) as store:
            console.print(
                f"[green]store[/] up at {store.endpoint_url} (data in {state_dir / 'store'})"
            )
            settings = GatewaySettings(
                backend_url=store.endpoint_url,
                backend_credentials=Credentials(backend.access_key_id, backend.secret_access_key),
                client_secrets={client.access_key_id: client.secret_access_key},
            )
            model = None
            if not no_demo_model:
                model = _ensure_demo_model(
                    console, store.endpoint_url, backend, settings.registry_bucket
                )
            _serve(settings, port, banner=lambda: _banner(console, port, client, model))
    except StoreError as exc:
        raise UserError(str(exc)) from exc


def _ensure_demo_model(console: Console, endpoint: str, creds: Any, bucket: str) -> str:
    import boto3

    from hapi.models import register_default_model

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
    )
    with console.status("registering the demo model (EfficientNet-Lite0) on first start..."):
        name = register_default_model(s3, bucket)
    console.print(f"[green]model[/] {name} is in the registry")
    return str(name.name)


def _serve(settings: GatewaySettings, port: int, banner: Any) -> None:
    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                banner()

    # uvicorn re-raises the signal that stopped it once it has shut down; SIGTERM's default
    # action would then kill the process before the store is stopped, so make it an exit.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        loop="uvloop",
        http="httptools",
        server_header=False,
    )
    _Server(config).run()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _banner(console: Console, port: int, client: Any, model: str | None) -> None:
    url = f"http://127.0.0.1:{port}"
    key, secret = client.access_key_id, client.secret_access_key
    sig = '--aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"'
    pushdown = (
        f"\n  # features instead of the image (model {model}, split 5), as a readable summary\n"
        f'  curl {sig} \\\n       "{url}/data/photo.jpg?hapi-model={model}&hapi-split=5&hapi-format=json"\n'
        if model
        else ""
    )
    text = f"""hapi gateway up at {url}

  export AWS_ENDPOINT_URL={url}
  export AWS_ACCESS_KEY_ID={key}
  export AWS_SECRET_ACCESS_KEY={secret}
  export AWS_DEFAULT_REGION=us-east-1

  aws s3 mb s3://data
  aws s3 cp photo.jpg s3://data/photo.jpg
  curl {sig} \\
       {url}/data/photo.jpg -o copy.jpg
{pushdown}
  curl {url}/_hapi/health
  curl {sig} {url}/_hapi/models
  curl {sig} {url}/metrics

Ctrl-C stops the gateway and the store."""
    console.print(text, soft_wrap=True, markup=False)
