"""Readers in turn: a map-style dataset's DataLoader workers each wait for a batch before
computing on it, so no more batches than readers are in the pipeline at once."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from hapi.planner import NoFeasibleSplit, Plan, Profile, plan
from tests.planner.synthetic import manifest
from tests.planner.unit.test_cost import _random_profile

MBIT = 1e6


def _balanced() -> tuple[object, Profile]:
    """One block; at 8 Mbit/s (1000 bytes a ms) and batches of 10, per batch:
    raw objects: storage 0, transfer 5, client (1 + 2 + 4) * 10 = 70;
    split 0: storage 10, transfer 40, client (2 + 4) * 10 = 60;
    split 1: storage (1 + 4) * 10 = 50, transfer 40, client 4 * 10 = 40."""
    model = manifest(outputs=(4000,), cpu_ms=(4.0,), weights=(0,))
    profile = Profile(
        storage_ms=(4.0,),
        client_ms=(2.0,),
        output_bytes=(4000,),
        peak_activation_bytes=(4000,),
        weight_bytes=(0,),
        input_bytes=4000,
        raw_bytes=500,
        storage_decode_ms=1.0,
        client_decode_ms=1.0,
        head_ms=4.0,
    )
    return model, profile


_MODEL, _BALANCED = _balanced()


def _plan(profile: Profile, *, features_only: bool = False, **changes: object) -> Plan:
    """``profile`` with ``changes``, planned at 8 Mbit/s in 10 batches of 10."""
    changed = dataclasses.replace(profile, **changes)
    return plan(
        _MODEL, changed, 8 * MBIT, batch_size=10, dataset_size=100, features_only=features_only
    )


def test_overlapped_stages_take_the_slowest_stage_a_batch() -> None:
    chosen = _plan(_BALANCED)
    raw, zero, one = chosen.candidates
    assert raw.epoch_s == pytest.approx((75 + 9 * 70) / 1000)
    assert zero.epoch_s == pytest.approx((110 + 9 * 60) / 1000)
    assert one.epoch_s == pytest.approx((130 + 9 * 50) / 1000)
    assert chosen.split == 1  # 0.58 s against raw objects' 0.705 s: 22% faster


def test_two_readers_in_turn_bound_a_balanced_split_by_its_stages_sum() -> None:
    chosen = _plan(_BALANCED, readers_in_turn=2)
    raw, zero, one = chosen.candidates
    # raw: (0 + 5 + 70) / 2 = 37.5 < 70, unchanged; split 0: 110 / 2 = 55 < 60, unchanged;
    # split 1: 130 / 2 = 65 > 50: the turns bind.
    assert raw.epoch_s == pytest.approx((75 + 9 * 70) / 1000)
    assert zero.epoch_s == pytest.approx((110 + 9 * 60) / 1000)
    assert one.epoch_s == pytest.approx((130 + 9 * 65) / 1000)
    assert (raw.bottleneck, zero.bottleneck, one.bottleneck) == ("client", "client", "turns")
    assert one.cycle_ms == pytest.approx(65) and one.bottleneck_ms == pytest.approx(65)
    # The fastest is split 0 (0.65 s), 8.5% faster than raw objects while sending 8x their
    # bytes: the byte guard keeps raw objects.
    assert chosen.split is None
    assert "8% faster" in chosen.reason()
    row = next(line for line in chosen.explain().splitlines() if line[2:].startswith("1 "))
    assert "turns" in row


def test_a_pick_bound_by_the_turns_says_so() -> None:
    only = _plan(_BALANCED, readers_in_turn=2, features_only=True)  # split 0 at 0.65 s
    assert only.split == 0
    chosen = _plan(_BALANCED, readers_in_turn=2, client_ms=(9.0,))
    # raw: client (1 + 9 + 4) * 10 = 140; split 0: client 130, storage 10, transfer 40:
    # 180 / 2 = 90 < 130; split 1: 130 / 2 = 65, chosen and bound by the turns.
    assert chosen.split == 1 and chosen.chosen.bottleneck == "turns"
    assert "readers' turns (each waits for its batch, then computes on it) at 65.0 ms" in (
        chosen.reason()
    )


def test_enough_readers_change_nothing_and_one_reader_is_fully_serial() -> None:
    free = _plan(_BALANCED)
    many = _plan(_BALANCED, readers_in_turn=3)
    assert [c.epoch_s for c in many.candidates] == pytest.approx(
        [c.epoch_s for c in free.candidates]
    )
    assert many.split == 1  # 130 / 3 = 43.3 < 50
    one = _plan(_BALANCED, readers_in_turn=1)
    for candidate in one.candidates:  # every batch's three stages one after another
        whole = candidate.storage_ms + candidate.transfer_ms + candidate.client_ms
        assert candidate.epoch_s == pytest.approx(10 * whole / 1000)


def test_fewer_readers_never_make_a_candidate_faster() -> None:
    rng = random.Random(11)
    for _ in range(200):
        model, profile = _random_profile(rng)
        profile = dataclasses.replace(profile, storage_memory_bytes=None, client_memory_bytes=None)
        bandwidth = rng.choice([1e6, 1e7, 1e8, 1e9, math.inf])
        batch = rng.randint(1, 64)
        previous = None
        for readers in (None, 64, 8, 4, 2, 1):
            chosen = plan(
                model,
                dataclasses.replace(profile, readers_in_turn=readers),
                bandwidth,
                batch_size=batch,
                dataset_size=1000,
            )
            times = [c.epoch_s for c in chosen.candidates]
            if previous is not None:
                assert all(b >= a - 1e-9 for a, b in zip(previous, times, strict=True))
            previous = times


def test_a_loaded_storage_side_asks_more_bytes_to_buy_more() -> None:
    # Split 1 sends 8x the raw objects' bytes and is 22% faster than them (0.58 s against
    # 0.705 s): enough on a storage side of its own (more than 10%), not on one shared
    # with other work, where 8x the bytes must buy more than 80%.
    quiet = _plan(_BALANCED)
    assert quiet.split == 1 and not quiet.note
    # storage_load 1.01 keeps the storage stages within a rounding (50.5 ms a batch).
    loaded = _plan(_BALANCED, storage_load=1.01)
    assert loaded.split is None
    assert "shared with other work (priced x1.01)" in loaded.note
    assert "more than 80%" in loaded.note
    # A gain above r times the margin still pays: raw objects decoded at 20 ms a sample
    # here take 260 ms a batch (2.6 s an epoch), 4.5x split 1's 0.58 s.
    paid = _plan(_BALANCED, storage_load=1.01, client_decode_ms=20.0)
    assert paid.split == 1 and not paid.note


def test_from_a_loaded_storage_side_a_pick_sending_more_bytes_than_raw_buys_its_multiple() -> None:
    # Generated profiles, storage_load 1-4 (_random_profile): whatever the planner picks
    # either sends no more than the raw objects or is faster than the best candidate that
    # does by more than its multiple of raw bytes times the margin; and where the rule
    # fell back to raw bytes or fewer, the note says what the bytes would have had to buy.
    rng = random.Random(23)
    overruled = paid = 0
    for _ in range(300):
        model, profile = _random_profile(rng)
        assert profile.storage_load > 1.0
        bandwidth = rng.choice([1e7, 1e8, 1e9, 1e10, math.inf])
        try:
            chosen = plan(model, profile, bandwidth, batch_size=rng.randint(1, 64))
        except NoFeasibleSplit:
            continue
        feasible = [c for c in chosen.candidates if c.feasible]
        lean = [c for c in feasible if c.bytes_per_sample <= profile.raw_bytes]
        pick, fastest = chosen.chosen, min(feasible, key=lambda c: c.epoch_s)
        if pick.bytes_per_sample > profile.raw_bytes and lean:
            best_lean = min(lean, key=lambda c: c.epoch_s)
            multiple = pick.bytes_per_sample / profile.raw_bytes
            assert best_lean.epoch_s / pick.epoch_s - 1 > chosen.byte_margin * multiple
            paid += 1
        if fastest.bytes_per_sample > profile.raw_bytes and pick.bytes_per_sample <= (
            profile.raw_bytes
        ):  # the rule fell back to the fewer bytes: the note says why
            assert "for each multiple" in chosen.note, chosen.note
            overruled += 1
    assert overruled and paid  # the search reached both sides of the rule
