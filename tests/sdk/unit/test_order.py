"""Where an epoch's samples go (hapi.sdk.datasets._order, _position, _epoch): the same order for any
number of ranks and workers, equal shares per rank, the shuffle buffer, and resuming a pass
in the same layout or dealt afresh to another, each sample exactly once."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from hapi.sdk import StateMismatch
from hapi.sdk.datasets._epoch import plan_pass
from hapi.sdk.datasets._order import Layout, Pass, emission_order, epoch_order
from hapi.sdk.datasets._position import (
    SPLIT_IN_USE,
    Identity,
    Position,
    combine,
    find_states,
    split_in_use,
)

IDENTITY = Identity("s3://b/p/", "abc", 23, "r18@1", 6, "auto", True, 7)


def _layout(ranks: int, workers: int, batch_size: int | None = None, **more) -> Layout:
    return Layout(ranks, workers, batch_size, more.get("drop_last", False), more.get("buffer", 0))


def _plans(counts, layout, *, done=(), starts=None, epoch=0, seed=7):
    """Every consumer's plan of the pass after ``done`` in ``layout``."""
    order = epoch_order(counts, shuffle=True, seed=seed, epoch=epoch)
    position = Position(IDENTITY, epoch, tuple(done), layout)
    return {
        (rank, worker): plan_pass(
            position=position,
            start=0 if starts is None else starts[worker],
            rank=rank,
            worker=worker,
            seed=seed,
            epoch_order=order,
        )
        for rank in range(layout.ranks)
        for worker in range(layout.workers)
    }


def _delivered(plan, upto=None) -> list[tuple[int, bool]]:
    stop = len(plan.emission) if upto is None else upto
    return [(int(plan.ids[p]), bool(plan.padded[p])) for p in plan.emission[plan.start : stop]]


def _real(pairs) -> Counter[int]:
    return Counter(sample for sample, padded in pairs if not padded)


def test_the_epoch_order_depends_on_seed_and_epoch_only():
    counts = [3, 1, 4, 1, 5]
    first = epoch_order(counts, shuffle=True, seed=1, epoch=0)
    assert sorted(first.tolist()) == list(range(14))
    assert first.tolist() == epoch_order(counts, shuffle=True, seed=1, epoch=0).tolist()
    assert first.tolist() != epoch_order(counts, shuffle=True, seed=1, epoch=1).tolist()
    assert first.tolist() != epoch_order(counts, shuffle=True, seed=2, epoch=0).tolist()
    assert epoch_order(counts, shuffle=False, seed=1, epoch=3).tolist() == list(range(14))
    # a shard's samples stay together, in member order, before the buffer
    runs = [list(g) for _, g in itertools.groupby(first.tolist(), lambda s: s in (4, 5, 6, 7))]
    assert [4, 5, 6, 7] in runs


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_and_equal_shares_whatever_the_layout(ranks, workers, drop_last):
    counts = [5, 3] if ranks * workers > 2 else [1] * 10  # fewer shards than consumers
    layout = _layout(ranks, workers, drop_last=drop_last)
    plans = _plans(counts, layout)
    per_rank = Counter()
    delivered: list[tuple[int, bool]] = []
    for (rank, _), plan in plans.items():
        per_rank[rank] += len(plan.emission)
        delivered += _delivered(plan)
    total = sum(counts)
    seen = _real(delivered)
    assert len(set(per_rank.values())) == 1  # every rank as many samples
    if drop_last:
        assert per_rank[0] == total // ranks and max(seen.values()) == 1
        assert total - sum(seen.values()) < ranks
    else:
        assert seen == Counter(range(total))
        assert per_rank[0] == -(-total // ranks)
        assert sum(padded for _, padded in delivered) == per_rank[0] * ranks - total


def test_the_global_order_is_the_same_for_any_number_of_consumers():
    counts = [1] * 17
    for ranks, workers in [(1, 1), (2, 2), (3, 1), (1, 4)]:
        plans = _plans(counts, _layout(ranks, workers))
        spans = [plans[key].ids[~plans[key].padded].tolist() for key in sorted(plans)]
        assert (
            list(itertools.chain(*spans))
            == epoch_order(counts, shuffle=True, seed=7, epoch=0).tolist()
        )


@pytest.mark.parametrize(("total", "batch"), [(10, 4), (13, 2), (7, 8), (24, 5)])
def test_with_the_batch_size_a_rank_yields_one_partial_batch_at_most(total, batch):
    for ranks, workers in [(2, 2), (3, 2), (1, 3)]:
        plans = _plans([1] * total, _layout(ranks, workers, batch))
        for rank in range(ranks):
            sizes = [len(plans[rank, w].emission) for w in range(workers)]
            batches = [-(-size // batch) for size in sizes]  # what a DataLoader makes of it
            per_rank = sum(sizes)
            assert sum(batches) == -(-per_rank // batch)
            assert sum(size % batch != 0 for size in sizes) <= 1


def test_the_shuffle_buffer_is_seeded_bounded_and_a_permutation():
    order = emission_order(200, 16, "7:0:0:0:0")
    assert sorted(order.tolist()) == list(range(200))
    assert order.tolist() == emission_order(200, 16, "7:0:0:0:0").tolist()
    assert order.tolist() != emission_order(200, 16, "7:1:0:0:0").tolist()
    assert order.tolist() != list(range(200))
    # the j-th delivery arrived at most 15 arrivals after it: 16 samples held at most
    assert all(position <= j + 15 for j, position in enumerate(order.tolist()))
    assert emission_order(50, 0, "x").tolist() == list(range(50))


@pytest.mark.parametrize("seed", range(12))
def test_a_stopped_pass_dealt_afresh_to_other_layouts_delivers_each_sample_once(seed):
    rng = random.Random(seed)
    counts = [rng.randint(1, 9) for _ in range(rng.randint(1, 9))]
    total = sum(counts)
    done: list[Pass] = []
    delivered: list[tuple[int, bool]] = []
    for _ in range(rng.randint(1, 3)):  # a job preempted again and again
        layout = _layout(
            rng.randint(1, 4),
            rng.randint(1, 3),
            rng.choice([None, 2, 3]),
            buffer=rng.choice([0, 4]),
        )
        plans = _plans(counts, layout, done=done)
        # the ranks step together: worker w of every rank delivered as many
        sizes = [len(plans[0, w].emission) for w in range(layout.workers)]
        emitted = [rng.randint(0, size) for size in sizes]
        for (_, worker), plan in plans.items():
            delivered += _delivered(plan, emitted[worker])
        done.append(Pass(layout, tuple(emitted)))
    final = _plans(counts, _layout(rng.randint(1, 4), rng.randint(1, 3)), done=done)
    for plan in final.values():
        delivered += _delivered(plan)
    assert _real(delivered) == Counter(range(total))


def test_the_same_layout_continues_each_worker_where_it_stopped():
    counts, layout = [4, 6, 2], _layout(2, 2, buffer=3)
    whole = _plans(counts, layout)
    stopped = _plans(counts, layout, starts=[2, 3])
    for key, plan in stopped.items():
        assert plan.emission.tolist() == whole[key].emission.tolist()
        assert _delivered(plan) == _delivered(whole[key])[plan.start :]


def test_requests_fetch_what_is_left_in_span_order_each_object_once_per_request():
    counts = [3, 2, 4]
    plan = _plans(counts, _layout(1, 1, buffer=3), starts=[4])[0, 0]
    keys = ["a.tar", "b.tar", "c.tar"]
    requests = plan.requests(keys, counts, 2)
    positions = [p for r in requests for want in r.wants for p in want.positions]
    assert sorted(positions) == sorted(plan.emission[4:].tolist())  # left to deliver, once
    assert positions == sorted(positions)
    for request in requests:
        assert len(request.keys) == len(set(request.keys)) <= 2


def _state(position: Position, worker: int, emitted: int) -> dict:
    return Position(
        position.identity, position.epoch, position.done, position.layout, {worker: emitted}
    ).state(worker)


def test_states_are_small_and_a_rank_s_workers_combine_into_one_position():
    done = (Pass(_layout(3, 2, 4), (8, 4)),)
    position = Position(IDENTITY, 2, done, _layout(2, 2, 4))
    loader = {  # the shape of a StatefulDataLoader's state_dict()
        "_snapshot": {
            "_worker_snapshots": {
                f"worker_{w}": {"dataset_state": _state(position, w, n), "fetcher_state": None}
                for w, n in ((0, 12), (1, 8))
            }
        }
    }
    assert len(repr(loader)) < 2000
    assert len(find_states(loader)) == 2
    combined = combine(find_states(loader), IDENTITY)
    assert combined.complete and combined.emitted == {0: 12, 1: 8}
    assert combined.done == done and combined.epoch == 2
    assert combined.finished() == Pass(_layout(2, 2, 4), (12, 8))
    one = combine([_state(position, 1, 8)], IDENTITY)
    assert not one.complete


def test_a_state_of_another_dataset_is_refused_saying_what_differs():
    state = _state(Position(IDENTITY, 0, (), _layout(1, 1)), 0, 3)
    other = Identity("s3://b/p/", "abc", 23, "r18@2", 6, 4, True, 8)
    with pytest.raises(StateMismatch) as refused:
        combine([state], other)
    message = str(refused.value)
    assert "model 'r18@1' (now 'r18@2')" in message
    assert "split 'auto' (now 4)" in message and "seed 7 (now 8)" in message
    assert "objects" not in message.split(":")[1]
    relisted = Identity("s3://b/p/", "def", 25, "r18@1", 6, "auto", True, 7)
    with pytest.raises(
        StateMismatch, match=r"objects of s3://b/p/ changed .*23 samples then, 25 now"
    ):
        combine([state], relisted)
    with pytest.raises(StateMismatch, match=r"no hapi\.sdk\.IterableFeatureDataset state"):
        combine(find_states({"model": 1}), IDENTITY)


def test_a_position_continues_its_workers_or_hands_what_is_left_to_a_new_layout():
    saved = Position(IDENTITY, 1, (), _layout(2, 2, 4), {0: 8, 1: 4})
    same, start = saved.continued(_layout(2, 2, 4), 1)
    assert (same.layout, same.done, start) == (saved.layout, (), 4)
    other, start = saved.continued(_layout(3, 1), 0)
    assert other.done == (Pass(_layout(2, 2, 4), (8, 4)),) and start == 0
    assert other.layout == _layout(3, 1) and other.epoch == 1
    one_worker = Position(IDENTITY, 1, (), _layout(2, 2, 4), {1: 4})
    assert one_worker.continued(_layout(2, 2, 4), 1)[1] == 4  # its own worker, as before
    with pytest.raises(StateMismatch, match=r"worker \[1\] of 2 rank\(s\) x 2 worker\(s\)"):
        one_worker.continued(_layout(3, 2, 4), 1)  # another layout needs every worker's


@pytest.mark.parametrize("split", [None, 0, 3, 6])
def test_a_state_records_the_split_in_use_and_an_older_state_none(split):
    state = {**_state(Position(IDENTITY, 0, (), _layout(1, 1)), 0, 3), SPLIT_IN_USE: split}
    assert split_in_use(find_states({"w": state}), 6) == (True, split)
    older = {k: v for k, v in state.items() if k != SPLIT_IN_USE}
    assert split_in_use([older], 6) == (False, None)


@pytest.mark.parametrize("split", [7, -1, True, "6", 2.0])
def test_a_recorded_split_outside_the_frozen_blocks_is_refused(split):
    state = {**_state(Position(IDENTITY, 0, (), _layout(1, 1)), 0, 3), SPLIT_IN_USE: split}
    with pytest.raises(StateMismatch, match=r"split_in_use is .*not null or a split in 0\.\.6"):
        split_in_use([state], 6)
