"""The runs of one model: profile the client, then per bandwidth plan, and measure.

Per bandwidth (a *cell*): shape the link; let the planner choose from a measured profile
(client blocks and decode timed here, storage-side times from the gateway, bandwidth from
its probe); measure the baseline, the SDK without pushdown and the planner's pick; then
sweep every other split in order of predicted time. A split whose bytes alone need the
link longer than ``bound_factor`` times the best epoch measured so far is not run: the
link cannot carry it faster (``bytes * 8 / rate`` is a hard lower bound), so it can be
neither the best nor within 5% of it; it is recorded as that bound. Where the plan has
a near tie (another split predicted within 5% of the pick), its trial runs as
``split="auto"`` runs it, right after the pick's first epoch: one epoch of the rival,
one of the pick, the faster kept; these epochs are kept apart from the configurations'
runs, so the judge's epochs never decide the trial. Last, the *contenders* (the plan's
pick and what its trial kept, the baseline, the SDK's no-pushdown path and every run
within 15% of the best) are measured again, in interleaved rounds, until each has
``repeats`` epochs; the median epoch counts. Where a judged comparison's paired rounds
fall on both sides of its limit (the SDK's no-pushdown path against the baseline loader
at 3%, the pick against the best at 5%), its two configurations get ``repeats`` more
rounds, once: three rounds cannot place a 3% difference on a host that drifts by more. On a virtual machine the host's speed drifts by tens of
percent within minutes (the baseline's client CPU per sample measured 46-68 ms in three
cells of one sweep), far more than the 5% that decides a good pick: the fastest of a few epochs
would compare each configuration's luckiest minute, the median of interleaved rounds
compares them under the same drift.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from hapi import planner, sdk
from hapi.models import Manifest, Registry, RuntimeSettings
from hapi_bench.reports._report import undecided
from hapi_bench.reports._results import CellResult, RunResult, split_label
from hapi_bench.testbed._client import ModelClient
from hapi_bench.testbed._config import REGIMES, BenchConfig, bandwidth_for

PROBE_SECONDS = 2.0
CONTENDER_MARGIN = 0.15


class Progress(Protocol):
    """Where the sweep reports what it does."""

    def log(self, message: str) -> None:
        """A line for the user."""

    def run(self, label: str, total: int) -> Callable[[int], None]:
        """A run starts; the returned callable advances it by a number of samples."""

    def done(self, result: RunResult) -> None:
        """A run ended (measured or bounded)."""


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    """What the client measured about one model, and the epoch it gets."""

    manifest: Manifest
    profile: planner.Profile
    client_rate: float
    raw_bytes: float
    samples: int
    batch_size: int

    @property
    def wire_bytes(self) -> tuple[int, ...]:
        """Payload bytes per sample at each split ``0..freeze``."""
        return wire_bytes(self.manifest)


def wire_bytes(manifest: Manifest) -> tuple[int, ...]:
    """Float32 payload bytes per sample at split ``0..freeze``: the input, then each
    frozen block's output."""
    first = 4 * math.prod(manifest.input.shape)
    return (first, *(block.output_bytes for block in manifest.blocks[: manifest.freeze]))


def lower_bound_s(samples: int, payload_bytes: float, rate_bps: float) -> float:
    """The least time the link needs to carry ``samples`` of ``payload_bytes`` each."""
    return samples * payload_bytes * 8 / rate_bps


def sweep_order(
    predicted: Mapping[int | None, float], pick: int | None, freeze: int, only: Sequence[int] | None
) -> list[int]:
    """Splits to try after the baseline and the pick, most promising first."""
    splits = [k for k in range(freeze + 1) if k != pick and (only is None or k in only)]
    return sorted(splits, key=lambda k: (predicted.get(k, math.inf), k))


def measure_profile(
    registry: Registry,
    manifest: Manifest,
    photos: Sequence[Any],
    sizes: Sequence[int],
    config: BenchConfig,
) -> ModelProfile:
    """Time the client's blocks and decoding here (one thread) and size the epoch;
    ``sizes`` are the object sizes in dataset order."""
    runtime = RuntimeSettings(device="cpu", intra_op_threads=1, inter_op_threads=1)
    client_ms = sdk.measure_client_blocks(registry, manifest, settings=runtime)
    decode_ms = sdk.measure_decode_ms(manifest.preprocess, images=photos)
    rate = 1000.0 / (decode_ms + sum(client_ms))
    samples, batch = config.sizing(rate)
    raw_bytes = sum(sizes[:samples]) / len(sizes[:samples])
    profile = planner.profile_from_manifest(
        manifest,
        client_ms=client_ms,
        raw_bytes=raw_bytes,
        storage_decode_ms=decode_ms,
        client_decode_ms=decode_ms,
    )
    return ModelProfile(
        manifest=manifest,
        profile=profile,
        client_rate=rate,
        raw_bytes=raw_bytes,
        samples=samples,
        batch_size=batch,
    )


def plan_cell(
    gateway: str, measured: ModelProfile, rate_bps: float, auth: sdk.GatewayAuth | None = None
) -> tuple[planner.Plan, float, planner.GatewayProfile]:
    """The planner's plan at the current shaping, the probed bandwidth (the better of
    two probes: interference only ever makes a probe slower), and the gateway's view."""
    size = max(64 * 1024, int(rate_bps / 8 * PROBE_SECONDS))
    probed = max(sdk.probe_bandwidth(gateway, bytes=size, auth=auth) for _ in range(2))
    view = sdk.fetch_gateway_profile(gateway, measured.manifest.name, auth=auth)
    chosen = planner.plan(
        measured.manifest,
        view.apply(measured.profile),
        probed,
        batch_size=measured.batch_size,
        dataset_size=measured.samples,
    )
    return chosen, probed, view


def cell_profile(
    chosen: planner.Plan, view: planner.GatewayProfile, measured: ModelProfile
) -> dict[str, Any]:
    """Everything needed to plan the cell again offline: both sides' per-block times,
    decode times, the storage side's figures as the gateway served them (with sources
    and ages), the host's availability, bandwidth, bytes per sample per split and of the
    raw objects. The measured epochs are the cell's runs."""
    used = chosen.profile
    return {
        "client_ms": list(used.client_ms),
        "client_decode_ms": used.client_decode_ms,
        "storage_ms": list(used.storage_ms),
        "storage_decode_ms": used.storage_decode_ms,
        "storage_available": used.storage_available,
        "storage_load": used.storage_load,
        "served": view.storage.model_dump(),
        "bandwidth_bps": chosen.bandwidth_bps,
        "batch_size": chosen.batch_size,
        "dataset_size": chosen.dataset_size,
        "wire_bytes": list(measured.wire_bytes),
        "raw_bytes": measured.raw_bytes,
    }


def sweep_cell(
    client: ModelClient,
    gateway: str,
    measured: ModelProfile,
    regime: str,
    config: BenchConfig,
    progress: Progress,
) -> CellResult:
    """Every run of one model at one regime's bandwidth."""
    ratio = REGIMES[regime]
    rate = bandwidth_for(ratio, measured.client_rate, measured.raw_bytes)
    client.link.shape(rate)
    auth = client.tier.spec.control_auth()
    chosen, probed, view = plan_cell(gateway, measured, rate, auth)
    progress.log(planned_line(measured.manifest.name, regime, rate, probed, chosen.split))

    def available() -> float | None:
        served = sdk.fetch_gateway_profile(gateway, measured.manifest.name, auth=auth)
        load = served.storage.load
        return load.available if load.source == "measured" else None

    predicted = {c.split: c.epoch_s for c in chosen.candidates}
    cell = _Cell(client, measured, regime, progress, predicted, core_share(config, available))
    cell.measure(None, "raw")
    cell.measure(None, "sdk")
    if chosen.split is not None:
        cell.measure(chosen.split)
    trial = cell.trial(chosen)
    _sweep_splits(cell, chosen.split, rate, config)
    picks = _picks(chosen.split, trial)
    for split, loader in picks:
        cell.measure_once(split, loader)  # a kept split the sweep only bounded is run
    cell.confirm(picks, config.repeats)

    result = CellResult(
        model=measured.manifest.name,
        freeze=measured.manifest.freeze,
        regime=regime,
        ratio=ratio,
        measured_ratio=measured.client_rate / (probed / (measured.raw_bytes * 8)),
        bandwidth_bps=rate,
        probed_bps=probed,
        client_rate=measured.client_rate,
        raw_bytes=measured.raw_bytes,
        batch_size=measured.batch_size,
        pick=chosen.split,
        pick_reason=chosen.reason(),
        wire_bytes=measured.wire_bytes,
        runs=cell.ordered(),
        plan=chosen.to_dict(),
        profile=cell_profile(chosen, view, measured),
        trial=trial,
    )
    settle = undecided(result)
    if settle:  # the same cell, with the rounds that settle it
        cell.more_rounds(settle, config.repeats)
        result = replace(result, runs=cell.ordered())
    return result


def planned_line(model: str, regime: str, rate: float, probed: float, pick: int | None) -> str:
    """The progress line of a cell's plan: the link as shaped and as probed, and the pick."""
    return (
        f"{model} {regime}: {rate / 1e6:.3g} Mbit/s shaped, "
        f"{probed / 1e6:.3g} probed; planner picks {split_label(pick, 'sdk')}"
    )


def _sweep_splits(cell: _Cell, pick: int | None, rate: float, config: BenchConfig) -> None:
    """Every split the cell has not measured, in sweep order: run, or recorded as the
    link's lower bound where that alone rules it out."""
    measured = cell.profile
    for split in sweep_order(cell.predicted, pick, measured.manifest.freeze, config.splits):
        bound = lower_bound_s(measured.samples, measured.wire_bytes[split], rate)
        if config.bound_factor and bound > config.bound_factor * cell.best():
            cell.bounded(split, bound)
        else:
            cell.measure(split)


def _picks(pick: int | None, trial: dict[str, Any] | None) -> list[tuple[int | None, str]]:
    """The plan's pick and, where its trial kept another split, that one, as contender
    keys."""
    picks = [pick] if trial is None or trial["kept"] == pick else [pick, trial["kept"]]
    return [(split, "raw" if split is None else "sdk") for split in picks]


def core_share(
    config: BenchConfig, served: Callable[[], float | None]
) -> Callable[[], float | None] | None:
    """What a pushdown run records as its storage core's share: the gateway's figure
    (``served``) where a competitor holds the rest of the core, nothing on a quiet one,
    where the gateway's shortfall (90-98% of the core) is the store beside it, whose CPU
    seconds the tier's already count."""
    return served if config.storage_competitor else None


class _Cell:
    """The runs of one cell as they are made."""

    def __init__(
        self,
        client: ModelClient,
        measured: ModelProfile,
        regime: str,
        progress: Progress,
        predicted: dict[int | None, float],
        available: Callable[[], float | None] | None = None,
    ) -> None:
        self.client = client
        self.available = available
        self.profile = measured
        self.regime = regime
        self.progress = progress
        self.predicted = predicted
        self.runs: dict[tuple[int | None, str], RunResult] = {}
        self._attempts: dict[tuple[int | None, str], list[RunResult]] = {}

    def best(self) -> float:
        return min(run.epoch_s for run in self.runs.values() if run.measured)

    def measure(self, split: int | None, loader: str = "sdk") -> RunResult:
        name = f"{self.profile.manifest.name} {self.regime} {split_label(split, loader)}"
        advance = self.progress.run(name, self.profile.samples)
        result = self.client.epoch(split, advance, loader)
        if split is not None and self.available is not None:
            # The share of its core the gateway had while this run's blocks ran.
            result = replace(result, storage_available=self.available())
        result = _with_prediction(result, self.predicted.get(split))
        self.progress.done(result)
        attempts = self._attempts.setdefault(result.key, [])
        attempts.append(result)
        self.runs[result.key] = counted(attempts)
        return self.runs[result.key]

    def trial(self, chosen: planner.Plan) -> dict[str, Any] | None:
        """Time ``chosen``'s near tie as ``split="auto"`` does (the pick's first epoch,
        measured already, is the warm-up; then the rival, then the pick) and say what it
        kept; ``None`` without a near tie. No-pushdown epochs run ``hapi.sdk``'s path."""
        trial = planner.Trial.start(chosen)
        if trial is None:
            return None
        runs = [self.runs[(chosen.split, "sdk")]]
        trial.record(chosen.split, runs[0].epoch_s, runs[0].samples)
        for split in trial.schedule[1:]:
            name = f"{self.profile.manifest.name} {self.regime} trial {split_label(split, 'sdk')}"
            runs.append(
                self.client.epoch(split, self.progress.run(name, self.profile.samples), "sdk")
            )
            trial.record(split, runs[-1].epoch_s, runs[-1].samples)
        self.progress.log(f"trial: {trial.why()}")
        return {
            "rival": trial.rival.split,
            "epochs_s": [run.epoch_s for run in runs],
            "kept": trial.kept().split,
            "why": trial.why(),
        }

    def measure_once(self, split: int | None, loader: str) -> None:
        """Measure ``split`` unless it has a measured run (one only bounded has not)."""
        run = self.runs.get((split, loader))
        if run is None or not run.measured:
            self.measure(split, loader)

    def bounded(self, split: int, bound: float) -> None:
        self.runs[(split, "sdk")] = _bounded(split, bound, self.profile, self.predicted.get(split))
        self.progress.done(self.runs[(split, "sdk")])

    def confirm(self, picks: Sequence[tuple[int | None, str]], repeats: int) -> None:
        """Measure the contenders (the picks, both no-pushdown loaders and every run near
        the best) in rounds, each round all of them in turn, until each has ``repeats``
        epochs; the median counts."""
        for split, loader in contenders(self.runs, picks, repeats):
            self.measure(split, loader)

    def more_rounds(self, keys: Sequence[tuple[int | None, str]], rounds: int) -> None:
        """``rounds`` more interleaved rounds of ``keys`` (comparisons the rounds so far
        left undecided, see :func:`hapi_bench._report.undecided`)."""
        for _ in range(rounds):
            for split, loader in keys:
                self.measure(split, loader)

    def ordered(self) -> tuple[RunResult, ...]:
        def order(run: RunResult) -> tuple[int, int]:
            return (-1, 0 if run.loader == "raw" else 1) if run.split is None else (run.split, 0)

        return tuple(sorted(self.runs.values(), key=order))


def counted(attempts: Sequence[RunResult]) -> RunResult:
    """The epoch that counts for a configuration measured ``len(attempts)`` times: the
    median one (the lower of the two middle ones for an even count), with every epoch's
    time kept in ``attempts_s``, in order."""
    ranked = sorted(attempts, key=lambda run: run.epoch_s)
    middle = ranked[(len(ranked) - 1) // 2]
    times = tuple(t for run in attempts for t in run.attempts_s)
    return replace(middle, repeats=len(attempts), attempts_s=times)


def contenders(
    runs: Mapping[tuple[int | None, str], RunResult],
    picks: Sequence[tuple[int | None, str]],
    repeats: int,
) -> list[tuple[int | None, str]]:
    """The measurements still to make, in order: interleaved rounds over the picks (the
    plan's, and what a near tie's trial kept), the baseline, the SDK's no-pushdown path
    and every measured run within :data:`CONTENDER_MARGIN` of the best, until each has
    been measured ``repeats`` times.
    """
    best = min(run.epoch_s for run in runs.values() if run.measured)
    near = [
        key
        for key, run in runs.items()
        if run.measured and run.epoch_s <= (1 + CONTENDER_MARGIN) * best
    ]
    keys = list(dict.fromkeys([*picks, (None, "raw"), (None, "sdk"), *near]))
    done = {key: runs[key].repeats if key in runs else 0 for key in keys}
    order = []
    for round_ in range(1, repeats + 1):
        order += [key for key in keys if done[key] < round_]
    return order


def _with_prediction(result: RunResult, predicted: float | None) -> RunResult:
    value = predicted if predicted is not None and math.isfinite(predicted) else None
    return replace(result, predicted_s=value)


def _bounded(
    split: int, bound: float, measured: ModelProfile, predicted: float | None
) -> RunResult:
    payload = measured.samples * measured.wire_bytes[split]
    return RunResult(
        split=split,
        measured=False,
        epoch_s=bound,
        samples=measured.samples,
        link_bytes=payload,
        payload_bytes=payload,
        link_s=bound,
        predicted_s=predicted if predicted is not None and math.isfinite(predicted) else None,
    )
