"""Plans in words: the candidate table (plain text here, rich in the CLI) and the reason."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hapi.protocol import format_bandwidth, format_bytes

if TYPE_CHECKING:
    from ._cost import Candidate, Plan

STAGE_WORDS = {"storage": "storage side", "transfer": "network", "client": "client"}
HEADERS = (
    "split",
    "storage runs",
    "bytes/sample",
    "storage ms",
    "transfer ms",
    "client ms",
    "bottleneck",
    "epoch",
)


def split_label(split: int | None) -> str:
    """``none``, ``0``, ``1``... as the table and the CLI write a split."""
    return "none" if split is None else str(split)


def storage_runs(plan: Plan, split: int | None) -> str:
    """What the storage side does at ``split``, in a few words."""
    if split is None:
        return "nothing (raw objects)"
    if split == 0:
        return "decode"
    if split == 1:
        return f"decode + {plan.block_names[0]}"
    return f"decode + {plan.block_names[0]}..{plan.block_names[split - 1]}"


def format_duration(seconds: float) -> str:
    """``0.25`` -> ``250 ms``, ``95`` -> ``95.0 s``, ``4000`` -> ``66.7 min``."""
    if not math.isfinite(seconds):
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def row(plan: Plan, candidate: Candidate) -> tuple[str, ...]:
    """One candidate's cells, in :data:`HEADERS` order."""
    epoch = format_duration(candidate.epoch_s)
    if candidate.infeasible:
        epoch = f"infeasible: {candidate.infeasible}"
    return (
        split_label(candidate.split),
        storage_runs(plan, candidate.split),
        format_bytes(candidate.bytes_per_sample),
        f"{candidate.storage_ms:.1f}",
        f"{candidate.transfer_ms:.1f}",
        f"{candidate.client_ms:.1f}",
        candidate.bottleneck if candidate.feasible else "-",
        epoch,
    )


def title(plan: Plan) -> str:
    """The assumptions a plan was made under, on one line."""
    return (
        f"{plan.model} at {format_bandwidth(plan.bandwidth_bps)}, batch {plan.batch_size}, "
        f"{plan.dataset_size:,} samples per epoch ({plan.batches:,} batches); "
        "stage times in ms per batch"
    )


def explain(plan: Plan) -> str:
    """A plain-text table of every candidate, the chosen one marked, and the reason."""
    rows = [HEADERS, *(row(plan, c) for c in plan.candidates)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
    lines = [title(plan), ""]
    for cells, candidate in zip(rows, [None, *plan.candidates], strict=True):
        marker = "*" if candidate is not None and candidate.split == plan.split else " "
        text = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        lines.append(f"{marker} {text}".rstrip())
    lines += ["", f"chosen: split {split_label(plan.split)}. {reason(plan)}"]
    if plan.profile.storage_origin:
        lines.append(plan.profile.storage_origin)
    if plan.alternative is not None:
        lines.append(alternative(plan))
    tie = near_tie(plan)
    if tie:
        lines.append(tie)
    return "\n".join(lines)


def near_tie(plan: Plan) -> str:
    """One line on the candidate predicted too close to the pick to call, if any."""
    from ._trial import near_rival  # it plans on ._cost, which imports this module

    rival = near_rival(plan)
    if rival is None:
        return ""
    gap = rival.epoch_s / plan.chosen.epoch_s - 1.0
    return (
        f"near tie: split {split_label(rival.split)} is predicted within {gap:.1%}; "
        'split="auto" times both in its first epochs and keeps the faster.'
    )


def alternative(plan: Plan) -> str:
    """One line on what the other wire dtype gives."""
    other = plan.alternative
    assert other is not None
    dtype = plan.alternative_dtype
    chosen = plan.chosen
    line = (
        f"in {dtype}: split {split_label(other.split)}, {format_bytes(other.bytes_per_sample)} "
        f"per sample, {format_duration(other.epoch_s)} per epoch (vs "
        f"{format_duration(chosen.epoch_s)} in {plan.dtype})"
    )
    if other.epoch_s < chosen.epoch_s:
        line += "; allow lower precision to use it"
    return line + "."


def reason(plan: Plan) -> str:
    """Why the plan's split wins: one sentence, plus the byte guard, hysteresis or
    shared-compute note when they applied."""
    extra = [plan.note] if plan.note else []
    if plan.profile.shared_compute:
        shared = (
            "The storage side and this client share the same machine's cores, so their "
            "compute does not overlap"
        )
        saves = plan.split is not None and plan.chosen.bytes_per_sample < plan.profile.raw_bytes
        extra.append(shared + (" and pushdown saves bytes rather than time." if saves else "."))
    return " ".join([_fastest_reason(plan), *extra])


def _fastest_reason(plan: Plan) -> str:
    chosen = plan.chosen
    base = plan.candidate(None)
    fastest = min(c.epoch_s for c in plan.candidates if c.feasible)
    # the byte guard may keep a candidate that is not the fastest: then it only "takes"
    verb = "is fastest at" if chosen.epoch_s <= fastest else "takes"
    if plan.split is None:
        others = [c for c in plan.candidates if c.split is not None and c.feasible]
        if not others:
            return "Reading raw objects is the only candidate that fits in memory."
        runner = min(others, key=lambda c: c.epoch_s)
        return (
            f"No pushdown {verb} {format_duration(chosen.epoch_s)} per epoch "
            f"(bound by the {STAGE_WORDS[chosen.bottleneck]}); the best split, "
            f"{split_label(runner.split)}, would take {format_duration(runner.epoch_s)}, "
            f"bound by the {STAGE_WORDS[runner.bottleneck]} at "
            f"{runner.bottleneck_ms:.1f} ms per batch."
        )
    compared = "no pushdown does not fit in memory"
    if base.feasible:
        compared = (
            f"{_ratio(base.epoch_s / chosen.epoch_s)} faster than no pushdown at "
            f"{format_duration(base.epoch_s)}, which is bound by the "
            f"{STAGE_WORDS[base.bottleneck]}"
        )
    return (
        f"Split {split_label(plan.split)} {verb} {format_duration(chosen.epoch_s)} per "
        f"epoch ({compared}): it sends {format_bytes(chosen.bytes_per_sample)} per sample "
        f"instead of {format_bytes(base.bytes_per_sample)} and is bound by the "
        f"{STAGE_WORDS[chosen.bottleneck]} at {chosen.bottleneck_ms:.1f} ms per batch."
    )


def _ratio(value: float) -> str:
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def print_plan(chosen: Plan, *, bandwidth_source: str) -> None:
    """Print ``chosen``'s candidate table, the bandwidth and where it came from, the choice
    and why, where the storage-side figures came from, and a near tie (with rich)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(*HEADERS, title=Text(title(chosen)), title_justify="left")
    for candidate in chosen.candidates:
        style = "bold green" if candidate.split == chosen.split else None
        cells = (Text(cell) for cell in row(chosen, candidate))
        table.add_row(*cells, style=style if candidate.feasible else "dim")
    console = Console(soft_wrap=True, width=max(160, Console().width))
    console.print(table)
    console.print(
        f"bandwidth {format_bandwidth(chosen.bandwidth_bps)} ({bandwidth_source})", style="dim"
    )
    choice = Text.assemble((f"chosen: split {split_label(chosen.split)}", "bold"), ". ")
    console.print(choice + Text(chosen.reason()))
    if chosen.profile.storage_origin:
        console.print(chosen.profile.storage_origin, style="dim")
    tie = near_tie(chosen)
    if tie:
        console.print(tie)
