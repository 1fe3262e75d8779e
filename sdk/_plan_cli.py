"""``hapi plan``: predicted epoch time per split, and the chosen split with its reason.

The manifest comes from the registry the way ``hapi models`` reads it (``--endpoint``,
else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, with the usual credential chain).
``--bandwidth auto`` treats the endpoint as a hapi gateway: it probes the bandwidth and
takes the gateway's storage-side view (times calibrated on real traffic, its memory
budget, its load). Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import click

from hapi.models import Manifest, NoSuchModel, Registry
from hapi.models.cli import UserError, cli_errors, open_registry, store_options
from hapi.planner import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_DATASET_SIZE,
    DEFAULT_RAW_BYTES,
    InvalidInput,
    Plan,
    PlannerError,
    Profile,
    profile_from_manifest,
)
from hapi.planner import plan as compute_plan
from hapi.protocol import InvalidValue, parse_bandwidth, parse_size

from ._errors import ProbeError
from ._measure import measure_client_blocks, measure_decode_ms
from ._plan_view import plot_plan, print_plan
from ._probe import fetch_gateway_profile, probe_bandwidth

_BARE_NUMBER = re.compile(r"\s*(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*")
_MEMORY_HELP = "memory budget, e.g. 16GB or 8GiB; unlimited if unset."


@contextlib.contextmanager
def _planner_errors() -> Iterator[None]:
    try:
        yield
    except (InvalidInput, InvalidValue) as exc:
        raise UserError(str(exc)) from exc
    except (PlannerError, ProbeError) as exc:  # the gateway failed, or nothing fits
        raise click.ClickException(str(exc)) from exc


@click.command(name="plan")
@click.option("--model", "ref", required=True, metavar="NAME[@VERSION]", help="The model.")
@click.option(
    "--bandwidth",
    required=True,
    help="Client-gateway bandwidth with its unit: 100mbit, 1gbit, 50Mbit/s, 2.5GB/s "
    "(b = bits, B = bytes), or auto to probe the gateway at --endpoint.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    help="Training batch size.",
)
@click.option(
    "--dataset-size",
    type=click.IntRange(min=1),
    default=DEFAULT_DATASET_SIZE,
    show_default=True,
    help="Samples per epoch (ImageNet-1k's by default).",
)
@click.option(
    "--raw-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_RAW_BYTES,
    show_default=True,
    help="Mean object bytes per sample.",
)
@click.option(
    "--head-ms", type=click.FloatRange(min=0), default=0.0, help="Head training step, ms/sample."
)
@click.option("--client-memory", metavar="SIZE", help="Client " + _MEMORY_HELP)
@click.option("--storage-memory", metavar="SIZE", help="Storage-side " + _MEMORY_HELP)
@click.option(
    "--measure", is_flag=True, help="Time decoding and the frozen blocks here (client side)."
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Draw sizes, compute and epoch times per split into FILE (.png, .svg, .pdf).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@store_options
def plan(
    ref: str,
    bandwidth: str,
    batch: int,
    dataset_size: int,
    raw_bytes: int,
    head_ms: float,
    client_memory: str | None,
    storage_memory: str | None,
    measure: bool,
    plot: Path | None,
    as_json: bool,
    endpoint: str | None,
    bucket: str,
) -> None:
    """Predict the epoch time of every split of a model and choose the fastest."""
    with _planner_errors():
        auto = bandwidth.strip().lower() == "auto"
        if auto and not endpoint:
            raise InvalidInput("--bandwidth auto probes the gateway: give --endpoint URL")
        bits = math.nan if auto else _bandwidth(bandwidth)
        client_budget = parse_size(client_memory) if client_memory else None
        storage_budget = parse_size(storage_memory) if storage_memory else None
        with cli_errors():
            registry = open_registry(endpoint, bucket)
            manifest = _manifest(registry, ref)
            profile = profile_from_manifest(
                manifest,
                raw_bytes=raw_bytes,
                head_ms=head_ms,
                client_memory_bytes=client_budget,
                storage_memory_bytes=storage_budget,
            )
            if measure:
                profile = _measured(registry, manifest, profile)
        if auto and endpoint:
            bits = probe_bandwidth(endpoint)
            profile = fetch_gateway_profile(endpoint, manifest.ref).apply(profile)
        chosen = compute_plan(manifest, profile, bits, batch_size=batch, dataset_size=dataset_size)
        if plot is not None:
            _plot(chosen, plot)
    if as_json:
        click.echo(json.dumps(chosen.to_dict(), indent=1))
        return
    print_plan(chosen, bandwidth_source="probed" if auto else "given")


def _bandwidth(text: str) -> float:
    """``--bandwidth``: a number must carry its unit (bits and bytes differ eightfold)."""
    if _BARE_NUMBER.fullmatch(text):
        number = text.strip()
        raise InvalidInput(
            f"--bandwidth {number} has no unit: say {number}mbit (bits per second) "
            f"or {number}MB/s (bytes per second)"
        )
    return parse_bandwidth(text)


def _manifest(registry: Registry, ref: str) -> Manifest:
    """The model's manifest; an unknown one is answered with the models there are."""
    try:
        return registry.get_manifest(ref)
    except NoSuchModel as exc:
        known = ", ".join(m.ref for m in registry.list_models())
        there = f"registered: {known}" if known else "no model is registered"
        raise UserError(
            f"{exc}; {there}. Export one with `hapi models export FAMILY` "
            "(e.g. resnet18, efficientnet_lite0)"
        ) from exc


def _measured(registry: Registry, manifest: Manifest, profile: Profile) -> Profile:
    client_ms = measure_client_blocks(registry, manifest)
    decode_ms = measure_decode_ms(manifest.preprocess)
    return dataclasses.replace(profile, client_ms=client_ms, client_decode_ms=decode_ms)


def _plot(chosen: Plan, path: Path) -> None:
    try:
        plot_plan(chosen, path)
    except OSError as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # matplotlib: an image format it does not know
        raise InvalidInput(f"cannot draw {path}: {exc}") from exc
    click.echo(f"wrote {path}", err=True)
