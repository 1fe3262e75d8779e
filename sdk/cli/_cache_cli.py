"""``hapi cache`` (list, measure, prune and empty the feature cache) and ``hapi materialize``
(fill it ahead of training, through the gateway's batcher).

Both reach the store the way boto3 does: ``--endpoint``, else ``AWS_ENDPOINT_URL_S3``,
else ``AWS_ENDPOINT_URL``, with the usual credential chain. ``hapi cache`` works on the
cache bucket directly (the store, or the gateway as a plain S3 endpoint);
``hapi materialize`` needs the gateway, which computes and writes the entries.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click
from botocore.exceptions import BotoCoreError, ClientError
from tqdm import tqdm

from hapi import protocol
from hapi.models.cli import UserError
from hapi.protocol import (
    CACHE_PREFIXES,
    DEFAULT_CACHE_BUCKET,
    CacheEntry,
    eviction_order,
    listed_entries,
)

from ..client._client import client
from ..client._errors import SDKError
from ..client._sources import IMAGE_SUFFIXES, SHARD_SUFFIXES, list_objects, parse_uri

_ENDPOINT_HELP = (
    "S3 endpoint: the gateway or the store [env AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL]."
)
_DELETE_CHUNK = 1000  # S3's limit for one DeleteObjects


def _endpoint_option(command: Any) -> Any:
    return click.option(
        "--endpoint", envvar=["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"], help=_ENDPOINT_HELP
    )(command)


def _bucket_option(command: Any) -> Any:
    return click.option(
        "--bucket",
        default=DEFAULT_CACHE_BUCKET,
        show_default=True,
        envvar="HAPI_CACHE_BUCKET",
        help="The cache bucket [env HAPI_CACHE_BUCKET].",
    )(command)


def _list_entries(s3: Any, bucket: str) -> Iterator[CacheEntry]:
    """Every pack in ``bucket`` (a boto3 S3 client), and every entry written on its own
    (the layout before packs), in key order.

        Raises:
            botocore.exceptions.ClientError: The bucket cannot be listed (e.g. NoSuchBucket).
    """
    for prefix in CACHE_PREFIXES:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            yield from listed_entries(page.get("Contents", []))


def _entries(endpoint: str | None, bucket: str) -> tuple[Any, list[CacheEntry]]:
    s3 = client(endpoint)
    try:
        return s3, list(_list_entries(s3, bucket))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "NoSuchBucket":
            return s3, []
        raise click.ClickException(f"cannot list the cache bucket {bucket!r}: {exc}") from exc
    except BotoCoreError as exc:
        raise click.ClickException(f"cannot reach {endpoint or 'S3'}: {exc}") from exc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cache() -> None:
    """The feature cache: packs of entries in a bucket of the store, keyed by content."""


@cache.command("ls")
@click.option("--limit", type=int, default=50, show_default=True, help="Packs to show.")
@_bucket_option
@_endpoint_option
def ls(limit: int, bucket: str, endpoint: str | None) -> None:
    """List packs, most recently used first: key, size, last use (one per line)."""
    _, entries = _entries(endpoint, bucket)
    for entry in sorted(entries, key=lambda e: e.last_used, reverse=True)[:limit]:
        size = protocol.format_bytes(entry.size)
        click.echo(f"{entry.key}\t{size}\t{_age(entry.last_used)}")
    click.echo(f"{len(entries)} packs, {protocol.format_bytes(_total(entries))}")


@cache.command()
@_bucket_option
@_endpoint_option
def du(bucket: str, endpoint: str | None) -> None:
    """Packs and bytes in the cache."""
    _, entries = _entries(endpoint, bucket)
    oldest = min((e.last_used for e in entries), default=None)
    line = f"{len(entries)} packs, {protocol.format_bytes(_total(entries))} in {bucket}"
    if oldest is not None:
        line += f"; least recently used {_age(oldest)}"
    click.echo(line)


@cache.command()
@click.option(
    "--max-size", required=True, help="Keep at most this much, e.g. 50GB; least recently used go."
)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@_bucket_option
@_endpoint_option
def prune(max_size: str, dry_run: bool, bucket: str, endpoint: str | None) -> None:
    """Delete least-recently-used packs until the cache fits MAX_SIZE."""
    try:
        limit = protocol.parse_size(max_size)
    except ValueError as exc:
        raise UserError(f"--max-size: {exc}") from exc
    s3, entries = _entries(endpoint, bucket)
    doomed = eviction_order(entries, limit)
    freed = protocol.format_bytes(_total(doomed))
    if dry_run:
        click.echo(f"would delete {len(doomed)} of {len(entries)} packs ({freed})")
        return
    _delete(s3, bucket, [e.key for e in doomed])
    click.echo(f"deleted {len(doomed)} of {len(entries)} packs ({freed})")


@cache.command()
@click.option("--all", "everything", is_flag=True, help="Delete every pack.")
@click.argument("packs", nargs=-1)
@_bucket_option
@_endpoint_option
def rm(everything: bool, packs: tuple[str, ...], bucket: str, endpoint: str | None) -> None:
    """Delete PACKS (keys as `hapi cache ls` shows them), or every pack with --all."""
    if everything == bool(packs):
        raise UserError("name the packs to delete, or --all (not both)")
    s3, listed = _entries(endpoint, bucket)
    keys = [e.key for e in listed] if everything else list(packs)
    unknown = sorted(set(keys) - {e.key for e in listed})
    if unknown:
        raise UserError(f"no such pack: {unknown[0]} (`hapi cache ls` lists them)")
    _delete(s3, bucket, keys)
    click.echo(f"deleted {len(keys)} packs")


def _delete(s3: Any, bucket: str, keys: list[str]) -> None:
    with tqdm(total=len(keys), unit="pack", disable=len(keys) < _DELETE_CHUNK) as bar:
        for start in range(0, len(keys), _DELETE_CHUNK):
            chunk = keys[start : start + _DELETE_CHUNK]
            objects = [{"Key": key} for key in chunk]
            s3.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})
            bar.update(len(chunk))


def _total(entries: list[CacheEntry]) -> int:
    return sum(e.size for e in entries)


def _age(when: datetime) -> str:
    seconds = max(0.0, (datetime.now(UTC) - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


@dataclass
class _Summary:
    objects: int = 0
    samples: int = 0
    hits: int = 0
    failed: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


@click.command()
@click.argument("uri")
@click.option("--model", required=True, help="NAME or NAME@VERSION from the registry.")
@click.option("--split", type=int, required=True, help="Blocks [0, SPLIT) run on the gateway.")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "bfloat16"]),
    default="float32",
    show_default=True,
    help="Wire dtype of the cached features (training must ask for the same).",
)
@click.option("--batch", type=int, default=32, show_default=True, help="Objects per request.")
@click.option(
    "--augment",
    default=None,
    help="An augmentation policy (docs/protocol.md): precompute its --views views.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="The policy's seed.")
@click.option("--views", type=int, default=0, help="Views per object, with --augment (>= 1).")
@_endpoint_option
def materialize(
    uri: str,
    model: str,
    split: int,
    dtype: str,
    batch: int,
    augment: str | None,
    seed: int,
    views: int,
    endpoint: str | None,
) -> None:
    """Compute and cache features for every object (image or tar shard) under URI.

    URI is s3://BUCKET/PREFIX. Run it against the gateway before training; interrupted,
    run it again: what is cached already is a cheap hit. Training with the same model,
    split and dtype then reads the cached features.
    """
    if batch < 1 or split < 0:
        raise UserError("--batch must be >= 1 and --split >= 0")
    if (augment is None) != (views == 0) or views < 0 or seed < 0:
        raise UserError("--augment needs --views >= 1 (and --views needs --augment)")
    # Epoch e reads view e mod K: epochs 0..K-1 fill every view once.
    asks: list[dict[str, Any]] = (
        [{}]
        if augment is None
        else [{"augment": augment, "seed": seed, "views": views, "epoch": e} for e in range(views)]
    )
    try:
        bucket, prefix = parse_uri(uri)
    except ValueError:
        raise UserError(f"expected s3://BUCKET/PREFIX, not {uri!r}") from None
    s3 = client(endpoint)
    try:
        listed = list_objects(s3, bucket, prefix, (*IMAGE_SUFFIXES, *SHARD_SUFFIXES))
    except ValueError:
        raise UserError(f"no images or tar shards under {uri}") from None
    except SDKError as exc:
        raise click.ClickException(f"cannot list {uri}: {exc}") from exc
    objects = [(key, size) for key, size, _etag in listed]
    summary, started = _Summary(), time.perf_counter()
    with tqdm(total=len(objects), unit="obj", desc="materialize") as bar:
        for start in range(0, len(objects), batch):
            chunk = objects[start : start + batch]
            for ask in asks:
                _materialize_chunk(s3, bucket, chunk, model, split, dtype, summary, ask)
            bar.update(len(chunk))
    seconds = time.perf_counter() - started
    click.echo(
        f"{summary.objects} objects, {summary.samples} samples "
        f"({summary.hits} objects already cached, {summary.failed} failed); "
        f"{protocol.format_bytes(summary.bytes_in)} of objects -> "
        f"{protocol.format_bytes(summary.bytes_out)} of features in {seconds:.1f} s"
    )
    if summary.failed:
        raise click.ClickException(f"{summary.failed} objects could not be materialized")


def _materialize_chunk(
    s3: Any,
    bucket: str,
    chunk: list[tuple[str, int]],
    model: str,
    split: int,
    dtype: str,
    summary: _Summary,
    ask: Mapping[str, Any],
) -> None:
    keys = [key for key, _ in chunk]
    try:
        answer = s3.get_features_batch(
            Bucket=bucket, Keys=keys, model=model, split=split, dtype=dtype, **ask
        )
    except (SDKError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    summary.objects += len(keys)
    summary.samples += len(answer.keys)
    summary.failed += len(answer.errors)
    summary.hits += len(keys) if answer.cache == "hit" else 0
    summary.bytes_in += sum(size for _, size in chunk)
    summary.bytes_out += answer.nbytes
