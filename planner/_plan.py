"""A plan (the chosen split, every candidate, what they were computed from) and the plan
in words: the candidate table as text and data, the reason, a near tie. Printing it (with
rich) and plotting it are the CLI's (``hapi plan``); nothing here prints.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from hapi.protocol import format_bandwidth, format_bytes

from ._candidate import Candidate, fastest, split_label
from ._profile import Profile

DEFAULT_BYTE_MARGIN = 0.10
NEAR_TIE = 0.05
"""Candidates predicted within 5% of the pick are too close for the profile to call."""


def near_rival(plan: Plan, margin: float | None = None) -> Candidate | None:
    """The candidate the plan cannot tell from its pick: the fastest other feasible one
    predicted within ``margin`` (default :data:`NEAR_TIE`) of the pick's epoch, sending no
    more bytes per sample than the pick or the raw objects. ``None`` when the pick stands
    clear."""
    margin = NEAR_TIE if margin is None else margin
    chosen = plan.chosen
    if not math.isfinite(chosen.epoch_s):
        return None
    most_bytes = max(chosen.bytes_per_sample, plan.profile.raw_bytes)
    close = [
        c
        for c in plan.candidates
        if c.split != plan.split
        and c.feasible
        and c.bytes_per_sample <= most_bytes
        and c.epoch_s <= chosen.epoch_s * (1.0 + margin)
    ]
    return fastest(close) if close else None


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The chosen split, every candidate, and the inputs they were computed from.

    Args:
        model: ``NAME@VERSION`` of the manifest.
        freeze: The manifest's freeze point.
        block_names: Names of the frozen blocks.
        split: The chosen split; ``None`` means no pushdown (read raw objects).
        candidates: Every candidate in order: no pushdown, then splits ``0..freeze``.
        bandwidth_bps: The bandwidth assumed, in bits per second.
        batch_size: The training batch size.
        dataset_size: Samples per epoch.
        profile: The profile assumed (its ``wire_dtype`` is the plan's dtype).
        byte_margin: The gain a candidate sending more bytes than the raw objects needs.
        note: Why the choice is not simply the fastest row (a byte guard, or a split
            kept by hysteresis); empty when it is.
        alternative: The best candidate in the other wire dtype (float16 when the plan is
            float32, or the reverse), for the explanation.
        alternative_dtype: That candidate's dtype.
    """

    model: str
    freeze: int
    block_names: tuple[str, ...]
    split: int | None
    candidates: tuple[Candidate, ...]
    bandwidth_bps: float
    batch_size: int
    dataset_size: int
    profile: Profile
    byte_margin: float = DEFAULT_BYTE_MARGIN
    note: str = ""
    alternative: Candidate | None = None
    alternative_dtype: str | None = None

    @property
    def dtype(self) -> str:
        """The wire dtype the plan's bytes are counted in."""
        return self.profile.wire_dtype

    @property
    def chosen(self) -> Candidate:
        """The chosen candidate's row."""
        return self.candidate(self.split)

    def candidate(self, split: int | None) -> Candidate:
        """The row of ``split`` (``None`` for no pushdown)."""
        return next(c for c in self.candidates if c.split == split)

    @property
    def batches(self) -> int:
        """Training batches per epoch."""
        return math.ceil(self.dataset_size / self.batch_size)

    def reason(self) -> str:
        """One sentence on why :attr:`split` was chosen."""
        return reason(self)

    def explain(self) -> str:
        """The candidates as a plain-text table, followed by the choice and its reason."""
        return explain(self)

    def title(self) -> str:
        """The assumptions the plan was made under, on one line."""
        return title(self)

    def table(self) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
        """The candidate table as data: the column headers, and each candidate's cells."""
        return HEADERS, [row(self, candidate) for candidate in self.candidates]

    def near_tie(self) -> str:
        """One line on the candidate predicted too close to the pick to call, if any."""
        return near_tie(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the choice, its reason, the assumptions and every candidate."""
        return {
            "model": self.model,
            "freeze": self.freeze,
            "split": self.split,
            "dtype": self.dtype,
            "reason": self.reason(),
            "note": self.note,
            "shared_compute": self.profile.shared_compute,
            "alternative": None
            if self.alternative is None
            else {"dtype": self.alternative_dtype, **self.alternative.to_dict()},
            "bandwidth_bps": None if math.isinf(self.bandwidth_bps) else self.bandwidth_bps,
            "batch_size": self.batch_size,
            "dataset_size": self.dataset_size,
            "batches": self.batches,
            "block_names": list(self.block_names),
            "candidates": [c.to_dict() for c in self.candidates],
            "profile": asdict(self.profile),
        }


STAGE_WORDS = {
    "storage": "storage side",
    "transfer": "network",
    "client": "client",
    "turns": "readers' turns (each waits for its batch, then computes on it)",
}
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
