"""A plan for people: its table printed with rich (:func:`print_plan`), and as a figure
(:func:`plot_plan`): what each split sends and computes, and each candidate's epoch time.

matplotlib is imported only here, and only its object-oriented API with the Agg canvas:
no pyplot state, no GUI backend, nothing changed for the rest of the process.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from hapi.planner import InvalidInput, format_duration, split_label
from hapi.protocol import format_bandwidth

if TYPE_CHECKING:
    from hapi.planner import Plan

_CHOSEN, _OTHER, _INFEASIBLE = "#d62728", "#1f77b4", "#bbbbbb"


def print_plan(chosen: Plan, *, bandwidth_source: str) -> None:
    """Print ``chosen``'s candidate table, the bandwidth and where it came from, the choice
    and why, where the storage-side figures came from, and a near tie (with rich)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    headers, rows = chosen.table()
    table = Table(*headers, title=Text(chosen.title()), title_justify="left")
    for candidate, cells in zip(chosen.candidates, rows, strict=True):
        style = "bold green" if candidate.split == chosen.split else None
        table.add_row(*(Text(cell) for cell in cells), style=style if candidate.feasible else "dim")
    console = Console(soft_wrap=True, width=max(160, Console().width))
    console.print(table)
    console.print(
        f"bandwidth {format_bandwidth(chosen.bandwidth_bps)} ({bandwidth_source})", style="dim"
    )
    choice = Text.assemble((f"chosen: split {split_label(chosen.split)}", "bold"), ". ")
    console.print(choice + Text(chosen.reason()))
    if chosen.profile.storage_origin:
        console.print(chosen.profile.storage_origin, style="dim")
    tie = chosen.near_tie()
    if tie:
        console.print(tie)


def plot_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Draw ``plan`` into an image file (PNG, SVG or PDF by the suffix of ``path``).

    Left: bytes per sample each split sends (log scale, raw objects dashed) and the
    cumulative compute per sample on each side. Right: predicted epoch time per
    candidate, the chosen one in red, infeasible ones marked.

    Raises:
        InvalidInput: matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise InvalidInput("--plot needs matplotlib: pip install matplotlib") from exc
    figure = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    sizes, epochs = figure.subplots(1, 2, width_ratios=(1, 1))
    _draw_sizes(sizes, plan)
    _draw_epochs(epochs, plan)
    figure.suptitle(
        f"{plan.model}: {format_bandwidth(plan.bandwidth_bps)}, batch {plan.batch_size}, "
        f"{plan.dataset_size:,} samples; chosen split {split_label(plan.split)}"
    )
    figure.savefig(os.fspath(path), dpi=110)


def _draw_sizes(axes: Any, plan: Plan) -> None:
    profile = plan.profile
    splits = list(range(plan.freeze + 1))
    sent = [profile.sent_at(k) / 1000 for k in splits]
    feasible = {c.split: c.feasible for c in plan.candidates}
    colors = [
        _CHOSEN if k == plan.split else _OTHER if feasible[k] else _INFEASIBLE for k in splits
    ]
    axes.bar(splits, sent, color=colors, alpha=0.75, label="sent per sample (KB)")
    raw = profile.raw_bytes / 1000
    axes.axhline(raw, color="black", linestyle="--", label="raw object (KB)")
    low, high = min([*sent, raw]), max([*sent, raw])
    if high > 30 * low:  # sizes span orders of magnitude: early layers vs pooled features
        axes.set_yscale("log")
        axes.set_ylim(low / 2, high * 2)
    else:
        axes.set_ylim(0, high * 1.15)
    axes.set_xlabel("split k (storage side runs blocks [0, k))")
    axes.set_ylabel("KB per sample over the network")
    axes.set_xticks(splits, [str(k) for k in splits])
    compute = axes.twinx()
    load = profile.storage_load / profile.storage_available
    storage = [(profile.storage_decode_ms + sum(profile.storage_ms[:k])) * load for k in splits]
    client = [sum(profile.client_ms[k:]) for k in splits]
    compute.plot(splits, storage, "o-", color="#2ca02c", label="storage: decode + [0, k) ms")
    compute.plot(splits, client, "s-", color="#9467bd", label="client: [k, freeze) ms")
    compute.set_ylabel("compute ms per sample")
    compute.set_ylim(bottom=0)
    handles = axes.get_legend_handles_labels()
    more = compute.get_legend_handles_labels()
    axes.legend(
        handles[0] + more[0],
        handles[1] + more[1],
        fontsize="small",
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2,
    )
    axes.set_title("bytes sent and compute per sample, by split")


def _draw_epochs(axes: Any, plan: Plan) -> None:
    labels = [split_label(c.split) for c in plan.candidates]
    finite = [c.epoch_s for c in plan.candidates if math.isfinite(c.epoch_s)]
    top = max(finite) if finite else 1.0
    unit, scale = _time_unit(top)
    top /= scale
    heights = [c.epoch_s / scale if c.feasible else 0.0 for c in plan.candidates]
    colors = [
        _CHOSEN if c.split == plan.split else _OTHER if c.feasible else _INFEASIBLE
        for c in plan.candidates
    ]
    positions = range(len(labels))
    axes.bar(positions, heights, color=colors)
    for x, candidate in zip(positions, plan.candidates, strict=True):
        if not candidate.feasible:
            axes.text(x, top * 0.02, "x", ha="center", color="black", fontsize=12)
    chosen = [c.split for c in plan.candidates].index(plan.split)
    axes.annotate(
        f"chosen: {format_duration(plan.chosen.epoch_s)}",
        xy=(chosen, plan.chosen.epoch_s / scale),
        xytext=(0, 12),
        textcoords="offset points",
        ha="center",
        color=_CHOSEN,
        fontweight="bold",
        bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": _CHOSEN},
    )
    axes.set_xticks(list(positions), labels)
    axes.set_ylim(0, top * 1.2)
    axes.set_xlabel("candidate (none = no pushdown; x = does not fit in memory)")
    axes.set_ylabel(f"predicted epoch time ({unit})")
    axes.set_title("predicted epoch time per candidate")


def _time_unit(seconds: float) -> tuple[str, float]:
    if seconds >= 7200:
        return "h", 3600.0
    if seconds >= 120:
        return "min", 60.0
    return "s", 1.0
