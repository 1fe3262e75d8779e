"""``hapi models``: export, import, list, show, trace and remove registry models.

The commands reach the store the way boto3 does: ``--endpoint``, else
``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, with the usual credential chain;
directly or through the gateway. Bad input (unknown family, freeze out of range, invalid
name, missing weights, unknown model) ends with one line on stderr and exit code 2, and
nothing is written to the store: everything is checked and exported before the first
upload.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from hapi.protocol import format_bytes

from ._errors import InvalidModelSpec, NoSuchModel
from ._manifest import Manifest
from ._names import check_name
from ._registry import Registry
from .cli import cli_errors, open_registry, store_options


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def models() -> None:
    """The model registry: networks as ONNX blocks in a bucket of the store."""


@models.command()
@click.argument("family", metavar="NAME")
@click.option("--freeze", type=int, help="Blocks [0, F) are frozen; the family default if unset.")
@click.option(
    "--weights",
    type=click.Path(path_type=Path),
    help="State dict (.safetensors or torch.save); seeded random weights if unset "
    "(except efficientnet_lite0). Nothing is downloaded.",
)
@click.option("--fp16", is_flag=True, help="Export float16 blocks (families only).")
@click.option("--preset", help="Preprocessing preset (timm:/torchvision: only).")
@click.option(
    "--cut-at",
    multiple=True,
    metavar="TENSOR",
    help="Cut exactly at this tensor of the exported graph (repeatable; timm:/torchvision:).",
)
@click.option(
    "--name", help="Registered name; NAME without its timm:/torchvision: prefix if unset."
)
@click.option("--parent", help="NAME[@VERSION] this model was fine-tuned from.")
@store_options
def export(
    family: str,
    freeze: int | None,
    weights: Path | None,
    fp16: bool,
    preset: str | None,
    cut_at: tuple[str, ...],
    name: str | None,
    parent: str | None,
    endpoint: str | None,
    bucket: str,
) -> None:
    """Export NAME block by block to ONNX and register it.

    NAME is a family: resnet18, resnet50, vgg11, vgg19, alexnet, densenet121,
    mobilenet_v3_large, vit_b_16, efficientnet_lite0 (the only one with real pretrained
    weights unless --weights is given); or any timm:NAME or torchvision:NAME network,
    cut automatically at its cut points (freeze: all blocks if unset).
    """
    from ._hub import is_hub_name

    with cli_errors():
        if is_hub_name(family):
            name = name or family.partition(":")[2]
            check_name(name)
            if fp16:
                raise InvalidModelSpec("--fp16 is for the built-in families only")
            registry = open_registry(endpoint, bucket)
            parent_ref = registry.get_manifest(parent).ref if parent else None
            exported = _export_hub(family, weights, freeze, preset, cut_at)
        else:
            name = name or family
            if preset or cut_at:
                raise InvalidModelSpec("--preset and --cut-at are for timm:/torchvision: names")
            check_name(name)
            registry = open_registry(endpoint, bucket)
            parent_ref = registry.get_manifest(parent).ref if parent else None
            exported = _export_family(family, weights, freeze, fp16)
        _register(registry, name, exported, parent_ref)


def _export_family(family: str, weights: Path | None, freeze: int | None, fp16: bool) -> Any:
    from ._export import export_model
    from ._families import build

    decomposition = build(family, weights=weights)
    decomposition.check_freeze(decomposition.freeze if freeze is None else freeze)
    if decomposition.weights.startswith("random"):
        click.echo(_random_warning(family, decomposition.weights), err=True)
    return export_model(decomposition, freeze=freeze, fp16=fp16, progress=True)


def _export_hub(
    spec: str,
    weights: Path | None,
    freeze: int | None,
    preset: str | None,
    cut_at: tuple[str, ...],
) -> Any:
    from ._hub import RandomWeightsWarning, export_hub

    with warnings.catch_warnings():
        warnings.simplefilter("always", RandomWeightsWarning)
        warnings.showwarning = _echo_warning  # restored when the block ends
        return export_hub(
            spec, weights=weights, freeze=freeze, preset=preset, cut_at=cut_at, progress=True
        )


def _echo_warning(message: Warning | str, *_: Any, **__: Any) -> None:
    click.echo(f"warning: {message}", err=True)


def _register(registry: Registry, name: str, exported: Any, parent: str | None) -> None:
    new = {b.info.hash: b.info.size for b in exported.blocks}
    new = {h: size for h, size in new.items() if not registry.has_block(h)}
    before = _latest_ref(registry, name)
    manifest = registry.register(name, exported, parent=parent)
    if manifest.ref == before:
        click.echo(f"{manifest.ref} is already registered with identical blocks; nothing uploaded")
        return
    click.echo(
        f"registered {manifest.ref}: {len(manifest.blocks)} blocks, {format_bytes(manifest.size)}, "
        f"freeze {manifest.freeze}; uploaded {len(new)} new blocks ({format_bytes(sum(new.values()))})"
    )


@models.command(name="import")
@click.argument("path", metavar="FILE.onnx", type=click.Path(path_type=Path))
@click.option("--name", required=True, help="Registered name.")
@click.option("--freeze", type=int, help="Blocks [0, F) are frozen; the whole graph if unset.")
@click.option(
    "--preset",
    default="imagenet",
    show_default=True,
    help="Preprocessing that produces the graph's input.",
)
@click.option(
    "--cut-at",
    multiple=True,
    metavar="TENSOR",
    help="Cut exactly at this tensor (repeatable) instead of the automatic choice.",
)
@click.option("--parent", help="NAME[@VERSION] this model was fine-tuned from.")
@store_options
def import_(
    path: Path,
    name: str,
    freeze: int | None,
    preset: str,
    cut_at: tuple[str, ...],
    parent: str | None,
    endpoint: str | None,
    bucket: str,
) -> None:
    """Import an ONNX graph, cut into blocks at its cut points, and register it.

    A cut point is a tensor that alone carries the state from the nodes before it to
    the nodes after it. Blocks with less than 1% of the graph's FLOPs are merged into
    a neighbour (the last block, the head, is kept). Every block and their composition
    are verified against the graph on real photos. The graph needs one NCHW float32
    input with a dynamic batch dimension and one output.
    """
    from ._import import import_onnx

    with cli_errors():
        check_name(name)
        registry = open_registry(endpoint, bucket)
        parent_ref = registry.get_manifest(parent).ref if parent else None
        exported = import_onnx(path, preset=preset, freeze=freeze, cut_at=cut_at, progress=True)
        _register(registry, name, exported, parent_ref)


@models.command()
@click.argument("path", metavar="FILE.onnx", type=click.Path(path_type=Path))
@click.option(
    "--preset",
    default="imagenet",
    show_default=True,
    help="Preprocessing that produces the graph's input.",
)
def cuts(path: Path, preset: str) -> None:
    """List the cut points of an ONNX graph, for `hapi models import --cut-at`.

    Marks the ones the automatic choice cuts at, with the share of the graph's
    FLOPs since the previous cut point. Reads no store.
    """
    from ._import import describe_cuts

    with cli_errors():
        found = describe_cuts(path, preset=preset)
    table = Table("#", "tensor", "shape", "flops since previous", "chosen", box=None)
    for index, point in enumerate(found):
        table.add_row(
            str(index),
            point.tensor,
            "x".join(map(str, point.shape)),
            f"{100 * point.share:.1f}%",
            "yes" if point.chosen else "",
        )
    Console(soft_wrap=True, width=200).print(table if found else "no cut points")


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
@store_options
def list_models(endpoint: str | None, bucket: str) -> None:
    """List the registered models (latest versions)."""
    with cli_errors():
        manifests = open_registry(endpoint, bucket).list_models()
    table = Table("model", "family", "blocks", "freeze", "size", "weights", "parent", box=None)
    for manifest in manifests:
        table.add_row(
            manifest.ref,
            manifest.family,
            str(len(manifest.blocks)),
            str(manifest.freeze),
            format_bytes(manifest.size),
            _weights(manifest.weights),
            manifest.parent or "",
        )
    Console(soft_wrap=True, width=200).print(table if manifests else "no models registered")


def _weights(origin: str) -> str:
    """A weights origin short enough for a table column (digests cut to 12 hex digits)."""
    return origin[: len("sha256:") + 12] if origin.startswith("sha256:") else origin


def _blocks_table(manifest: Manifest) -> Table:
    table = Table(
        "#", "block", "output", "out/sample", "peak act", "params", "cpu ms", "zeros", "sha256"
    )
    table.title = (
        f"{manifest.ref}  family {manifest.family}  source {manifest.source or '-'}  "
        f"freeze {manifest.freeze}  preprocess {manifest.preprocess.name}  "
        f"parent {manifest.parent or '-'}  weights {manifest.weights}"
    )
    for index, block in enumerate(manifest.blocks):
        table.add_row(
            str(index),
            block.name,
            "x".join(map(str, block.output_shape)),
            format_bytes(block.output_bytes),
            format_bytes(block.peak_activation_bytes),
            f"{block.params:,}",
            f"{block.cpu_ms:.2f}",
            "-" if block.zeros is None else f"{block.zeros:.0%}",
            block.hash[:12],
            end_section=index == manifest.freeze - 1,
        )
    return table


@models.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@store_options
def show(ref: str, as_json: bool, endpoint: str | None, bucket: str) -> None:
    """Show a model's blocks with output sizes, CPU times and their outputs' zeros."""
    with cli_errors():
        manifest = open_registry(endpoint, bucket).get_manifest(ref)
    if as_json:
        click.echo(manifest.to_json(), nl=False)
        return
    Console(soft_wrap=True, width=200).print(_blocks_table(manifest))


@models.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@store_options
def lineage(ref: str, endpoint: str | None, bucket: str) -> None:
    """Show a model's parent, ancestors and descendants."""
    with cli_errors():
        found = open_registry(endpoint, bucket).lineage(ref)
    click.echo(f"model:       {found.model}")
    click.echo(f"parent:      {found.parent or '-'}")
    click.echo(f"ancestors:   {', '.join(found.ancestors) or '-'}")
    click.echo(f"descendants: {', '.join(found.descendants) or '-'}")


@models.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@store_options
def rm(ref: str, endpoint: str | None, bucket: str) -> None:
    """Remove a version (or all); delete blocks no other model uses."""
    with cli_errors():
        removal = open_registry(endpoint, bucket).remove(ref)
    click.echo(
        f"removed {', '.join(removal.removed)}; deleted {len(removal.deleted_blocks)} "
        f"unshared blocks ({format_bytes(removal.freed_bytes)})"
    )
