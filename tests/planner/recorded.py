"""How the planner's tests judge a pick on a recorded testbed cell (``recorded/*.json``).

A cell is read as the JSON ``hapi bench`` wrote (its ``runs``), not through the
benchmarks' classes: the planner's tests judge the planner, and only need the measured
epochs. The judgement is the one ``hapi bench`` reports:

- the configurations are the measured runs through ``hapi.sdk`` (no pushdown by its
  ``split=None`` path), the baseline loader (``loader: raw``) only where that path was
  not measured;
- the best is the fastest of them (ties: the earlier run);
- a pick's regret is its epoch over the best's, less one: the median of their paired
  rounds where both were measured in the same interleaved rounds (the host's speed drifts
  between rounds by more than most differences judged here; within a round both ran under
  the same drift), else the ratio of their counted epochs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOLERANCE = 0.05  # a pick is right within 5% of the best measured


@dataclass(frozen=True)
class Measured:
    """One measured configuration of a cell."""

    split: int | None
    loader: str
    epoch_s: float
    attempts_s: tuple[float, ...]

    @property
    def label(self) -> str:
        if self.split is not None:
            return f"split {self.split}"
        return "baseline" if self.loader == "raw" else "sdk, no pushdown"


def configurations(cell: Mapping[str, Any]) -> dict[int | None, Measured]:
    """The measured configuration of each split (``None``: no pushdown)."""
    runs = [_measured(run) for run in cell["runs"] if run.get("measured", True)]
    has_local = any(run.split is None and run.loader == "sdk" for run in runs)
    return {run.split: run for run in runs if run.loader == "sdk" or not has_local}


def best(cell: Mapping[str, Any]) -> Measured:
    """The fastest measured configuration (ties: the earlier one)."""
    return min(configurations(cell).values(), key=lambda run: run.epoch_s)


def regret(run: Measured, other: Measured) -> float:
    """How much slower ``run`` is than ``other`` (0.059: 5.9%), by paired rounds where
    there were rounds."""
    if run is other:
        return 0.0
    rounds = _paired(run.attempts_s, other.attempts_s)
    return (statistics.median(rounds) if rounds else run.epoch_s / other.epoch_s) - 1.0


def regret_of(cell: Mapping[str, Any], split: int | None) -> float:
    """The regret of ``split`` in ``cell`` against the best measured.

    Raises:
        KeyError: ``split`` was not measured in ``cell``.
    """
    return regret(configurations(cell)[split], best(cell))


def _measured(run: Mapping[str, Any]) -> Measured:
    attempts = tuple(run.get("attempts_s", ()))
    return Measured(run["split"], run.get("loader", "sdk"), run["epoch_s"], attempts)


def _paired(mine: Sequence[float], theirs: Sequence[float]) -> list[float]:
    if len(mine) < 2 or len(mine) != len(theirs):
        return []
    return [a / b for a, b in zip(mine, theirs, strict=True)]
