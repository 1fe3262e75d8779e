"""``hapi models``: export, list, show, trace and remove registry models.

The commands reach the store the way boto3 does: ``--endpoint``, else
``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, with the usual credential chain;
directly or through the gateway. Bad input (unknown family, freeze out of range, invalid
name, missing weights, unknown model) ends with one line on stderr and exit code 2, and
nothing is written to the store: everything is checked and exported before the first
upload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from ._errors import ExportError, InvalidModelSpec, ModelError, NoSuchModel
from ._manifest import Manifest
from ._registry import DEFAULT_BUCKET, Registry, check_name

F = TypeVar("F", bound=Callable[..., Any])


class UserError(click.ClickException):
    """A one-line error caused by the user's input; exit code 2, like click's usage errors."""

    exit_code = 2


@contextmanager
def _translated() -> Iterator[None]:
    """Turn the package's errors into one-line CLI errors (exit 2 for bad input)."""
    try:
        yield
    except (InvalidModelSpec, NoSuchModel, ExportError) as exc:
        raise UserError(_one_line(exc)) from exc
    except ModelError as exc:
        raise click.ClickException(_one_line(exc)) from exc


def _one_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _store_options(command: F) -> F:
    command = click.option(
        "--bucket",
        default=DEFAULT_BUCKET,
        show_default=True,
        envvar="HAPI_REGISTRY_BUCKET",
        help="Registry bucket [env HAPI_REGISTRY_BUCKET].",
    )(command)
    return click.option(
        "--endpoint",
        envvar=["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"],
        help="S3 endpoint: the store or the gateway [env AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL].",
    )(command)


def _registry(endpoint: str | None, bucket: str) -> Registry:
    import boto3
    from botocore.config import Config

    # Stores other than AWS (SeaweedFS, MinIO, the gateway) expect path-style requests.
    config = Config(s3={"addressing_style": "path"}) if endpoint else None
    return Registry(boto3.client("s3", endpoint_url=endpoint, config=config), bucket)


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def models() -> None:
    """The model registry: networks as ONNX blocks in a bucket of the store."""


@models.command()
@click.argument("family")
@click.option("--freeze", type=int, help="Blocks [0, F) are frozen; the family default if unset.")
@click.option(
    "--weights",
    type=click.Path(path_type=Path),
    help="State dict (.safetensors or torch.save); random weights for torchvision if unset.",
)
@click.option("--fp16", is_flag=True, help="Export float16 blocks.")
@click.option("--name", help="Registered name; the family name if unset.")
@click.option("--parent", help="NAME[@VERSION] this model was fine-tuned from.")
@_store_options
def export(
    family: str,
    freeze: int | None,
    weights: Path | None,
    fp16: bool,
    name: str | None,
    parent: str | None,
    endpoint: str | None,
    bucket: str,
) -> None:
    """Export FAMILY block by block to ONNX and register it.

    FAMILY is one of: resnet18, resnet50, vgg11, vgg19, alexnet, densenet121,
    mobilenet_v3_large, vit_b_16, efficientnet_lite0 (the only one with real
    pretrained weights unless --weights is given).
    """
    from ._export import export_model
    from ._families import build

    name = name or family
    with _translated():
        check_name(name)
        registry = _registry(endpoint, bucket)
        parent_ref = registry.get_manifest(parent).ref if parent else None
        decomposition = build(family, weights=weights)
        decomposition.check_freeze(decomposition.freeze if freeze is None else freeze)
        if decomposition.weights.startswith("random"):
            click.echo(_random_warning(family, decomposition.weights), err=True)
        exported = export_model(decomposition, freeze=freeze, fp16=fp16, progress=True)
        new = {b.info.hash: b.info.size for b in exported.blocks}
        new = {h: size for h, size in new.items() if not registry.has_block(h)}
        before = _latest_ref(registry, name)
        manifest = registry.register(name, exported, parent=parent_ref)
    if manifest.ref == before:
        click.echo(f"{manifest.ref} is already registered with identical blocks; nothing uploaded")
        return
    click.echo(
        f"registered {manifest.ref}: {len(manifest.blocks)} blocks, {_size(manifest.size)}, "
        f"freeze {manifest.freeze}; uploaded {len(new)} new blocks ({_size(sum(new.values()))})"
    )


def _random_warning(family: str, weights: str) -> str:
    return (
        f"warning: the weights of {family} are {weights}: its features mean nothing; "
        "give --weights FILE for trained ones"
    )


def _latest_ref(registry: Registry, name: str) -> str | None:
    try:
        return registry.get_manifest(name).ref
    except NoSuchModel:
        return None


@models.command(name="ls")
@_store_options
def list_models(endpoint: str | None, bucket: str) -> None:
    """List the registered models (latest versions)."""
    with _translated():
        manifests = _registry(endpoint, bucket).list_models()
    table = Table("model", "family", "blocks", "freeze", "size", "weights", "parent", box=None)
    for manifest in manifests:
        table.add_row(
            manifest.ref,
            manifest.family,
            str(len(manifest.blocks)),
            str(manifest.freeze),
            _size(manifest.size),
            _weights(manifest.weights),
            manifest.parent or "",
        )
    Console(soft_wrap=True, width=200).print(table if manifests else "no models registered")


def _weights(origin: str) -> str:
    """A weights origin short enough for a table column (digests cut to 12 hex digits)."""
    return origin[: len("sha256:") + 12] if origin.startswith("sha256:") else origin


def _blocks_table(manifest: Manifest) -> Table:
    table = Table("#", "block", "output", "out/sample", "peak act", "params", "cpu ms", "sha256")
    table.title = (
        f"{manifest.ref}  family {manifest.family}  freeze {manifest.freeze}  "
        f"preprocess {manifest.preprocess.name}  parent {manifest.parent or '-'}  "
        f"weights {manifest.weights}"
    )
    for index, block in enumerate(manifest.blocks):
        table.add_row(
            str(index),
            block.name,
            "x".join(map(str, block.output_shape)),
            _size(block.output_bytes),
            _size(block.peak_activation_bytes),
            f"{block.params:,}",
            f"{block.cpu_ms:.2f}",
            block.hash[:12],
            end_section=index == manifest.freeze - 1,
        )
    return table


@models.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@_store_options
def show(ref: str, as_json: bool, endpoint: str | None, bucket: str) -> None:
    """Show a model's blocks with output sizes and CPU times."""
    with _translated():
        manifest = _registry(endpoint, bucket).get_manifest(ref)
    if as_json:
        click.echo(manifest.to_json(), nl=False)
        return
    Console(soft_wrap=True, width=200).print(_blocks_table(manifest))


@models.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@_store_options
def lineage(ref: str, endpoint: str | None, bucket: str) -> None:
    """Show a model's parent, ancestors and descendants."""
    with _translated():
        found = _registry(endpoint, bucket).lineage(ref)
    click.echo(f"model:       {found.model}")
    click.echo(f"parent:      {found.parent or '-'}")
    click.echo(f"ancestors:   {', '.join(found.ancestors) or '-'}")
    click.echo(f"descendants: {', '.join(found.descendants) or '-'}")


@models.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@_store_options
def rm(ref: str, endpoint: str | None, bucket: str) -> None:
    """Remove a version (or all); delete blocks no other model uses."""
    with _translated():
        removal = _registry(endpoint, bucket).remove(ref)
    click.echo(
        f"removed {', '.join(removal.removed)}; deleted {len(removal.deleted_blocks)} "
        f"unshared blocks ({_size(removal.freed_bytes)})"
    )
