"""The SDK's re-planning goes through hysteresis: one epoch's drift does not flip the split."""

from __future__ import annotations

from hapi import planner
from hapi.sdk._split import SplitChoice, replanned
from hapi.sdk._stats import EpochStats
from tests.planner import synthetic


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
