"""The cost model and the choice, on synthetic profiles with known answers."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random

import pytest

from hapi.planner import (
    InvalidInput,
    Measurement,
    NoFeasibleSplit,
    Profile,
    drift,
    needs_replan,
    plan,
    profile_from_manifest,
    replan,
)
from tests.planner.synthetic import INPUT_BYTES, R18_OUTPUTS, manifest, r18

MBIT = 1e6
GBIT = 1e9


def _tiny() -> tuple[object, Profile]:
    model = manifest(outputs=(1000,), cpu_ms=(2.0,), weights=(0,))
    profile = Profile(
        storage_ms=(2.0,),
        client_ms=(4.0,),
        output_bytes=(1000,),
        peak_activation_bytes=(1000,),
        weight_bytes=(0,),
        input_bytes=2000,
        raw_bytes=500,
        storage_decode_ms=1.0,
        client_decode_ms=3.0,
        head_ms=1.0,
    )
    return model, profile


def test_epoch_time_is_fill_plus_bottleneck_per_batch_plus_drain() -> None:
    model, profile = _tiny()
    # 8 Mbit/s = 1000 bytes per ms; 10 batches of 10 samples.
    chosen = plan(model, profile, 8 * MBIT, batch_size=10, dataset_size=100)
    raw, zero, one = chosen.candidates
    assert (raw.split, zero.split, one.split) == (None, 0, 1)
    assert (raw.storage_ms, raw.transfer_ms, raw.client_ms) == pytest.approx((0, 5, 80))
    assert (zero.storage_ms, zero.transfer_ms, zero.client_ms) == pytest.approx((10, 20, 50))
    assert (one.storage_ms, one.transfer_ms, one.client_ms) == pytest.approx((30, 10, 10))
    assert [c.bottleneck for c in chosen.candidates] == ["client", "client", "storage"]
    assert raw.epoch_s == pytest.approx((5 + 80 + 9 * 80) / 1000)
    assert zero.epoch_s == pytest.approx((10 + 20 + 50 + 9 * 50) / 1000)
    assert one.epoch_s == pytest.approx((30 + 10 + 10 + 9 * 30) / 1000)
    assert chosen.split == 1 and chosen.batches == 10


def test_raw_objects_pay_a_request_per_object_pushdown_one_per_batch() -> None:
    # A GET costs the client CPU (signing, sending, parsing) whatever the object's size:
    # without pushdown every object is one; a pushdown request carries the whole batch.
    model, profile = _tiny()
    requests = dataclasses.replace(profile, client_request_ms=2.0)
    chosen = plan(model, requests, 8 * MBIT, batch_size=10, dataset_size=100)
    assert chosen.candidate(None).client_ms == pytest.approx(80 + 10 * 2.0)
    assert chosen.candidate(0).client_ms == pytest.approx(50 + 2.0)
    assert chosen.candidate(1).client_ms == pytest.approx(10 + 2.0)


def test_storage_load_slows_the_storage_stage() -> None:
    model, profile = _tiny()
    loaded = dataclasses.replace(profile, storage_load=3.0)
    chosen = plan(model, loaded, 8 * MBIT, batch_size=10, dataset_size=100)
    assert chosen.candidate(1).storage_ms == pytest.approx(90)
    assert chosen.candidate(None).storage_ms == 0


def test_very_low_bandwidth_picks_the_split_with_the_smallest_output() -> None:
    model, profile = r18()
    chosen = plan(model, profile, 0.1 * MBIT)
    assert chosen.split == 10  # pooled features, 2 KB per sample
    assert chosen.chosen.bottleneck == "transfer"


def test_very_low_bandwidth_picks_the_latest_feasible_small_output() -> None:
    # 16 MB of storage memory holds the weights of blocks [0, 8) but not [0, 9).
    model, profile = r18(storage_memory_bytes=16_000_000)
    chosen = plan(model, profile, 10 * MBIT)
    assert [c.split for c in chosen.candidates if not c.feasible] == [9, 10]
    assert chosen.split == 8
    assert chosen.chosen.bytes_per_sample == R18_OUTPUTS[7]
    assert chosen.chosen.bytes_per_sample == min(
        c.bytes_per_sample for c in chosen.candidates if c.feasible
    )


def test_very_high_bandwidth_and_a_weak_storage_side_mean_no_pushdown() -> None:
    model, profile = r18(storage_load=20.0)
    chosen = plan(model, profile, 100 * GBIT)
    assert chosen.split is None
    assert chosen.reason().startswith("No pushdown is fastest")


def test_client_cpu_bound_decoding_is_offloaded() -> None:
    model = manifest()
    profile = profile_from_manifest(
        model,
        storage_ms=[b.cpu_ms / 10 for b in model.blocks],  # a GPU next to the data
        client_decode_ms=40.0,
        storage_decode_ms=5.0,
    )
    chosen = plan(model, profile, math.inf)  # no network limit at all
    assert chosen.split is not None and chosen.split >= 0
    assert chosen.candidate(None).bottleneck == "client"
    assert "bound by the client" in chosen.reason()


def test_the_network_limit_alone_never_favours_raw_objects_when_decoding_dominates() -> None:
    model = manifest()
    profile = profile_from_manifest(model, client_decode_ms=40.0, storage_decode_ms=5.0)
    for bandwidth in (1 * GBIT, 10 * GBIT, math.inf):
        assert plan(model, profile, bandwidth).split is not None


def _random_profile(rng: random.Random) -> tuple[object, Profile]:
    blocks = rng.randint(1, 12)
    outputs = [rng.randint(1_000, 2_000_000) for _ in range(blocks)]
    weights = [rng.randint(0, 10_000_000) for _ in range(blocks)]
    model = manifest(outputs, [rng.uniform(0.1, 10) for _ in range(blocks)], weights)
    profile = profile_from_manifest(
        model,
        storage_ms=[rng.uniform(0.01, 20) for _ in range(blocks)],
        raw_bytes=rng.uniform(10_000, 500_000),
        storage_decode_ms=rng.uniform(0, 20),
        client_decode_ms=rng.uniform(0, 20),
        head_ms=rng.uniform(0, 5),
        storage_memory_bytes=rng.choice([None, rng.randint(1_000_000, 30_000_000)]),
        client_memory_bytes=rng.choice([None, rng.randint(50_000_000, 500_000_000)]),
        storage_load=rng.uniform(1, 4),
    )
    return model, profile


def test_features_only_chooses_the_best_split_where_raw_objects_would_win() -> None:
    model, profile = r18(storage_load=20.0)
    free = plan(model, profile, 100 * GBIT)
    asked = plan(model, profile, 100 * GBIT, features_only=True)
    assert free.split is None and asked.split is not None
    splits = [c for c in free.candidates if c.split is not None]
    assert asked.chosen.epoch_s == min(c.epoch_s for c in splits)
    assert asked.candidate(None).epoch_s == free.candidate(None).epoch_s  # still priced


def test_features_only_with_no_split_that_fits_says_so() -> None:
    model, profile = r18(storage_memory_bytes=1_000)
    assert plan(model, profile, 100 * MBIT).split is None  # raw objects fit the client
    with pytest.raises(NoFeasibleSplit, match=r"fits the memory budgets$"):
        plan(model, profile, 100 * MBIT, features_only=True)


def test_infeasible_candidates_are_never_chosen() -> None:
    rng = random.Random(5)
    seen_infeasible = 0
    for _ in range(300):
        model, profile = _random_profile(rng)
        bandwidth = 10 ** rng.uniform(6, 11)
        try:
            batch = rng.choice([8, 32, 256])
            chosen = plan(model, profile, bandwidth, batch_size=batch, byte_margin=0.0)
        except NoFeasibleSplit as exc:
            assert not any(c.feasible for c in exc.candidates)
            continue
        feasible = [c for c in chosen.candidates if c.feasible]
        seen_infeasible += len(chosen.candidates) - len(feasible)
        assert chosen.chosen.feasible
        assert chosen.chosen.epoch_s == min(c.epoch_s for c in feasible)
        assert all(math.isinf(c.epoch_s) for c in chosen.candidates if not c.feasible)
    assert seen_infeasible > 100  # the budgets really did exclude candidates


def test_infeasible_rows_say_which_side_does_not_fit() -> None:
    model, profile = r18(storage_memory_bytes=16_000_000, client_memory_bytes=40_000_000)
    chosen = plan(model, profile, 100 * MBIT, batch_size=32)
    last = chosen.candidate(10)
    assert not last.feasible and last.infeasible is not None
    assert last.infeasible.startswith("storage needs")
    raw = chosen.candidate(None)  # 32 samples of 1.4 MB activations + all weights
    assert raw.infeasible is not None and "client needs" in raw.infeasible
    assert "infeasible: storage needs" in chosen.explain()


def test_nothing_fits() -> None:
    model, profile = r18(storage_memory_bytes=1_000, client_memory_bytes=1_000)
    with pytest.raises(NoFeasibleSplit) as caught:
        plan(model, profile, 100 * MBIT)
    assert len(caught.value.candidates) == 12


def test_predicted_time_never_rises_with_bandwidth() -> None:
    rng = random.Random(7)
    bandwidths = [10 ** (5 + i / 4) for i in range(25)] + [math.inf]
    for _ in range(100):
        model, profile = _random_profile(rng)
        profile = dataclasses.replace(profile, storage_memory_bytes=None, client_memory_bytes=None)
        plans = [plan(model, profile, b) for b in bandwidths]
        chosen = [p.chosen.epoch_s for p in plans]
        assert all(a >= b for a, b in itertools.pairwise(chosen)), chosen
        for index in range(len(plans[0].candidates)):
            times = [p.candidates[index].epoch_s for p in plans]
            assert all(a >= b for a, b in itertools.pairwise(times))


def test_explain_lists_every_candidate_and_marks_the_choice() -> None:
    model, profile = r18()
    chosen = plan(model, profile, 100 * MBIT, batch_size=16, dataset_size=1000)
    text = chosen.explain()
    lines = text.splitlines()
    assert lines[0].startswith("synthetic@1 at 100 Mbit/s, batch 16, 1,000 samples")
    rows = [line for line in lines if line[2:].split(" ")[0] in {"none", *map(str, range(11))}]
    assert len(rows) == 12
    marked = [line for line in rows if line.startswith("*")]
    assert len(marked) == 1 and marked[0][2:].startswith(f"{chosen.split} ")
    verdict = next(line for line in lines if line.startswith("chosen:"))
    assert verdict.startswith(f"chosen: split {chosen.split}. Split {chosen.split} is fastest")
    assert lines[-1].startswith("in float16: split ")


def test_to_dict_is_strict_json() -> None:
    model, profile = r18(storage_memory_bytes=16_000_000)
    data = json.loads(json.dumps(plan(model, profile, math.inf).to_dict(), allow_nan=False))
    assert data["bandwidth_bps"] is None  # unlimited
    assert data["candidates"][-1] == data["candidates"][-1] | {"feasible": False, "epoch_s": None}
    assert data["split"] in [c["split"] for c in data["candidates"] if c["feasible"]]
    assert data["profile"]["input_bytes"] == INPUT_BYTES


def test_split_zero_sends_the_preprocessed_input() -> None:
    model, profile = r18()
    chosen = plan(model, profile, 1 * GBIT)
    assert chosen.candidate(0).bytes_per_sample == INPUT_BYTES
    assert chosen.candidate(None).bytes_per_sample == profile.raw_bytes
    half = profile_from_manifest(model, wire_dtype="float16")
    assert half.input_bytes == INPUT_BYTES // 2 and half.output_bytes[-1] == 1024


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"storage_ms": (1.0,)}, "one entry per block"),
        ({"raw_bytes": -1}, ">= 0"),
        ({"client_request_ms": -1.0}, ">= 0"),
        ({"storage_load": 0.0}, "storage_load"),
        ({"client_memory_bytes": 0}, "memory budgets"),
        ({"readers_in_turn": 0}, "readers_in_turn"),
    ],
)
def test_profile_validation(change: dict[str, object], message: str) -> None:
    _, profile = r18()
    with pytest.raises(InvalidInput, match=message):
        dataclasses.replace(profile, **change)


def test_plan_rejects_a_profile_of_other_blocks_and_bad_sizes() -> None:
    model, profile = r18()
    with pytest.raises(InvalidInput, match="covers 10 blocks"):
        plan(manifest(freeze=6), profile, GBIT)
    with pytest.raises(InvalidInput, match="at least 1"):
        plan(model, profile, GBIT, batch_size=0)
    with pytest.raises(InvalidInput, match="positive"):
        plan(model, profile, 0)


# -- drift and re-planning ---------------------------------------------------------------


def _pushdown_plan():
    model, profile = r18()
    chosen = plan(model, profile, 100 * MBIT, batch_size=32)
    assert chosen.split is not None and chosen.chosen.storage_ms > 0
    return model, chosen


@pytest.mark.parametrize(
    ("factor", "expected"), [(1.0, False), (1.24, False), (0.76, False), (1.26, True), (0.74, True)]
)
def test_needs_replan_on_bandwidth_drift_beyond_25_percent(factor: float, expected: bool) -> None:
    _, chosen = _pushdown_plan()
    measured = Measurement(bandwidth_bps=chosen.bandwidth_bps * factor)
    assert needs_replan(chosen, measured) is expected


@pytest.mark.parametrize(
    ("factor", "expected"), [(1.24, False), (0.76, False), (1.26, True), (0.74, True)]
)
def test_needs_replan_on_storage_throughput_drift(factor: float, expected: bool) -> None:
    _, chosen = _pushdown_plan()
    assumed = chosen.chosen.storage_ms / chosen.batch_size
    measured = Measurement(
        bandwidth_bps=chosen.bandwidth_bps, storage_ms_per_sample=assumed * factor
    )
    assert needs_replan(chosen, measured) is expected
    assert drift(chosen, measured)["storage"] == pytest.approx(factor - 1)


def test_client_drift_is_reported_but_does_not_trigger_a_replan() -> None:
    _, chosen = _pushdown_plan()
    measured = Measurement(client_ms_per_sample=10 * chosen.chosen.client_ms / chosen.batch_size)
    assert drift(chosen, measured)["client"] == pytest.approx(9)
    assert not needs_replan(chosen, measured)
    assert not needs_replan(chosen, Measurement())


def test_no_pushdown_plans_ignore_storage_measurements() -> None:
    model, profile = r18(storage_load=20.0)
    chosen = plan(model, profile, 100 * GBIT)
    assert chosen.split is None
    assert not needs_replan(chosen, Measurement(storage_ms_per_sample=1000.0))


def test_replan_follows_a_collapsed_bandwidth_and_a_slower_storage_side() -> None:
    model, chosen = _pushdown_plan()
    slower = replan(model, chosen, Measurement(bandwidth_bps=1 * MBIT))
    assert slower.bandwidth_bps == 1 * MBIT and slower.split == 10
    loaded = Measurement(storage_ms_per_sample=3 * chosen.chosen.storage_ms / chosen.batch_size)
    again = replan(model, chosen, loaded)
    assert again.profile.storage_load == pytest.approx(3.0)
    assert again.bandwidth_bps == chosen.bandwidth_bps


def test_zeros_price_a_split_at_the_bytes_the_encoding_sends() -> None:
    # 1000 float32 bytes a sample after the block: half of them zero leaves half the
    # words and a bit a word (1/32 of the bytes): 531.25 B; 2% zero would not pay for
    # the mask (0.98 + 1/32 > 0.95): the frame goes dense, 1000 B.
    model, profile = _tiny()
    half = dataclasses.replace(profile, zeros=(0.5,))
    assert half.sent_at(1) == pytest.approx(531.25)
    assert half.sent_at(0) == profile.input_bytes and half.sent_at(None) == profile.raw_bytes
    assert half.bytes_at(1) == 1000  # memory still holds the dense features
    assert half.activation_bytes(0, 1) == profile.activation_bytes(0, 1)
    assert dataclasses.replace(profile, zeros=(0.02,)).sent_at(1) == 1000
    # In float16 the mask is a bit per 2 bytes: 500 * (0.5 + 1/16) = 281.25 B.
    assert half.in_dtype("float16").sent_at(1) == pytest.approx(281.25)
    # 8 Mbit/s is 1000 bytes a ms: 10 samples' transfer at split 1 is 5.3125 ms, not 10.
    chosen = plan(model, half, 8 * MBIT, batch_size=10, dataset_size=100)
    assert chosen.candidate(1).transfer_ms == pytest.approx(5.3125)
    assert chosen.candidate(1).bytes_per_sample == pytest.approx(531.25)


def test_zeros_make_a_split_worth_its_bytes_on_a_slow_link() -> None:
    # Raw objects of 700 B against a split of 1000 B dense: on a slow link the raw
    # objects win; with half of the split's values zero it sends 531 B and wins.
    model, profile = _tiny()
    slow = dataclasses.replace(profile, raw_bytes=700, client_ms=(0.1,), client_decode_ms=0.1)
    assert plan(model, slow, 0.08 * MBIT, batch_size=10, dataset_size=100).split is None
    zeros = dataclasses.replace(slow, zeros=(0.5,))
    assert plan(model, zeros, 0.08 * MBIT, batch_size=10, dataset_size=100).split == 1


@pytest.mark.parametrize("zeros", [(0.5, 0.5), (1.5,), (-0.1,)])
def test_zeros_are_one_share_per_block(zeros: tuple[float, ...]) -> None:
    _, profile = _tiny()
    with pytest.raises(InvalidInput, match="zeros must be one share in"):
        dataclasses.replace(profile, zeros=zeros)
