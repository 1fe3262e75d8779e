"""Same samples, same order: what each loader delivered, compared with the contender's.

Every loader's epoch is recorded as a :class:`Trace`: the labels in delivery order and
the first ``WIDTH`` values of each sample's features (a fingerprint: the features differ
only by floating-point rounding between loaders, since the same blocks run on the same
decoded pixels, split or not). Two traces agree when the labels are equal element by
element and every fingerprint is within tolerance; a different sample in a place shows
as a label or a fingerprint far off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

WIDTH = 16
RTOL = 1e-3
ATOL = 1e-3


@dataclass
class Trace:
    """What one loader delivered in one epoch."""

    labels: list[int] = field(default_factory=list)
    prints: list[np.ndarray] = field(default_factory=list)

    def add(self, features: Any, labels: Any) -> None:
        """Record a batch: ``features`` ``[B, D]`` (a tensor or array), ``labels`` ``[B]``."""
        rows = np.asarray(features, dtype=np.float32)
        self.labels += [int(label) for label in np.asarray(labels).reshape(-1)]
        self.prints += [row[:WIDTH].copy() for row in rows.reshape(rows.shape[0], -1)]


def compare(reference: Trace, other: Trace) -> str | None:
    """``None`` when ``other`` delivered ``reference``'s samples in its order, else the
    first difference in words."""
    if len(other.labels) != len(reference.labels):
        return f"{len(other.labels)} samples where the reference has {len(reference.labels)}"
    for index, (want, got) in enumerate(zip(reference.labels, other.labels, strict=True)):
        if want != got:
            return f"sample {index}: label {got}, the reference has {want}"
    for index, (want_print, got_print) in enumerate(
        zip(reference.prints, other.prints, strict=True)
    ):
        if not np.allclose(got_print, want_print, rtol=RTOL, atol=ATOL):
            worst = float(np.max(np.abs(got_print - want_print)))
            return f"sample {index}: features differ by up to {worst:.3g}"
    return None


def check(traces: Mapping[str, Mapping[int, Trace]], reference: str) -> str | None:
    """Every loader's trace of every epoch against ``reference``'s of the same epoch;
    ``None`` when all agree, else the differences, one per loader and epoch."""
    problems = []
    for name, epochs in traces.items():
        if name == reference:
            continue
        for epoch, trace in sorted(epochs.items()):
            found = compare(traces[reference][epoch], trace)
            if found is not None:
                problems.append(f"{name} epoch {epoch}: {found}")
    return "; ".join(problems) or None
