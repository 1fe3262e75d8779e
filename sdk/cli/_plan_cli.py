"""``hapi plan``: predicted epoch time per split, and the chosen split with its reason.

The manifest comes from the registry the way ``hapi models`` reads it (``--endpoint``,
else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, with the usual credential chain).
The bandwidth, and where it came from (printed with it): ``--bandwidth B`` (given);
``--probe`` (measured now, about a second of the link, and remembered for the next job);
else the figure an earlier job or probe remembered for ``--endpoint`` within its lifetime
(``--bandwidth auto`` probes when there is none); else ``HAPI_BANDWIDTH`` (a hint); else
none (default): then no table, only the split a job starts at, the one sending the
fewest bytes. With a gateway to ask (``--endpoint``, and ``--probe``, ``auto`` or a
remembered figure), the gateway's storage-side view is taken too (times calibrated on
real traffic, its memory budget, its load). Bad input ends with one line on stderr and
exit code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
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

from ..client._errors import ProbeError
from ..client._probe import fetch_gateway_profile, probe_bandwidth
from ..planning._link import Bandwidth, BandwidthMemory, endpoint_key
from ..planning._measure import measure_decode_ms, run_client_blocks
from ..planning._plan_view import plot_plan, print_plan
from ..planning._split import PROBE_SECONDS, fewest_bytes

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
    envvar="HAPI_BANDWIDTH",
    help="Client-gateway bandwidth with its unit: 100mbit, 1gbit, 50Mbit/s, 2.5GB/s "
    "(b = bits, B = bytes), or auto: the figure remembered for --endpoint, else a probe. "
    "From HAPI_BANDWIDTH it is a hint, after a remembered figure. Without any: the split "
    "a job starts at (the fewest bytes).",
)
@click.option(
    "--probe",
    is_flag=True,
    help=f"Measure the bandwidth to --endpoint now (about {PROBE_SECONDS:g} s of the link) "
    "and remember it for the next job.",
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
    "--measure",
    is_flag=True,
    help="Time decoding and the frozen blocks here (client side) and count their outputs' "
    "zeros (else the manifest's count on the export's photos).",
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
    bandwidth: str | None,
    probe: bool,
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
    hinted = click.get_current_context().get_parameter_source("bandwidth")
    with _planner_errors():
        figure = _Figure(
            bandwidth, probe, endpoint, hinted == click.core.ParameterSource.ENVIRONMENT
        )
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
                zeros=manifest.zeros,
            )
            if measure:
                profile = _measured(registry, manifest, profile)
        found = figure.resolve()
        if found is None:
            _starts_at(manifest, profile.wire_dtype, as_json)
            return
        if found.source in ("measured", "remembered") and endpoint:
            profile = _viewed(endpoint, manifest, profile, strict=found.source == "measured")
        bits = found.bits_per_second
        chosen = compute_plan(manifest, profile, bits, batch_size=batch, dataset_size=dataset_size)
        if plot is not None:
            _plot(chosen, plot)
    if as_json:
        click.echo(json.dumps({**chosen.to_dict(), "bandwidth_source": found.source}, indent=1))
        return
    print_plan(chosen, bandwidth_source=_described(found))


@dataclasses.dataclass(frozen=True)
class _Figure:
    """Where ``hapi plan`` takes its bandwidth from (see the module's docstring)."""

    given: str | None
    probe: bool
    endpoint: str | None
    hint: bool

    def __post_init__(self) -> None:
        auto = self.given is not None and self.given.strip().lower() == "auto"
        if (auto or self.probe) and not self.endpoint:
            what = "--probe" if self.probe else "--bandwidth auto"
            raise InvalidInput(f"{what} probes the gateway: give --endpoint URL")
        if self.given is not None and not auto:
            _bandwidth(self.given)  # a bad figure is refused before anything is read

    def resolve(self) -> Bandwidth | None:
        """The figure, probing or reading the remembered ones as asked; ``None``: none."""
        auto = self.given is not None and self.given.strip().lower() == "auto"
        if self.given is not None and not auto and not self.hint:
            return Bandwidth(_bandwidth(self.given), "given")
        memory = BandwidthMemory.from_environment(os.environ)
        if self.endpoint and not self.probe:
            remembered = memory.recall(endpoint_key([self.endpoint]))
            if remembered is not None:
                return remembered
        if self.endpoint and (self.probe or auto):
            bits = probe_bandwidth(self.endpoint, seconds=PROBE_SECONDS)
            memory.remember(endpoint_key([self.endpoint]), bits)
            return Bandwidth(bits, "measured")
        return None if self.given is None else Bandwidth(_bandwidth(self.given), "hint")


def _viewed(endpoint: str, manifest: Manifest, profile: Profile, *, strict: bool) -> Profile:
    """``profile`` priced by the gateway's view; unless ``strict`` (a gateway just probed),
    an endpoint that gives none leaves the manifest's figures, and says so."""
    try:
        return fetch_gateway_profile(endpoint, manifest.ref).apply(profile)
    except ProbeError as exc:
        if strict:
            raise
        click.echo(f"storage-side figures from the manifest: {exc}", err=True)
        return profile


def _described(found: Bandwidth) -> str:
    if found.source == "measured":
        return "measured now"
    if found.source == "remembered" and found.measured_at is not None:
        minutes = max(0.0, time.time() - found.measured_at) / 60
        return f"remembered, measured {minutes:.0f} min ago"
    return found.source


def _starts_at(manifest: Manifest, dtype: str, as_json: bool) -> None:
    """No bandwidth at all: the split a job starts at (default), and how to get a plan."""
    start = fewest_bytes(manifest, manifest.freeze, dtype, "no bandwidth is known")
    if as_json:
        reply = {"split": start.split, "bandwidth_source": "default", "reason": start.reason}
        click.echo(json.dumps(reply, indent=1))
        return
    click.echo(f"chosen: split {start.split} (default). {start.reason}.")
    click.echo(
        "For the table, give --bandwidth B, or --probe with --endpoint URL; a job against "
        "the gateway remembers the bandwidth it measures for the next plan."
    )


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
    """The client's figures timed here on sample photos, and their features' zeros (the
    SDK's answers leave them out, so a split is priced without them)."""
    client_ms, zeros = run_client_blocks(registry, manifest)
    decode_ms = measure_decode_ms(manifest.preprocess)
    return dataclasses.replace(
        profile, client_ms=client_ms, client_decode_ms=decode_ms, zeros=zeros
    )


def _plot(chosen: Plan, path: Path) -> None:
    try:
        plot_plan(chosen, path)
    except OSError as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # matplotlib: an image format it does not know
        raise InvalidInput(f"cannot draw {path}: {exc}") from exc
    click.echo(f"wrote {path}", err=True)
