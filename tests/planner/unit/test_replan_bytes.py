"""A move to a split that sends many times the raw objects' bytes must be predicted that
many times the minimum gain faster than the best split that does not; else the keeper
takes that one instead (``SplitKeeper._lean``). A first plan keeps the byte rule's own
margin: recorded sweeps show such splits winning where they were planned from the start.
"""

from __future__ import annotations

import dataclasses

import pytest

from hapi import planner
from tests.planner import synthetic


def _fast_link() -> tuple[planner.Plan, planner.Plan]:
    """A job at the pooled output (2 KB a sample) and a proposal at a fast link that
    picks an early split sending several times the raw objects' 110 KB."""
    model, profile = synthetic.r18(raw_bytes=110_000.0)
    first = planner.plan(model, profile, 20e6, dataset_size=2_000)
    proposed = planner.plan(model, profile, 10e9, dataset_size=2_000)
    assert first.split == model.freeze
    assert proposed.chosen.bytes_per_sample > 1.5 * profile.raw_bytes, proposed.reason()
    return first, proposed


def _lean_best(plan: planner.Plan) -> planner.Candidate:
    lean = [c for c in plan.candidates if c.bytes_per_sample <= plan.profile.raw_bytes]
    return min(lean, key=lambda c: c.epoch_s)


def _scaled(proposed: planner.Plan, gain: float) -> planner.Plan:
    """``proposed`` with its pick predicted ``gain`` faster than the best lean candidate."""
    best = _lean_best(proposed)
    target = best.epoch_s / (1.0 + gain)
    rows = tuple(
        dataclasses.replace(c, epoch_s=target) if c.split == proposed.split else c
        for c in proposed.candidates
    )
    return dataclasses.replace(proposed, candidates=rows)


@pytest.mark.parametrize("share", [0.5, 0.99, 1.01, 2.0])
def test_a_heavy_split_must_buy_the_minimum_gain_for_each_time_the_raw_bytes(share) -> None:
    first, proposed = _fast_link()
    keeper = planner.SplitKeeper(first, window=1)
    ratio = proposed.chosen.bytes_per_sample / proposed.profile.raw_bytes
    kept = keeper.update(_scaled(proposed, share * keeper.min_gain * ratio))
    if share > 1:
        assert kept.split == proposed.split
        return
    assert kept.split != proposed.split
    assert f"sends {ratio:.0f}x the raw objects' bytes" in keeper.why, keeper.why


def test_the_lean_candidate_goes_through_the_usual_rules() -> None:
    # Redirected to the best candidate sending no more than the raw objects, which is
    # then judged as any proposal: here split 8, under 10% faster than the pooled split in
    # force, so the job stays; with the pooled split slower, it moves after the window.
    first, proposed = _fast_link()
    moving = _scaled(proposed, 0.2)  # far below the heavy split's bar
    lean = _lean_best(moving)
    keeper = planner.SplitKeeper(first)
    assert [keeper.update(moving).split for _ in range(2)] == [first.split] * 2
    assert "only" in keeper.why and "raw objects' bytes" in keeper.why
    slow = tuple(
        dataclasses.replace(c, epoch_s=2 * lean.epoch_s) if c.split == first.split else c
        for c in moving.candidates
    )
    slower = dataclasses.replace(moving, candidates=slow)
    keeper = planner.SplitKeeper(first)
    assert [keeper.update(slower).split for _ in range(2)] == [first.split, lean.split]
