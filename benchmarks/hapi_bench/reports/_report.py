"""The report: speedup, planner regret, pipeline efficiency and bytes reduction.

Definitions (per cell, i.e. one model at one bandwidth):

- the pick: the split ``split="auto"`` runs once its first epochs are over: the plan's,
  or, where the plan had a near tie, what its trial kept (``CellResult.kept``); the
  plan's own pick is judged too (*planned regret*), to show what the trial changed;
- speedup: the baseline's epoch time over the pick's (this and the regret and
  the no-pushdown overhead are ratios of epochs by the median of paired rounds where
  both runs were measured in the same interleaved rounds: :func:`ratio`);
- a configuration's epoch (no pushdown, or split k): its run through ``hapi.sdk``, what
  ``split="auto"`` runs once it has chosen, so no pushdown is ``hapi.sdk``'s
  ``split=None`` path; the baseline loader stands in only where that was not measured.
  The baseline loader is what users pick instead: the yardstick of the speedup, not one
  of the planner's choices;
- regret: the pick's epoch time over the best measured configuration's, minus one; a
  pick is *within tolerance* when its regret is at most 5%. Every configuration is timed
  through the same loader, so a no-pushdown pick is neither credited nor blamed for the
  SDK's own overhead, which the speedup and the no-pushdown overhead judge;
- pipeline efficiency: a run's epoch time over the least time a pipeline of its stages
  can take for its batches (``RunResult.pipeline_bound_s``: the slowest stage for every
  batch plus the other stages for one, the fill and drain every pipeline has), where
  the stages are the client's CPU time, the storage tier's CPU time over the share of
  its core the gateway measured it had, and the link bytes at the shaped rate (1.0
  means the pipeline hid everything behind its bottleneck); *at the pick* it is hapi's
  pipeline's: ``hapi.sdk`` without pushdown where the planner keeps raw objects, not
  the baseline loader;
- bytes reduction: the baseline's link bytes per sample over the pick's;
- no-pushdown overhead: the SDK's ``split=None`` epoch over the baseline loader's, the
  median of their paired rounds;
- steal: time the host's hypervisor held a tier's core back while it had work
  (``/proc/stat``), the part of an epoch's noise the machine can account for.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hapi_bench.reports._results import CellResult, RunResult, split_label

TOLERANCE = 0.05
SPEEDUP_TARGET = 2.5
SLOWDOWN_LIMIT = 0.95
REGRET_TARGET = 0.95
EFFICIENCY_TARGET = 1.15
LOCAL_OVERHEAD_LIMIT = 1.03


@dataclass(frozen=True, kw_only=True)
class CellSummary:
    """The headline figures of one cell."""

    model: str
    regime: str
    bandwidth_bps: float
    ratio: float
    baseline_s: float
    sdk_local_s: float | None
    local_overhead: float | None
    pick: int | None
    kept: int | None
    pick_s: float
    best: int | None
    best_s: float
    speedup: float
    regret: float
    within: bool
    planned_regret: float
    planned_within: bool
    efficiency: float | None
    bytes_reduction: float
    can_help: bool
    measured_runs: int
    bounded_runs: int
    steal_s: float
    epochs_s: float


@dataclass(frozen=True, kw_only=True)
class Target:
    """One target of the issue, and whether the run met it."""

    name: str
    value: float | None
    goal: str
    met: bool | None  # None: no case to judge (e.g. no network-bound cell)


def measured(cell: CellResult) -> list[RunResult]:
    """The runs of ``cell`` that were made (not bounded)."""
    return [run for run in cell.runs if run.measured]


def configurations(cell: CellResult) -> list[RunResult]:
    """The measured runs that time the planner's choices: every ``hapi.sdk`` run, and
    the baseline loader only where ``hapi.sdk``'s ``split=None`` was not measured."""
    has_local = cell.sdk_local is not None
    return [run for run in measured(cell) if run.loader == "sdk" or not has_local]


def best_run(cell: CellResult) -> RunResult:
    """The fastest measured configuration (ties: the earlier one), see
    :func:`configurations`.

    Raises:
        ValueError: No run was measured.
    """
    runs = configurations(cell)
    if not runs:
        raise ValueError(f"{cell.model} at {cell.bandwidth_bps:g} bit/s: no measured run")
    return min(runs, key=lambda run: run.epoch_s)


def _required(cell: CellResult, split: int | None) -> RunResult:
    run = cell.run(split)
    if run is None or not run.measured:
        raise ValueError(
            f"{cell.model} at {cell.bandwidth_bps:g} bit/s: {split_label(split)} was not measured"
        )
    return run


def summarize_cell(cell: CellResult, tolerance: float = TOLERANCE) -> CellSummary:
    """The headline figures of ``cell``.

    Raises:
        ValueError: The baseline or the planner's pick was not measured.
    """
    baseline, pick, best = _required(cell, None), pick_run(cell), best_run(cell)
    regret = ratio(pick, best) - 1.0
    planned = ratio(split_run(cell, cell.pick), best) - 1.0
    local = cell.sdk_local
    return CellSummary(
        model=cell.model,
        regime=cell.regime,
        bandwidth_bps=cell.bandwidth_bps,
        ratio=cell.ratio,
        baseline_s=baseline.epoch_s,
        sdk_local_s=None if local is None else local.epoch_s,
        local_overhead=None if local is None else ratio(local, baseline),
        pick=cell.pick,
        kept=cell.kept,
        pick_s=pick.epoch_s,
        best=best.split,
        best_s=best.epoch_s,
        speedup=1.0 / ratio(pick, baseline),
        regret=regret,
        within=regret <= tolerance + 1e-12,
        planned_regret=planned,
        planned_within=planned <= tolerance + 1e-12,
        efficiency=pick.efficiency if pick.loader == "sdk" else None,
        bytes_reduction=baseline.bytes_per_sample / max(pick.bytes_per_sample, 1e-9),
        can_help=can_help(cell),
        measured_runs=len(measured(cell)),
        bounded_runs=len(cell.runs) - len(measured(cell)),
        steal_s=sum(run.steal_s for run in measured(cell)),
        epochs_s=sum(run.epoch_s for run in measured(cell)),
    )


def can_help(cell: CellResult) -> bool:
    """Whether some split sends fewer bytes than the raw objects (VGG11's features
    outweigh its images at every split: no pushdown can speed it up where the link binds,
    and its planner rightly keeps raw objects). Unknown wire sizes count as helping."""
    return not cell.wire_bytes or any(size < cell.raw_bytes for size in cell.wire_bytes[1:])


def pick_run(cell: CellResult) -> RunResult:
    """The run that times what ``split="auto"`` runs (``CellResult.kept``), see
    :func:`split_run`.

    Raises:
        ValueError: It (or, for no pushdown, the baseline) was not measured.
    """
    return split_run(cell, cell.kept)


def split_run(cell: CellResult, split: int | None) -> RunResult:
    """The run that times ``split`` as ``split="auto"`` runs it. For no pushdown that is
    ``hapi.sdk``'s ``split=None`` path, not the baseline loader, which stands in only
    when the SDK's path was not measured (its pipeline efficiency is then not judged: it
    is not hapi's pipeline).

    Raises:
        ValueError: The split (or, for no pushdown, the baseline) was not measured.
    """
    local = cell.sdk_local
    if split is None and local is not None:
        return local
    return _required(cell, split)


def ratio(run: RunResult, other: RunResult) -> float:
    """``run``'s epoch over ``other``'s: the median of their paired rounds where both
    were measured in the same interleaved rounds (epoch ``i`` of each in round ``i``),
    else the ratio of their counted epochs.

    The host's speed drifts between rounds by more than most differences being judged;
    within a round both ran under the same drift, so each round's ratio cancels it
    where a ratio of medians taken from different rounds does not.
    """
    if run is other:
        return 1.0
    rounds = paired(run, other)
    return statistics.median(rounds) if rounds else run.epoch_s / other.epoch_s


def paired(run: RunResult, other: RunResult) -> list[float]:
    """``run``'s epoch over ``other``'s in each round where both were measured in the same
    interleaved rounds; empty where they were not (or are the same run)."""
    if run is other or len(run.attempts_s) < 2 or len(run.attempts_s) != len(other.attempts_s):
        return []
    return [mine / theirs for mine, theirs in zip(run.attempts_s, other.attempts_s, strict=True)]


def undecided(cell: CellResult, tolerance: float = TOLERANCE) -> list[tuple[int | None, str]]:
    """The configurations whose judged comparison the rounds so far cannot settle: the
    SDK's no-pushdown path and the baseline loader when their paired rounds fall on both
    sides of :data:`LOCAL_OVERHEAD_LIMIT`, the pick and the best when theirs fall on both
    sides of ``1 + tolerance``. Either way, not only where the median misses."""
    found: list[tuple[int | None, str]] = []
    baseline, local = cell.run(None), cell.sdk_local
    if (
        baseline is not None
        and local is not None
        and _straddles(paired(local, baseline), LOCAL_OVERHEAD_LIMIT)
    ):
        found += [baseline.key, local.key]
    pick, best = pick_run(cell), best_run(cell)
    if _straddles(paired(pick, best), 1.0 + tolerance):
        found += [pick.key, best.key]
    return list(dict.fromkeys(found))


def _straddles(rounds: Sequence[float], limit: float) -> bool:
    return bool(rounds) and min(rounds) <= limit < max(rounds)


def targets(summaries: Sequence[CellSummary]) -> list[Target]:
    """The issue's targets judged on ``summaries``."""
    network = [s.speedup for s in summaries if s.regime == "network-bound" and s.can_help]
    speedups = [s.speedup for s in summaries]
    within = [s.within for s in summaries]
    planned = [s.planned_within for s in summaries]
    efficiencies = [s.efficiency for s in summaries if s.efficiency is not None]
    overheads = [s.local_overhead for s in summaries if s.local_overhead is not None]

    def judged(name: str, value: float | None, goal: str, ok: bool) -> Target:
        return Target(name=name, value=value, goal=goal, met=None if value is None else ok)

    low_network = min(network) if network else None
    slowest = min(speedups) if speedups else None
    share = sum(within) / len(within) if within else None
    planned_share = sum(planned) / len(planned) if planned else None
    worst = max(efficiencies) if efficiencies else None
    local = max(overheads) if overheads else None
    return [
        judged(
            "speedup where network-bound, models pushdown can help (min)",
            low_network,
            f">= {SPEEDUP_TARGET}x",
            low_network is not None and low_network >= SPEEDUP_TARGET,
        ),
        judged(
            "speedup anywhere (min)",
            slowest,
            f">= {SLOWDOWN_LIMIT}x (never >5% slower)",
            slowest is not None and slowest >= SLOWDOWN_LIMIT,
        ),
        judged(
            "picks within 5% of the best",
            share,
            f">= {REGRET_TARGET:.0%} of cases",
            share is not None and share >= REGRET_TARGET,
        ),
        judged(
            "the plan's picks within 5% of the best (before any trial)",
            planned_share,
            f">= {REGRET_TARGET:.0%} of cases",
            planned_share is not None and planned_share >= REGRET_TARGET,
        ),
        judged(
            "pipeline efficiency at the pick (max)",
            worst,
            f"<= {EFFICIENCY_TARGET}",
            worst is not None and worst <= EFFICIENCY_TARGET,
        ),
        judged(
            "sdk no-pushdown / baseline epoch (max)",
            local,
            f"<= {LOCAL_OVERHEAD_LIMIT} (within 3%)",
            local is not None and local <= LOCAL_OVERHEAD_LIMIT + 1e-12,
        ),
    ]


def steal_lines(summaries: Sequence[CellSummary]) -> list[str]:
    """How much of the counted epochs the host held a core back; nothing on bare metal."""
    steal = sum(s.steal_s for s in summaries)
    epochs = sum(s.epochs_s for s in summaries)
    if steal <= 0 or epochs <= 0:
        return []
    worst = max(summaries, key=lambda s: s.steal_s / s.epochs_s if s.epochs_s else 0.0)
    return [
        f"- host steal: {steal:.1f} s over {epochs:.0f} s of counted epochs "
        f"({steal / epochs:.1%}; the busier core of each run), most in {worst.model} "
        f"{worst.regime} ({worst.steal_s / worst.epochs_s:.1%})"
    ]


def _mbit(bps: float) -> str:
    return f"{bps / 1e6:.3g} Mbit/s"


def _split(split: int | None) -> str:
    return "none" if split is None else str(split)


def _pick(s: CellSummary) -> str:
    """The pick, with the plan's own where a trial changed it."""
    if s.kept == s.pick:
        return _split(s.pick)
    return f"{_split(s.kept)} (planned {_split(s.pick)}, {s.planned_regret:+.1%})"


def _kb(value: float) -> str:
    return f"{value / 1000:.1f}"


def summary_table(summaries: Sequence[CellSummary]) -> list[str]:
    """Markdown rows of the headline figures, one per cell."""
    lines = [
        "| model | regime | bandwidth | compute/network | baseline s | sdk no-pushdown s | pick "
        "| pick s | best | best s | speedup | regret | efficiency | bytes reduction |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        efficiency = "n/a" if s.efficiency is None else f"{s.efficiency:.2f}"
        local = "n/a"
        if s.sdk_local_s is not None and s.local_overhead is not None:
            local = f"{s.sdk_local_s:.2f} ({s.local_overhead - 1:+.1%})"
        lines.append(
            f"| {s.model} | {s.regime} | {_mbit(s.bandwidth_bps)} | {s.ratio:g} "
            f"| {s.baseline_s:.2f} | {local} | {_pick(s)} | {s.pick_s:.2f} | {_split(s.best)} "
            f"| {s.best_s:.2f} | {s.speedup:.2f}x | {s.regret:+.1%}{'' if s.within else ' ✗'} "
            f"| {efficiency} | {s.bytes_reduction:.1f}x |"
        )
    return lines


def runs_table(cell: CellResult) -> list[str]:
    """Markdown rows of every run of ``cell``."""
    lines = [
        "| run | epoch s | predicted s | samples/s | KB/sample | stall s | client CPU s "
        "| storage CPU s | link s | bottleneck | efficiency | steal s (client/storage) "
        "| frames dropped | every epoch s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pick = pick_run(cell)
    for run in cell.runs:
        mark = " (pick)" if run.key == pick.key else ""
        mark += f" x{run.repeats}" if run.repeats > 1 else ""
        predicted = "" if run.predicted_s is None else f"{run.predicted_s:.2f}"
        if not run.measured:
            lines.append(
                f"| {run.label}{mark} | >= {run.epoch_s:.1f} (link bound, not run) | {predicted} "
                f"| | {_kb(run.bytes_per_sample)} | | | | {run.epoch_s:.1f} | link | | | |"
            )
            continue
        lines.append(
            f"| {run.label}{mark} | {run.epoch_s:.2f} | {predicted} | {run.samples_per_s:.1f} "
            f"| {_kb(run.bytes_per_sample)} | {run.stall_s:.2f} | {run.client_cpu_s:.2f} "
            f"| {_storage(run)} | {run.link_s:.2f} | {run.bottleneck} "
            f"| {run.efficiency or 0:.2f} "
            f"| {run.client_steal_s:.2f} / {run.storage_steal_s:.2f} | {_dropped(run)} "
            f"| {', '.join(f'{s:.2f}' for s in run.attempts_s)} |"
        )
    return lines


def _dropped(run: RunResult) -> str:
    if run.link_dropped is None or run.link_frames is None:
        return ""
    return f"{run.link_dropped} of {run.link_frames}"


def drop_lines(cells: Sequence[CellResult]) -> list[str]:
    """How many frames the link's queue dropped in the counted epochs; nothing where the
    runs did not record it."""
    runs = [
        (cell, run)
        for cell in cells
        for run in measured(cell)
        if run.link_frames is not None and run.link_dropped is not None
    ]
    if not runs:
        return []
    dropped = sum(run.link_dropped or 0 for _, run in runs)
    frames = sum(run.link_frames or 0 for _, run in runs)
    cell, worst = max(runs, key=lambda pair: (pair[1].link_dropped or 0, pair[1].epoch_s))
    line = f"- link queue: {dropped} of {frames} frames dropped in the counted epochs"
    if dropped:
        line += (
            f", most in {cell.model} {cell.regime} {worst.label} "
            f"({worst.link_dropped} of {worst.link_frames})"
        )
    return [line]


def _storage(run: RunResult) -> str:
    """The storage tier's CPU seconds, and its core's share where the gateway had less
    than all of it."""
    share = run.storage_available
    if share is None or share >= 1.0:
        return f"{run.storage_cpu_s:.2f}"
    return f"{run.storage_cpu_s:.2f} ({share:.0%} of its core)"


def targets_lines(found: Sequence[Target]) -> list[str]:
    """One line per target: value, goal, met or missed."""
    lines = []
    for target in found:
        verdict = {True: "met", False: "MISSED", None: "no case"}[target.met]
        value = "n/a" if target.value is None else f"{target.value:.3g}"
        lines.append(f"- {target.name}: {value} (target {target.goal}): {verdict}")
    return lines


DEFINITIONS = """\
- *baseline*: raw objects by plain GETs through the gateway (4 concurrent, up to 4
  batches ahead), decoded and run through every frozen block on the client; *sdk, no pushdown*:
  the same through `hapi.sdk` with `split=None`; *split k*: `hapi.sdk` asking the gateway
  for blocks `[0, k)`, running `[k, freeze)` on the client.
- *pick*: what `split="auto"` runs after its first epochs: the plan's split, or where
  another split was predicted within 5% of it, the faster of the two in a trial (an
  epoch of each, kept apart from the runs below); "planned" is the plan's own pick and
  its regret.
- *speedup*: baseline epoch time / the pick's. *regret*: the pick's epoch time /
  the best measured configuration's, minus 1 (within 5% counts as a good pick). Every
  configuration is timed through `hapi.sdk`, what `split="auto"` runs: no pushdown by
  `split=None` (the baseline loader only where that was not measured). Both ratios are
  the median of the two runs' paired rounds where they were measured in the same
  interleaved rounds (the host drifts between rounds, not within one).
- *efficiency*: epoch time / the least time a pipeline of its stages can take (the
  slowest stage for every batch, plus the other stages for one batch: the fill and
  drain); the stages are client CPU seconds, storage-tier CPU seconds over the share of
  its core the gateway measured it had (in parentheses where less than all of it), and
  link bytes at the shaped rate. 1.00 is a perfect pipeline. In the summary it is the
  pick's run, so at a no-pushdown pick `hapi.sdk`'s with `split=None`.
- *bytes reduction*: link bytes per sample of the baseline / of the pick.
- *sdk no-pushdown* (in parentheses): its epoch over the baseline's, the median of their
  paired rounds (each round measures the two back to back).
- *stall*: time the training loop waited for its next batch (in `hapi.sdk` the client's
  blocks run in the prefetch threads, so for SDK runs it includes them).
- *contenders* (the pick, the baseline, the SDK's no-pushdown path and every run within
  15% of the best) are measured in interleaved rounds, `xN` times in all (twice the
  rounds for the two sides of a comparison whose rounds fell on both sides of its limit:
  no-pushdown overhead at 3%, regret at 5%); the median epoch counts (the faster of two; every epoch is listed, in order): the host's speed
  drifts within minutes, and a median of interleaved rounds compares configurations
  under the same drift where the fastest epoch would compare their luckiest minutes.
- *steal*: time the host's hypervisor held the tier's core back while it had work
  (`/proc/stat`), during the counted epoch; on a virtual machine a core woken from idle
  waits for the host, so it is the part of the noise the machine accounts for.
- *frames dropped*: frames the link's shaping queue dropped during the counted epoch, of
  those the storage side sent; a dropped frame stalls its GET until retransmitted."""


def markdown(cells: Sequence[CellResult], meta: dict[str, Any]) -> str:
    """The whole report as markdown: summary, targets, then every run per cell."""
    summaries = [summarize_cell(cell) for cell in cells]
    parts = [
        "# hapi two-tier testbed results",
        "",
        f"{meta.get('description', '')}".strip(),
        "",
        *_run_line(meta),
        DEFINITIONS,
        "",
        "## Summary",
        "",
        *summary_table(summaries),
        "",
        *targets_lines(targets(summaries)),
        *steal_lines(summaries),
        *drop_lines(cells),
        "",
        "## Every run",
    ]
    for cell in cells:
        parts += [
            "",
            f"### {cell.model}, {cell.regime}: {_mbit(cell.bandwidth_bps)} "
            f"(probed {_mbit(cell.probed_bps)}; client {cell.client_rate:.1f} samples/s, "
            f"compute/network {cell.ratio:g}, measured {cell.measured_ratio:.2f}; "
            f"{cell.samples} samples, batch {cell.batch_size}; "
            f"mean object {_kb(cell.raw_bytes)} KB)",
            "",
            f"Planner: {cell.pick_reason}",
            *_trial_lines(cell),
            "",
            *runs_table(cell),
        ]
    return "\n".join(parts) + "\n"


def _trial_lines(cell: CellResult) -> list[str]:
    """The near tie's trial, where the plan had one: its epochs and what it kept."""
    if cell.trial is None:
        return []
    epochs = ", ".join(f"{t:.2f}" for t in cell.trial["epochs_s"])
    return [
        "",
        f"Trial of split {_split(cell.pick)} against split {_split(cell.trial['rival'])} "
        f"(epochs {epochs} s: the pick, the rival, the pick): {cell.trial['why']}",
    ]


def _run_line(meta: dict[str, Any]) -> list[str]:
    """When, where and how loaded the machine was; nothing if the meta lacks it."""
    machine, phases = meta.get("machine"), meta.get("phases")
    if not machine or not phases:
        return []
    return [
        f"Finished {meta.get('date', '')} on {machine.get('cpu')} ({machine.get('cores')} cores; client "
        f"on CPU {machine.get('client_cpu')}, storage on CPU {machine.get('storage_cpu')}"
        f"{' with its blocks on the GPU' if machine.get('storage_device') == 'cuda' else ''}, "
        f"niceness {machine.get('niceness', 0)}{_competitor_note(machine, phases)}); "
        f"{phases.get('total_s', 0):.0f} s in all; "
        f"load average {phases.get('load_average_before', 0):.2f} before, "
        f"{phases.get('load_average_after', 0):.2f} after.",
        "",
    ]


def _competitor_note(machine: dict[str, Any], phases: dict[str, Any]) -> str:
    if not machine.get("storage_competitor"):
        return ""
    return (
        f"; a CPU-bound competitor on CPU {machine.get('storage_cpu')} "
        f"used {phases.get('competitor_cpu_s', 0):.0f} CPU s"
    )


def summary_text(cells: Sequence[CellResult]) -> str:
    """The printed summary: one line per cell, then the targets."""
    summaries = [summarize_cell(cell) for cell in cells]
    lines = []
    for s in summaries:
        efficiency = "n/a" if s.efficiency is None else f"{s.efficiency:.2f}"
        lines.append(
            f"{s.model:<19} {s.regime:<14} {_mbit(s.bandwidth_bps):>13}  "
            f"pick {_pick(s):>4} best {_split(s.best):>4}  speedup {s.speedup:5.2f}x  "
            f"regret {s.regret:+6.1%}  efficiency {efficiency}  bytes {s.bytes_reduction:6.1f}x less"
        )
    return "\n".join(
        [
            *lines,
            "",
            *targets_lines(targets(summaries)),
            *steal_lines(summaries),
            *drop_lines(cells),
        ]
    )


def to_json(cells: Sequence[CellResult], meta: dict[str, Any]) -> dict[str, Any]:
    """Everything: meta, cells with runs, per-cell summaries and targets."""
    summaries = [summarize_cell(cell) for cell in cells]
    return {
        "meta": meta,
        "cells": [cell.to_dict() for cell in cells],
        "summary": [asdict(s) for s in summaries],
        "targets": [asdict(t) for t in targets(summaries)],
    }


def write(out: Path, cells: Sequence[CellResult], meta: dict[str, Any]) -> list[Path]:
    """Write ``results.json`` and ``results.md`` into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps(to_json(cells, meta), indent=2) + "\n")
    paths[1].write_text(markdown(cells, meta))
    return paths


def median_efficiency(cells: Sequence[CellResult]) -> float | None:
    """Median efficiency over every measured run."""
    values = [e for cell in cells for run in measured(cell) if (e := run.efficiency) is not None]
    return statistics.median(values) if values else None
