"""The storage profiler's bookkeeping: buckets, the all-batches figure, availability."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hapi.gateway.pushdown import _profiles
from hapi.gateway.pushdown._profiles import (
    ChainedRun,
    ProfiledRun,
    StorageProfiler,
    TimedRun,
    batch_bucket,
)
from hapi.models import RuntimeSettings, create_session
from hapi.models.testing import compose
from tests.gateway.support import ManualClock, fake_probes
from tests.models.unit.test_block_times import ROWS, WIDTH, _block
from tests.planner.synthetic import manifest

MODEL = manifest(freeze=3)


def test_batch_sizes_count_under_powers_of_two() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 64)] == [1, 2, 4, 4, 8, 8, 16, 64]


def test_a_block_is_one_figure_over_its_buckets_weighted_by_samples() -> None:
    profiler = StorageProfiler()
    first = MODEL.blocks[0].hash
    profiler.record_block(first, "cpu", 4, 0.004)  # 1 ms per sample, 4 samples
    profiler.record_block(first, "cpu", 12, 0.006)  # 0.5 ms per sample, 12 samples
    storage = profiler.profile(MODEL)
    assert [(b.batch, b.ms, b.samples) for b in storage.batches] == [(4, 1.0, 4), (16, 0.5, 12)]
    overall = storage.blocks[0]
    assert (overall.source, overall.samples, overall.batch) == ("measured", 16, 0)
    assert overall.ms == pytest.approx((1.0 * 4 + 0.5 * 12) / 16)
    assert [b.source for b in storage.blocks[1:]] == ["manifest", "manifest"]


def test_availability_is_process_cpu_over_wall_at_most_one() -> None:
    profiler = StorageProfiler()
    profiler.record_availability(0.5, 1.0)  # half a core: a CPU-bound neighbour
    assert profiler.profile(MODEL).load.available == pytest.approx(0.5)
    profiler.record_availability(3.5, 1.0)  # several threads on several cores
    assert profiler.profile(MODEL).load.available == 1.0


def test_a_probe_stands_in_only_until_a_block_run_measures_the_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probes = fake_probes(monkeypatch)
    clock = ManualClock()
    profiler = StorageProfiler(clock)
    assert profiler.profile(MODEL).load.source == "manifest"  # a profile alone never probes
    profiler.probe_load()
    clock.now += 10.0
    profiler.probe_load()  # still fresh: not probed again
    load = profiler.profile(MODEL).load
    assert (load.source, load.available, load.samples, load.age_s) == ("probed", 0.5, 1, 10.0)
    clock.now += _profiles.PROBE_TTL_S
    profiler.probe_load()
    assert len(probes) == 2 and profiler.profile(MODEL).load.age_s == 0.0
    profiler.record_availability(0.9, 1.0)  # real traffic: the probe is not served again
    profiler.probe_load()
    assert len(probes) == 2
    assert profiler.profile(MODEL).load.source == "measured"


class _Learned:
    """A run that has learned how its time divides among three blocks."""

    def shares_for(self, size: int) -> tuple[float, ...]:
        return (0.5, 0.25, 0.25)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return batch + 1


def test_a_run_is_divided_by_what_it_learned_else_by_the_manifest() -> None:
    profiler = StorageProfiler()
    plain = TimedRun(lambda x: x, MODEL, 3, device="cpu", profiler=profiler, cpu_clock=False)
    plain(np.zeros((2, 1), np.float32))  # the cold run, not counted
    plain(np.zeros((2, 1), np.float32))
    storage = profiler.profile(MODEL)
    assert [(b.block, b.batch, b.samples, b.clock, b.split_by) for b in storage.batches] == [
        (i, 2, 2, "wall", "manifest") for i in range(3)
    ]
    ratios = [b.ms / storage.batches[0].ms for b in storage.batches]
    cpu_ms = [b.cpu_ms for b in MODEL.blocks[:3]]
    assert ratios == pytest.approx([ms / cpu_ms[0] for ms in cpu_ms], rel=1e-2)
    assert storage.load.source == "manifest"  # wall time already holds any load

    learned = TimedRun(_Learned(), MODEL, 3, device="cpu", profiler=profiler, cpu_clock=True)
    learned(np.zeros((2, 1), np.float32))  # the cold run, not counted
    assert learned(np.zeros((2, 1), np.float32)).tolist() == [[1.0], [1.0]]
    storage = profiler.profile(MODEL)
    cpu = [b for b in storage.batches if b.clock == "cpu"]
    assert [b.split_by for b in cpu] == ["measured"] * 3
    assert storage.load.source == "measured"


def _profiled(tmp_path: Path) -> ProfiledRun:
    graph = compose([_block(WIDTH, 1), _block(WIDTH, 6)])
    settings = RuntimeSettings(device="cpu", intra_op_threads=1)
    session = create_session(graph, settings, profile_prefix=str(tmp_path / "trace"))
    return ProfiledRun(lambda x: session.run(None, {"input": x})[0], session, 2, batches=3)


def test_a_session_learns_its_blocks_shares_from_its_first_batches(tmp_path: Path) -> None:
    run = _profiled(tmp_path)
    batch = np.ones((ROWS, WIDTH), np.float32)
    for _ in range(2):
        run(batch)
    assert run.shares is None
    run(batch)
    assert run.shares is not None and sum(run.shares) == pytest.approx(1.0)
    assert run.shares[1] > run.shares[0]  # six matmuls against one
    assert list(tmp_path.iterdir()) == []  # the trace is gone
    run.close()  # nothing left to end
    assert run(batch).shape == (ROWS, WIDTH)


def test_a_session_closed_before_it_learned_leaves_no_trace(tmp_path: Path) -> None:
    run = _profiled(tmp_path)
    run(np.ones((4, WIDTH), np.float32))
    run.close()
    assert run.shares is None and list(tmp_path.iterdir()) == []


class _Profiling:
    """A run profiled per node for its first ``batches`` runs, as a new session is."""

    def __init__(self, batches: int) -> None:
        self.left = batches

    def profiling_for(self, size: int) -> bool:
        return self.left > 0

    def shares_for(self, size: int) -> tuple[float, ...]:
        return (0.5, 0.25, 0.25)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.left -= 1
        return batch


def test_cold_and_profiled_runs_are_not_counted_as_inference_time() -> None:
    # A session's first run allocates and plans its memory, and per-node profiling adds
    # an event per node: neither is what a batch costs once the session serves.
    profiler = StorageProfiler()
    run = TimedRun(_Profiling(3), MODEL, 3, device="cpu", profiler=profiler, cpu_clock=True)
    for _ in range(5):
        run(np.zeros((2, 1), np.float32))
    assert [b.samples for b in profiler.profile(MODEL).batches] == [4, 4, 4]

    profiler = StorageProfiler()
    plain = TimedRun(lambda x: x, MODEL, 3, device="cpu", profiler=profiler, cpu_clock=True)
    plain(np.zeros((2, 1), np.float32))
    assert profiler.profile(MODEL).batches == []  # the first run is the cold one
    plain(np.zeros((2, 1), np.float32))
    assert [b.samples for b in profiler.profile(MODEL).batches] == [2, 2, 2]


def test_a_profiled_run_says_while_it_profiles(tmp_path: Path) -> None:
    run = _profiled(tmp_path)
    batch = np.ones((4, WIDTH), np.float32)
    states = []
    for _ in range(4):
        states.append(run.profiling)
        run(batch)
    assert states == [True, True, True, False]


def test_runs_after_an_idle_gap_are_served_only_where_nothing_ran_back_to_back() -> None:
    clock = ManualClock(100.0)
    profiler = StorageProfiler(clock)
    first = MODEL.blocks[0].hash

    def run(gap_s: float) -> bool:
        clock.now += gap_s
        warm = profiler.run_started()
        profiler.run_ended()
        return warm

    assert not run(0.0)  # nothing ran before: cold
    assert run(0.01)  # back to back
    assert not run(0.5)  # after half a second idle

    profiler.record_block(first, "cpu", 4, 0.008, warm=False)  # 2 ms per sample, cold
    assert profiler.profile(MODEL).blocks[0].ms == pytest.approx(2.0)  # all there is
    profiler.record_block(first, "cpu", 4, 0.004, warm=True)  # 1 ms per sample, warm
    profiler.record_block(first, "cpu", 4, 0.012, warm=False)
    storage = profiler.profile(MODEL)
    assert storage.blocks[0].ms == pytest.approx(1.0) and storage.blocks[0].samples == 4
    assert [b.ms for b in storage.batches if b.block == 0] == [pytest.approx(1.0)]

    profiler.record_availability(0.5, 1.0, warm=False)  # half a core, after idle
    assert profiler.profile(MODEL).load.available == pytest.approx(0.5)
    profiler.record_availability(0.9, 1.0, warm=True)
    assert profiler.profile(MODEL).load.available == pytest.approx(0.9)


def test_a_timed_run_records_whether_it_ran_back_to_back() -> None:
    clock = ManualClock(100.0)
    profiler = StorageProfiler(clock)
    run = TimedRun(lambda x: x, MODEL, 3, device="cpu", profiler=profiler, cpu_clock=True)
    batch = np.zeros((2, 1), np.float32)
    run(batch)  # the session's first run: not counted
    clock.now += 1.0
    run(batch)  # after a second idle: counted cold
    assert profiler.profile(MODEL).blocks[0].samples == 2
    run(batch)  # back to back: the warm figure replaces the cold one
    run(batch)
    assert profiler.profile(MODEL).blocks[0].samples == 4


class _Block:
    """A block that takes ``seconds`` of a manual clock per run (``first`` the first time),
    and adds one."""

    def __init__(self, clock: ManualClock, seconds: float, first: float | None = None) -> None:
        self.clock, self.seconds, self.first, self.runs = clock, seconds, first, 0

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.clock.now += self.first if self.runs == 0 and self.first else self.seconds
        self.runs += 1
        return batch + 1


def test_a_gpu_session_learns_each_buckets_shares_from_each_block_timed_alone() -> None:
    # On a GPU onnxruntime's per-node profile times kernel launches (an H100 gave
    # ResNet18's blocks shares up to 0.18 off), so each block runs alone instead; and the
    # division moves with the batch size there, so each bucket learns its own.
    clock = ManualClock()
    chain = [_Block(clock, 0.03, first=10.0), _Block(clock, 0.01, first=10.0)]
    run = ChainedRun(lambda x: x * 2, chain, repeats=3, clock=clock)
    four = np.ones((4, 1), np.float32)
    assert run.profiling_for(4) and run.shares_for(4) is None
    assert run(four).tolist() == (four * 2).tolist()  # the composed run's output
    assert [b.runs for b in chain] == [4, 4]  # the warm-up (cuDNN's search), three timed
    assert run.shares_for(3) == pytest.approx((0.75, 0.25))  # 3 counts under bucket 4
    assert not run.profiling_for(4) and run.profiling_for(32)
    run(four)
    assert [b.runs for b in chain] == [4, 4]  # a learned bucket runs the composed graph only

    chain[0].seconds, chain[1].seconds = 0.01, 0.03  # larger batches divide differently
    run(np.ones((32, 1), np.float32))
    assert run.shares_for(32) == pytest.approx((0.25, 0.75))
    assert run.shares_for(4) == pytest.approx((0.75, 0.25))


def test_the_median_of_the_repeats_counts_not_one_delayed_timing() -> None:
    clock = ManualClock()
    chain = [_Block(clock, 0.01), _Block(clock, 0.01)]
    delayed = chain[1]

    def late(batch: np.ndarray) -> np.ndarray:  # another thread held the core once
        out = _Block.__call__(delayed, batch)
        if delayed.runs == 3:
            clock.now += 1.0
        return out

    run = ChainedRun(lambda x: x, [chain[0], late], repeats=5, clock=clock)
    run(np.ones((8, 1), np.float32))
    assert run.shares_for(8) == pytest.approx((0.5, 0.5))


def test_one_block_needs_no_chain_and_a_closed_run_stops_chaining() -> None:
    clock = ManualClock()
    alone = _Block(clock, 0.01)
    single = ChainedRun(lambda x: x, [alone], clock=clock)
    assert single.shares_for(8) == (1.0,) and not single.profiling_for(8)
    single(np.ones((1, 1), np.float32))
    assert alone.runs == 0

    chain = [_Block(clock, 0.01), _Block(clock, 0.02)]
    run = ChainedRun(lambda x: x, chain, clock=clock)
    run.close()
    run(np.ones((1, 1), np.float32))
    assert run.shares_for(1) is None and not run.profiling_for(1)
    assert [b.runs for b in chain] == [0, 0]


def test_timed_runs_take_the_division_of_their_batchs_bucket() -> None:
    clock = ManualClock()
    chain = [_Block(clock, 0.02), _Block(clock, 0.02)]
    profiler = StorageProfiler()
    composed = ChainedRun(lambda x: x, chain, clock=clock)
    run = TimedRun(composed, MODEL, 2, device="cuda", profiler=profiler, cpu_clock=False)
    run(np.ones((2, 1), np.float32))  # cold, and the bucket's chained batch: not counted
    run(np.ones((4, 1), np.float32))  # a new bucket's chained batch: not counted either
    assert profiler.profile(MODEL).batches == []
    run(np.ones((2, 1), np.float32))
    figures = [(b.block, b.batch, b.split_by, b.device) for b in profiler.profile(MODEL).batches]
    assert figures == [(0, 2, "measured", "cuda"), (1, 2, "measured", "cuda")]


def test_a_chain_of_real_sessions_learns_the_heavier_block() -> None:
    settings = RuntimeSettings(device="cpu", intra_op_threads=1)
    blocks = [_block(WIDTH, 1), _block(WIDTH, 6)]
    composed = create_session(compose(blocks), settings)
    chain = [create_session(b, settings) for b in blocks]
    run = ChainedRun(
        lambda x: composed.run(None, {"input": x})[0],
        [lambda x, s=s: s.run(None, {"input": x})[0] for s in chain],
    )
    batch = np.ones((ROWS, WIDTH), np.float32)
    while run.profiling_for(len(batch)):
        assert np.array_equal(run(batch), batch)  # identity weights: every block returns x
    shares = run.shares_for(len(batch))
    assert shares is not None and shares[1] > shares[0]  # six matmuls against one
