"""Near ties: two candidates the profile cannot tell apart are timed, an epoch each.

A profile predicts an epoch to within a few percent at best: per-block times measured
one block at a time, a load that moves, a host whose speed drifts. Where the runner-up
is predicted within :data:`NEAR_TIE` of the pick, the prediction cannot decide between
them, and measured epochs can. EfficientNet-Lite0's splits 7, 8 and 9 send the same bytes
and were predicted 2.96, 3.04 and 3.11 s in one sweep; they measured 3.05, 3.80 and
3.85 s (quiet, 2026-11-23), and in another the order came out reversed.

A :class:`Trial` runs the pick for a warm-up epoch (the first requests pay for sessions
and connections), the rival for one epoch and the pick for one more, then keeps the
faster of the last two, whose epochs ran one after the other under the same conditions.
It spends one epoch on the rival, keeps the rival only if that epoch was faster, and
never tries a candidate sending more bytes than the pick or the raw objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ._candidate import Candidate, split_label
from ._plan import Plan, near_rival


@dataclass
class Trial:
    """Times a near tie: the pick (warm-up), the rival, the pick again; keeps the faster.

    Feed it each full epoch with :meth:`record`; :meth:`next_split` says which split the
    next epoch runs, and once :attr:`done`, :meth:`kept` is the plan to keep.

    Args:
        plan: The plan whose pick is on trial.
        rival: The near-tied candidate (see :func:`near_rival`).
    """

    plan: Plan
    rival: Candidate
    seconds_per_sample: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, plan: Plan, margin: float | None = None) -> Trial | None:
        """A trial of ``plan``'s pick against its near rival, or ``None`` without one."""
        found = near_rival(plan, margin)
        return None if found is None else cls(plan, found)

    @property
    def schedule(self) -> tuple[int | None, ...]:
        """The split of each epoch the trial runs."""
        return (self.plan.split, self.rival.split, self.plan.split)

    @property
    def done(self) -> bool:
        """Whether every epoch of the schedule has been recorded."""
        return len(self.seconds_per_sample) >= len(self.schedule)

    def next_split(self) -> int | None:
        """The split the next epoch runs: the schedule's, then the kept one."""
        if self.done:
            return self.kept().split
        return self.schedule[len(self.seconds_per_sample)]

    def record(self, split: int | None, seconds: float, samples: int) -> None:
        """One full epoch at ``split``, ``seconds`` of wall time for ``samples``.

        Raises:
            ValueError: The epoch ran another split than the schedule's, or is empty.
        """
        if self.done:
            raise ValueError("the trial is over")
        expected = self.schedule[len(self.seconds_per_sample)]
        if split != expected:
            raise ValueError(
                f"the trial's epoch runs split {split_label(expected)}, not {split_label(split)}"
            )
        if samples < 1 or not seconds > 0:
            raise ValueError("a trial epoch needs samples and time")
        self.seconds_per_sample.append(seconds / samples)

    def kept(self) -> Plan:
        """The plan to keep: the pick's, or the rival's when its epoch was faster.

        Raises:
            ValueError: The trial is not over.
        """
        if not self.done:
            raise ValueError("the trial is not over")
        _, rival_s, pick_s = self.seconds_per_sample
        if rival_s >= pick_s:
            return replace(self.plan, note=self.why())
        return replace(self.plan, split=self.rival.split, note=self.why())

    def why(self) -> str:
        """What the trial found (or what it will do, before it is over)."""
        pick, other = split_label(self.plan.split), split_label(self.rival.split)
        if not self.done:
            predicted = self.rival.epoch_s / self.plan.chosen.epoch_s - 1.0
            steps = (
                f"after a first epoch at split {pick}, one epoch runs split {other} and one "
                f"split {pick}",
                f"the next epoch runs split {other}, the one after it split {pick}",
                f"the next epoch runs split {pick} again",
            )[len(self.seconds_per_sample)]
            return (
                f"Split {other} is predicted within {predicted:.1%} of split {pick}, too "
                f"close for the profile to call: {steps}, and the faster is kept."
            )
        _, rival_s, pick_s = self.seconds_per_sample
        faster, slower = (other, pick) if rival_s < pick_s else (pick, other)
        gain = max(rival_s, pick_s) / min(rival_s, pick_s) - 1.0
        return (
            f"Kept split {faster}: timed against split {slower} in adjacent epochs, it was "
            f"{gain:.1%} faster ({1000 * min(rival_s, pick_s):.1f} against "
            f"{1000 * max(rival_s, pick_s):.1f} ms per sample)."
        )
