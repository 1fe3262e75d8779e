"""``hapi up``: the embedded store and the gateway together, for a first run.

One ``hapi up`` per state directory (a second one says who runs and changes nothing). The
gateway's port is bound first, then the store starts, then the gateway serves. SIGINT
(Ctrl-C) and SIGTERM stop both at any point, and the command ends with one clean line and
exit status 0. The store's weed dies with ``hapi up`` even on ``kill -9``, and whatever a
killed run left is cleaned up by the next one.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich.console import Console

from hapi.gateway import ClientKey, GatewaySettings, listen, run_gateway
from hapi.models import Manifest
from hapi.models.cli import UserError
from hapi.protocol import Credentials

from ._state import AlreadyRunning, RunLock, RunRecord, clean_stale

DEFAULT_STATE_DIR = ".state"
# The client's own store identity. Not a store administrator: it may create and use every
# bucket whose name does not begin with the operators' reserved prefix, and read the
# registry; nothing else (the bucket policies set at every start say the same again).
CLIENT_IDENTITY = "client"
RESERVED_PREFIX = "hapi-"  # the operators' buckets: the registry, the cache, the admin's own
# What SeaweedFS allows in a bucket name (its actions match a name by a trailing "*").
_BUCKET_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.-_"


def client_actions(registry_bucket: str, reserved: str = RESERVED_PREFIX) -> tuple[str, ...]:
    """SeaweedFS actions for a store identity that owns every bucket outside ``reserved``.

    SeaweedFS scopes an action to the buckets whose name begins with a prefix
    (``Admin:data*``: everything on every bucket beginning with ``data``), so "all but
    ``hapi-``" is spelled as every prefix that departs from ``hapi-`` at some character,
    plus the shorter names themselves (``hap``, ``hapi``); then reading the registry.
    """
    owned = [
        f"Admin:{reserved[:i]}{char}*"
        for i, expected in enumerate(reserved)
        for char in _BUCKET_CHARS
        if char != expected
    ]
    shorter = [f"Admin:{reserved[:i]}" for i in range(1, len(reserved))]
    return (*owned, *shorter, f"Read:{registry_bucket}", f"List:{registry_bucket}")


STOPPED = "hapi stopped: the gateway and the store are down."


@click.command()
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path, resolve_path=True),
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

    Serves until Ctrl-C (or SIGTERM), then stops both. Credentials are generated on first
    start and kept in STATE_DIR, so later starts reuse them. A second `hapi up` on the same
    STATE_DIR says which one runs and changes nothing.
    """
    from hapi.store import StoreError, locate_weed

    console = Console(highlight=False)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        locate_weed()  # before anything else: a missing extra is one line
        lock = RunLock.acquire(state_dir)
    except (StoreError, AlreadyRunning) as exc:
        signal.signal(signal.SIGTERM, previous)
        raise click.ClickException(str(exc)) from exc
    try:
        _run(console, lock, state_dir, port, store_port, not no_demo_model)
    except KeyboardInterrupt:
        pass  # Ctrl-C or SIGTERM while starting: the context managers have stopped everything
    except StoreError as exc:
        raise UserError(str(exc)) from exc
    finally:
        lock.release()
        signal.signal(signal.SIGTERM, previous)
    console.print(STOPPED)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM stops ``hapi up`` the way Ctrl-C does."""
    raise KeyboardInterrupt


def _run(
    console: Console, lock: RunLock, state_dir: Path, port: int, store_port: int, demo: bool
) -> None:
    from hapi.store import (
        EmbeddedStore,
        StoreIdentity,
        StoreSettings,
        load_or_create_credentials,
    )

    store_dir = state_dir / "store"
    if stale := clean_stale(state_dir, store_dir):
        console.print(stale)
    sock = listen("127.0.0.1", port)  # a busy port is one line, before the store starts
    url = f"http://127.0.0.1:{port}"
    # The store's own identity is the gateway's (registry reads, the cache) and the admin
    # key's upstream; the client key acts as a store identity of its own, which only the
    # gateway holds, so the store's permissions judge it.
    backend = load_or_create_credentials(store_dir, None, None)
    tenant = load_or_create_credentials(state_dir / "store-client", None, None)
    client = load_or_create_credentials(state_dir / "gateway", None, None)
    admin = load_or_create_credentials(state_dir / "gateway-admin", None, None)
    store_settings = StoreSettings(
        data_dir=store_dir,
        port=store_port,
        access_key_id=backend.access_key_id,
        secret_access_key=backend.secret_access_key,
        identities=(
            StoreIdentity(CLIENT_IDENTITY, tenant, client_actions(GatewaySettings.registry_bucket)),
        ),
    )
    with sock, EmbeddedStore(store_settings) as store:
        lock.write(RunRecord(os.getpid(), url, store.endpoint_url, store.pid))
        console.print(f"[green]store[/] up at {store.endpoint_url} (data in {store_dir})")
        settings = GatewaySettings(
            backend_url=store.endpoint_url,
            backend_credentials=backend,
            clients={
                client.access_key_id: ClientKey(client.secret_access_key, "client", tenant),
                admin.access_key_id: ClientKey(admin.secret_access_key, "admin"),
            },
        )
        s3 = _store_client(store.endpoint_url, backend)
        _protect_internal_buckets(s3, settings)
        model = _ensure_demo_model(console, s3, settings) if demo else None
        keys = _Keys(client, admin)
        run_gateway(
            settings,
            "127.0.0.1",
            port,
            sock=sock,
            on_started=lambda: _banner(console, url, keys, model),
        )


def _store_client(endpoint: str, creds: Credentials) -> Any:
    """A boto3 client of the store itself, as its own identity."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
    )


def _protect_internal_buckets(s3: Any, settings: GatewaySettings) -> None:
    """Create the registry and cache buckets if need be and set their bucket policies (at
    every start: what docs/security.md asks of every operator)."""
    from hapi.store import internal_bucket_policies

    policies = internal_bucket_policies(settings.registry_bucket, settings.cache_bucket)
    existing = {bucket["Name"] for bucket in s3.list_buckets().get("Buckets", [])}
    for bucket, policy in policies.items():
        if bucket not in existing:
            s3.create_bucket(Bucket=bucket)
        s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))


def _ensure_demo_model(console: Console, s3: Any, settings: GatewaySettings) -> Manifest | None:
    from hapi.models import ExportError, register_default_model

    try:
        with console.status("registering the demo model (EfficientNet-Lite0) on first start..."):
            manifest = register_default_model(s3, settings.registry_bucket)
    except ExportError as exc:  # no torch here: the gateway still serves plain S3
        console.print(f"[yellow]no demo model[/]: {exc}")
        return None
    console.print(f"[green]model[/] {manifest.ref} is in the registry")
    return manifest


@dataclass(frozen=True)
class _Keys:
    """The gateway keys the banner shows: an ordinary client's and the admin's."""

    client: Credentials
    admin: Credentials


def _banner(console: Console, url: str, keys: _Keys, model: Manifest | None) -> None:
    key, secret = keys.client.access_key_id, keys.client.secret_access_key
    sig = '--aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"'
    pushdown = ""
    if model is not None:
        # The pooled features at the freeze point, in float16: a few KB where a photo is
        # tens of KB. Early splits send more bytes than the JPEG, not fewer.
        split, sent = model.freeze, model.blocks[model.freeze - 1].output_bytes // 2
        pushdown = (
            f"\n  # features instead of the image: {model.name} split {split} "
            f"(pooled, float16: {sent:,} bytes), as a readable summary\n"
            f'  curl {sig} \\\n       "{url}/data/photo.jpg?hapi-model={model.name}'
            f'&hapi-split={split}&hapi-dtype=float16&hapi-format=json"\n'
        )
    text = f"""hapi gateway up at {url}

  # an ordinary client key: reads and writes data, reads the registry
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

  # the admin key: writes the registry (hapi models export/import/rm) and manages the
  # cache (hapi cache); use it as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY for those
  export HAPI_ADMIN_ACCESS_KEY_ID={keys.admin.access_key_id}
  export HAPI_ADMIN_SECRET_ACCESS_KEY={keys.admin.secret_access_key}

Ctrl-C stops the gateway and the store."""
    console.print(text, soft_wrap=True, markup=False)
