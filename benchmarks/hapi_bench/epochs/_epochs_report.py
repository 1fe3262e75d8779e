"""The cache scenario's report: tables per cell and per epoch, the sweep's totals, the
goals, and a plot of epoch time per epoch (``epochs.json``, ``epochs.md``,
``epochs.png``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hapi_bench.epochs._epochs_results import (
    BASELINE,
    CLIENT,
    CONFIGS,
    GATEWAY,
    UNCACHED,
    CacheCell,
    CacheSummary,
    summarize,
    targets,
)

DEFINITIONS = """\
- *baseline*: raw objects by plain GETs, every frozen block on the client; *no cache*: the
  split through a second gateway in the storage tier whose feature cache is off (same
  store, same core); *gateway cache*: the split through the gateway with its cache,
  emptied before epoch 1; *client cache*: the same plus the SDK's `local_cache` on the
  client's disk, both emptied before epoch 1.
- *cold overhead*: the gateway cache's epoch 1 / *no cache*'s epoch, minus 1, per
  interleaved pair (`--repeats` pairs, the order swapped every other pair): the median,
  the least and the most in brackets; *cold storage CPU*: the same with the storage
  tier's CPU seconds, less sensitive to other work on the machine than wall time. *warm speedup*: the baseline's
  mean epoch / the gateway cache's mean of epochs 2+. *client / head*: the client cache's
  epochs 2+ / the time their head's SGD steps took (1.0: the epoch is the head alone).
- Between epochs the runner waits until the gateway has written every entry (*drain*,
  not counted in the epoch, nor in the sweep's totals).
- *sweep*: jobs one after another, each training its own linear head (its own learning
  rate) for the given epochs on the same backbone, split and objects; the caches are
  emptied before the first job, so only job 1's epoch 1 is cold."""


def _opt(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _spread(value: float | None, bounds: tuple[float, float] | None) -> str:
    """A median overhead with its range: ``+1.2% (-0.4..+2.0%)``."""
    if value is None:
        return "n/a"
    if bounds is None:
        return format(value, "+.1%")
    return f"{value:+.1%} ({bounds[0] * 100:+.1f}..{bounds[1]:+.1%})"


def _mbit(bps: float) -> str:
    return f"{bps / 1e6:.3g} Mbit/s"


def summary_table(summaries: Sequence[CacheSummary]) -> list[str]:
    """Markdown rows of each cell's headline figures."""
    lines = [
        "| model | regime | bandwidth | split | baseline s | no cache s | cold s | warm s "
        "| client cache s | head s | cold overhead | cold storage CPU "
        "| with the writes' drain | warm speedup | client speedup | client / head | warm hits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.model} | {s.regime} | {_mbit(s.bandwidth_bps)} | {s.split} "
            f"| {_opt(s.baseline_s, '.2f')} | {_opt(s.uncached_s, '.2f')} "
            f"| {_opt(s.cold_s, '.2f')} | {_opt(s.warm_s, '.2f')} "
            f"| {_opt(s.client_warm_s, '.2f')} | {_opt(s.head_s, '.3f')} "
            f"| {_spread(s.cold_overhead, s.cold_overhead_range)} "
            f"| {_spread(s.cold_cpu_overhead, s.cold_cpu_overhead_range)} "
            f"| {_spread(s.cold_cpu_with_drain, s.cold_cpu_with_drain_range)} "
            f"| {_opt(s.warm_speedup, '.1f')}x "
            f"| {_opt(s.client_speedup, '.1f')}x | {_opt(s.client_over_head, '.1f')}x "
            f"| {_opt(s.warm_hit_ratio, '.0%')} |"
        )
    return lines


def epochs_table(cell: CacheCell) -> list[str]:
    """Markdown rows: seconds per epoch of each configuration (fastest repeat)."""
    header = " | ".join(f"epoch {e}" for e in range(1, cell.epochs + 1))
    lines = [f"| configuration | {header} |", "|---" * (cell.epochs + 1) + "|"]
    for config in CONFIGS:
        times = cell.epoch_times(config)
        if times:
            cells = [f"{t:.2f}" for t in times] + [""] * (cell.epochs - len(times))
            lines.append(f"| {config} | {' | '.join(cells)} |")
    return lines


def runs_table(cell: CacheCell) -> list[str]:
    """Markdown rows of every epoch measured."""
    lines = [
        "| configuration | repeat | epoch | s | KB/sample on the link | head s "
        "| gateway hits | local hits | drain s | storage CPU s | client CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in cell.runs:
        per_sample = run.link_bytes / run.samples / 1000 if run.samples else 0.0
        lines.append(
            f"| {run.config} | {run.repeat} | {run.epoch} | {run.epoch_s:.2f} "
            f"| {per_sample:.1f} | {run.head_s:.3f} | {run.gateway_hit_ratio:.0%} "
            f"| {run.local_hit_ratio:.0%} | {run.drain_s:.2f} | {run.storage_cpu_s:.2f} "
            f"| {run.client_cpu_s:.2f} |"
        )
    return lines


def sweep_lines(cell: CacheCell) -> list[str]:
    """The sweep's totals per configuration, against the total without a cache."""
    sweep = cell.sweep
    if sweep is None:
        return []
    lines = [
        f"Sweep: {sweep.jobs} jobs x {sweep.epochs} epochs, one after another.",
        "",
        "| configuration | total s | per job s | speedup over no cache |",
        "|---|---|---|---|",
    ]
    for config, jobs in sweep.job_s.items():
        per_job = ", ".join(f"{s:.1f}" for s in jobs)
        lines.append(
            f"| {config} | {_opt(sweep.total_s(config), '.1f')} | {per_job} "
            f"| {_opt(sweep.speedup(config), '.2f')}x |"
        )
    return lines


def targets_lines(summaries: Sequence[CacheSummary]) -> list[str]:
    """One line per goal: value, goal, met or missed."""
    lines = []
    for target in targets(summaries):
        verdict = {True: "met", False: "MISSED", None: "no case"}[target.met]
        lines.append(
            f"- {target.name}: {_opt(target.value, '.3g')} (target {target.goal}): {verdict}"
        )
    return lines


def markdown(cells: Sequence[CacheCell], meta: dict[str, Any]) -> str:
    """The whole report."""
    summaries = [summarize(cell) for cell in cells]
    parts = [
        "# hapi feature cache: epochs and sweeps on the two-tier testbed",
        "",
        str(meta.get("description", "")).strip(),
        "",
        DEFINITIONS,
        "",
        "## Summary",
        "",
        *summary_table(summaries),
        "",
        *targets_lines(summaries),
    ]
    for cell in cells:
        parts += [
            "",
            f"## {cell.model}, {cell.regime}: {_mbit(cell.bandwidth_bps)}, split {cell.split} "
            f"({cell.samples} samples, batch {cell.batch_size})",
            "",
            *epochs_table(cell),
            "",
            *sweep_lines(cell),
            "",
            *runs_table(cell),
        ]
    return "\n".join(parts) + "\n"


def summary_text(cells: Sequence[CacheCell]) -> str:
    """The printed summary: one line per cell, the sweeps, then the goals."""
    summaries = [summarize(cell) for cell in cells]
    lines = []
    for s, cell in zip(summaries, cells, strict=True):
        lines.append(
            f"{s.model:<10} {s.regime:<14} {_mbit(s.bandwidth_bps):>13} split {s.split}: "
            f"baseline {_opt(s.baseline_s, '.2f')} s, no cache {_opt(s.uncached_s, '.2f')} s, "
            f"cold {_opt(s.cold_s, '.2f')} s ({_spread(s.cold_overhead, s.cold_overhead_range)}"
            f"; storage CPU {_spread(s.cold_cpu_overhead, s.cold_cpu_overhead_range)}, "
            f"with the writes' drain "
            f"{_spread(s.cold_cpu_with_drain, s.cold_cpu_with_drain_range)}, "
            f"{s.cold_pairs} pairs), "
            f"warm {_opt(s.warm_s, '.2f')} s ({_opt(s.warm_speedup, '.1f')}x), "
            f"client cache {_opt(s.client_warm_s, '.2f')} s (head {_opt(s.head_s, '.3f')} s)"
        )
        if cell.sweep is not None:
            totals = ", ".join(
                f"{config} {_opt(cell.sweep.total_s(config), '.1f')} s"
                for config in cell.sweep.job_s
            )
            lines.append(f"  sweep of {cell.sweep.jobs} jobs: {totals}")
    return "\n".join([*lines, "", *targets_lines(summaries)])


def to_json(cells: Sequence[CacheCell], meta: dict[str, Any]) -> dict[str, Any]:
    """Everything: meta, cells with their epochs, summaries and goals."""
    summaries = [summarize(cell) for cell in cells]
    return {
        "meta": meta,
        "cells": [cell.to_dict() for cell in cells],
        "summary": [asdict(s) for s in summaries],
        "targets": [asdict(t) for t in targets(summaries)],
    }


_STYLE = {
    BASELINE: ("--", "o", "black"),
    UNCACHED: (":", "s", "C1"),
    GATEWAY: ("-", "o", "C0"),
    CLIENT: ("-", "^", "C2"),
}


def plot_epochs(path: Path, cells: Sequence[CacheCell]) -> Path:
    """Epoch seconds per epoch, one panel per cell, one line per configuration, and the
    client cache's head-training time."""
    from hapi_bench.reports._plot import _figure, _save

    fig, axes = _figure(len(cells))
    for ax, cell in zip(axes, cells, strict=True):
        for config in CONFIGS:
            times = cell.epoch_times(config)
            if not times:
                continue
            line, marker, color = _STYLE[config]
            if config == UNCACHED:  # measured on epoch 1; every epoch costs the same
                ax.axhline(min(times), color=color, linestyle=line, label=f"{config} (any epoch)")
                continue
            epochs = list(range(1, len(times) + 1))
            ax.plot(epochs, times, linestyle=line, marker=marker, color=color, label=config)
        head = summarize(cell).head_s
        if head:
            ax.axhline(head, color="C2", linestyle="-.", linewidth=1, label="head training alone")
        ax.set(
            title=f"{cell.model}, {cell.regime} ({_mbit(cell.bandwidth_bps)}), split {cell.split}",
            xlabel="epoch",
            ylabel="epoch seconds (log)",
            yscale="log",
            xticks=list(range(1, cell.epochs + 1)),
        )
        ax.legend(fontsize=7)
    _save(fig, path)
    return path


def write(out: Path, cells: Sequence[CacheCell], meta: dict[str, Any]) -> list[Path]:
    """``epochs.json``, ``epochs.md`` and ``epochs.png`` into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "epochs.json", out / "epochs.md"]
    paths[0].write_text(json.dumps(to_json(cells, meta), indent=2) + "\n")
    paths[1].write_text(markdown(cells, meta))
    if cells:
        paths.append(plot_epochs(out / "epochs.png", cells))
    return paths
