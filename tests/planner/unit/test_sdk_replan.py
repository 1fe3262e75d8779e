"""The SDK's re-planning goes through hysteresis: one epoch's drift does not flip the split."""

from __future__ import annotations

import dataclasses

import pytest

from hapi import planner
from hapi.models import Manifest
from hapi.sdk.planning._split import SplitChoice, replanned, resumed_at
from hapi.sdk.planning._stats import EpochStats
from tests.planner import synthetic
from tests.planner.unit.test_recorded import manifest_of, profile_of, replan
from tests.planner.unit.test_trial import near_tie_cell


def _epoch(epoch: int, split: int | None, bandwidth_bps: float) -> EpochStats:
    samples, per_sample = 1000, 200_000
    return EpochStats(
        epoch=epoch,
        samples=samples,
        seconds=10.0,
        bytes_received=samples * per_sample,
        wait_seconds=0.0,
        requests=10,
        split=split,
        mode="pushdown",
        server_ms={},
        transfer_seconds=samples * per_sample * 8 / bandwidth_bps,
        transfer_bytes=samples * per_sample,
    )


def test_a_persistent_drift_changes_the_split_on_the_second_epoch_only() -> None:
    model, profile = synthetic.r18(raw_bytes=110_000.0)
    first = planner.plan(model, profile, 1e9)
    keeper = planner.SplitKeeper(first)
    choice = SplitChoice(first.split, first.reason(), "planner", first, True, keeper)
    # epoch 0: the link collapsed to 20 Mbit/s; a later split would be much faster
    assert replanned(choice, model, _epoch(0, first.split, 20e6)) is None
    assert "1 of 2" in keeper.why
    changed = replanned(choice, model, _epoch(1, first.split, 20e6))
    assert changed is not None and changed.split != first.split
    assert changed.policy == "replanned" and "changed split" in changed.reason


def test_a_drift_that_does_not_change_the_best_split_keeps_it() -> None:
    model, profile = synthetic.r18(raw_bytes=110_000.0)
    first = planner.plan(model, profile, 100e6)
    keeper = planner.SplitKeeper(first)
    choice = SplitChoice(first.split, first.reason(), "planner", first, True, keeper)
    for epoch in range(3):  # 40% slower link: re-planned, but the same split stays best
        assert replanned(choice, model, _epoch(epoch, first.split, 60e6)) is None
    assert "still the best" in keeper.why


def test_alternating_noise_never_flips_the_split() -> None:
    model, profile = synthetic.r18(raw_bytes=110_000.0)
    first = planner.plan(model, profile, 100e6)
    keeper = planner.SplitKeeper(first)
    choice = SplitChoice(first.split, first.reason(), "planner", first, True, keeper)
    for epoch in range(6):  # the link reads fast, then normal, then fast...
        bandwidth = 400e6 if epoch % 2 == 0 else 100e6
        assert replanned(choice, model, _epoch(epoch, first.split, bandwidth)) is None


# -- a near tie's trial ------------------------------------------------------------------


def _trial_choice() -> tuple[SplitChoice, Manifest]:
    cell = near_tie_cell()
    first = replan(cell)
    trial = planner.Trial.start(first)
    assert trial is not None and (first.split, trial.rival.split) == (7, 8)
    keeper = planner.SplitKeeper(first)
    choice = SplitChoice(first.split, first.reason(), "planner", first, False, keeper, trial)
    return choice, manifest_of(cell, profile_of(cell))


def _timed(epoch: int, split: int, seconds: float, choice: SplitChoice) -> EpochStats:
    # The plan's own storage time, so nothing drifts: only the trial moves the split.
    assert choice.plan is not None
    storage_s = choice.plan.candidate(split).storage_ms / choice.plan.batch_size * 256 / 1000
    return EpochStats(
        epoch=epoch,
        samples=256,
        seconds=seconds,
        bytes_received=256 * 62_720,
        wait_seconds=0.0,
        requests=32,
        split=split,
        mode="pushdown",
        server_ms={},
        storage_seconds=storage_s,
    )


def test_a_near_tie_runs_the_rival_then_the_pick_and_keeps_the_faster() -> None:
    choice, model = _trial_choice()
    splits = [choice.split]
    for epoch, seconds in enumerate((3.0, 2.6, 2.8)):
        assert choice.split is not None
        changed = replanned(choice, model, _timed(epoch, choice.split, seconds, choice))
        assert changed is not None and changed.policy == "trial"
        choice = changed
        splits.append(choice.split)

    assert splits == [7, 8, 7, 8]
    assert choice.reason.startswith("trial over after epoch 2: Kept split 8")
    assert choice.plan is not None and choice.plan.split == 8
    assert choice.keeper is not None and choice.keeper.current.split == 8
    # Over: later epochs go through re-planning (no drift here, so nothing changes).
    assert replanned(choice, model, _timed(3, 8, 2.6, choice)) is None


def _storage_times(stats: EpochStats, factor: float) -> EpochStats:
    return dataclasses.replace(stats, storage_seconds=factor * stats.storage_seconds)


def test_a_first_epoch_that_makes_a_third_split_best_ends_the_trial() -> None:
    choice, model = _trial_choice()
    # The storage side took twice the plan's time: no pushdown is now clearly faster.
    slow = _storage_times(_timed(0, 7, 3.0, choice), 2.0)

    changed = replanned(choice, model, slow)

    assert changed is not None and changed.trial is None and changed.split == 7
    assert changed.reason.endswith("the trial is off and re-planning decides.")
    assert choice.keeper is not None and "1 of 2" in choice.keeper.why
    assert "split none predicted" in choice.keeper.why  # the proposal that pends


def test_a_drift_that_leaves_the_pick_best_does_not_stop_the_trial() -> None:
    choice, model = _trial_choice()
    # 50% slower storage is re-planned, but split 7 stays the best: the tie still matters.
    changed = replanned(choice, model, _storage_times(_timed(0, 7, 3.0, choice), 1.5))

    assert changed is not None and changed.trial is not None
    assert (changed.split, changed.policy) == (8, "trial")


def test_an_epoch_that_fell_back_to_raw_objects_ends_the_trial_without_an_error() -> None:
    choice, model = _trial_choice()
    # The gateway failed mid-epoch: the dataset read raw objects (no split) instead.
    fell_back = dataclasses.replace(_timed(0, 7, 3.0, choice), split=None, mode="local")

    changed = replanned(choice, model, fell_back)

    assert changed is not None and changed.trial is None and changed.split == 7
    assert changed.reason.endswith(
        "Epoch 0 ran split None, not the trial's 7, so the trial is off."
    )


# -- a near tie in a map-style dataset (no epochs of its own to time it in) --------------


def _tie_with(choice: SplitChoice, rival_split: int | None) -> SplitChoice:
    """``choice`` whose near tie's rival is ``rival_split`` (a tie as Trial.start would
    find one; which rival it is is what these tests vary)."""
    assert choice.plan is not None
    return dataclasses.replace(
        choice, trial=planner.Trial(choice.plan, choice.plan.candidate(rival_split))
    )


def test_a_map_style_dataset_takes_the_tie_that_sends_fewer_bytes() -> None:
    from hapi.sdk.planning._split import with_trial

    choice, _ = _trial_choice()
    assert choice.plan is not None
    smallest = min(choice.plan.candidates, key=lambda c: c.bytes_per_sample)
    assert smallest.bytes_per_sample < choice.plan.chosen.bytes_per_sample
    tie = _tie_with(choice, smallest.split)

    untimed = with_trial(tie, epochs=False)

    ours = planner.split_label(smallest.split)
    assert untimed.split == smallest.split and untimed.trial is None
    assert untimed.plan is not None and untimed.plan.split == smallest.split
    assert untimed.plan.note == ""
    assert untimed.keeper is not None and untimed.keeper.current.split == smallest.split
    assert f"cannot time, so it reads split {ours}, the fewer bytes" in untimed.reason
    # the iterable form times the same tie instead
    timed = with_trial(tie, epochs=True)
    assert timed.split == 7 and timed.trial is not None


@pytest.mark.parametrize("which", ["as-many-bytes", "more-bytes"])
def test_a_map_style_dataset_keeps_a_pick_whose_rival_sends_no_fewer_bytes(which) -> None:
    from hapi.sdk.planning._split import with_trial

    choice, _ = _trial_choice()
    assert choice.plan is not None
    largest = max(choice.plan.candidates, key=lambda c: c.bytes_per_sample)
    rival = 8 if which == "as-many-bytes" else largest.split
    assert choice.plan.candidate(rival).bytes_per_sample >= choice.plan.chosen.bytes_per_sample

    untimed = with_trial(_tie_with(choice, rival), epochs=False)

    assert untimed.split == 7 and untimed.trial is None and untimed.reason == choice.reason


# -- a resumed job continues at the split it was using -----------------------------------


def test_a_resumed_choice_takes_the_saved_split_and_its_row_of_the_plan() -> None:
    model, profile = synthetic.r18(raw_bytes=110_000.0)
    first = planner.plan(model, profile, 20e6)
    choice = SplitChoice(first.split, first.reason(), "planner", first, True)
    saved = next(c.split for c in first.candidates if c.split != first.split)
    resumed = resumed_at(choice, saved)
    assert (resumed.split, resumed.policy) == (saved, "resumed")
    assert resumed.plan is not None and resumed.plan.split == saved and resumed.trial is None
    assert resumed.plan.chosen.split == saved  # the saved split's row, for the next re-plan
    assert resumed.keeper is not None and resumed.keeper.current.split == saved
    assert f"split {planner.split_label(first.split)}" in resumed.reason  # what was planned
    assert resumed_at(choice, first.split) is choice  # the same split changes nothing


def test_a_resumed_trial_keeps_its_trial_at_the_pick_and_drops_it_elsewhere() -> None:
    choice, _ = _trial_choice()
    assert resumed_at(choice, choice.split).trial is choice.trial
    assert resumed_at(choice, None).trial is None
