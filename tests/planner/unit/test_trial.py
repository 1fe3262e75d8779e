"""Near ties: which candidate is timed against the pick, and what the trial keeps.

The cell is a recorded one (EfficientNet-Lite0, compute-bound, quiet, 2026-11-25): the
plan picked split 7 (2.44 s predicted), split 8 was predicted 2.49 s and split 9 2.59 s,
all three sending the same bytes; measured, split 9 was the fastest.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from hapi.planner import NEAR_TIE, Plan, Trial, near_rival
from tests.planner.unit.test_recorded import RECORDED, replan


def near_tie_cell() -> dict[str, Any]:
    """The recorded cell with a near tie."""
    data = json.loads((RECORDED / "sweep-2026-11-25-quiet-c.json").read_text())
    return next(
        c
        for c in data["cells"]
        if (c["model"], c["regime"]) == ("efficientnet_lite0", "compute-bound")
    )


def _near_tie() -> Plan:
    return replan(near_tie_cell())


def _with_bytes(chosen: Plan, split: int, bytes_per_sample: float) -> Plan:
    candidates = tuple(
        dataclasses.replace(c, bytes_per_sample=bytes_per_sample) if c.split == split else c
        for c in chosen.candidates
    )
    return dataclasses.replace(chosen, candidates=candidates)


def test_the_rival_is_the_fastest_other_candidate_within_5_percent() -> None:
    chosen = _near_tie()
    assert chosen.split == 7

    rival = near_rival(chosen)

    assert rival is not None and rival.split == 8
    assert rival.epoch_s <= chosen.chosen.epoch_s * (1 + NEAR_TIE)
    assert chosen.candidate(9).epoch_s > chosen.chosen.epoch_s * (1 + NEAR_TIE)  # not a tie
    assert near_rival(chosen, margin=0.10).split == 8  # type: ignore[union-attr]  # still the fastest


def test_a_pick_clear_of_every_other_candidate_has_no_trial() -> None:
    chosen = _near_tie()

    assert near_rival(chosen, margin=0.01) is None
    assert Trial.start(chosen, margin=0.01) is None


def test_a_rival_never_sends_more_bytes_than_the_pick_and_the_raw_objects() -> None:
    chosen = _near_tie()
    heavier = max(chosen.chosen.bytes_per_sample, chosen.profile.raw_bytes) + 1

    assert near_rival(_with_bytes(chosen, 8, heavier)) is None
    assert near_rival(_with_bytes(chosen, 8, heavier), margin=0.10).split == 9  # type: ignore[union-attr]


def test_the_trial_runs_pick_rival_pick_and_keeps_a_faster_rival() -> None:
    trial = Trial.start(_near_tie())
    assert trial is not None
    assert trial.schedule == (7, 8, 7)

    splits = []
    for split, seconds in zip(trial.schedule, (30.0, 9.0, 10.0), strict=True):
        splits.append(trial.next_split())
        assert "too close for the profile to call" in trial.why()
        trial.record(split, seconds, 1000)

    assert splits == [7, 8, 7]
    assert trial.done and trial.next_split() == 8
    kept = trial.kept()
    assert kept.split == 8 and kept.chosen.split == 8
    assert kept.note == trial.why()
    assert trial.why().startswith("Kept split 8: timed against split 7")
    assert "11.1% faster (9.0 against 10.0 ms per sample)" in trial.why()


def test_the_warm_up_epoch_does_not_decide_and_a_tie_keeps_the_pick() -> None:
    for rival_s, pick_s in ((10.0, 9.5), (10.0, 10.0)):
        trial = Trial.start(_near_tie())
        assert trial is not None
        trial.record(7, 1.0, 1000)  # a fast warm-up changes nothing
        trial.record(8, rival_s, 1000)
        trial.record(7, pick_s, 1000)
        assert trial.kept().split == 7
        assert trial.why().startswith("Kept split 7")


def test_a_trial_refuses_epochs_out_of_its_schedule() -> None:
    trial = Trial.start(_near_tie())
    assert trial is not None
    with pytest.raises(ValueError, match="not over"):
        trial.kept()
    with pytest.raises(ValueError, match="runs split 7, not 8"):
        trial.record(8, 1.0, 10)
    with pytest.raises(ValueError, match="needs samples and time"):
        trial.record(7, 1.0, 0)
    for split in trial.schedule:
        trial.record(split, 1.0, 10)
    with pytest.raises(ValueError, match="trial is over"):
        trial.record(7, 1.0, 10)


def test_the_explanation_names_the_near_tie_and_a_clear_pick_says_nothing() -> None:
    chosen = _near_tie()

    assert (
        'near tie: split 8 is predicted within 1.9%; split="auto" times both in its first '
        "epochs and keeps the faster." in chosen.explain()
    )
    clear = _with_bytes(chosen, 8, chosen.chosen.bytes_per_sample * 100)
    assert "near tie" not in clear.explain()
