"""Contenders: which configurations of a cell are measured again, in what order, and
how the repeats and the host's steal time are recorded."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from hapi_bench._cli import _config
from hapi_bench.reports._results import RunResult
from hapi_bench.testbed._config import BenchConfig
from hapi_bench.testbed._sweep import _Cell, contenders, core_share
from hapi_bench.testbed._tier import steal_seconds
from tests.bench.support import CLI_OPTIONS, run
from tests.planner.unit.test_recorded import replan
from tests.planner.unit.test_trial import near_tie_cell


def _runs(*results: RunResult) -> dict[tuple[int | None, str], RunResult]:
    return {result.key: result for result in results}


def test_rounds_interleave_the_pick_both_no_pushdown_loaders_and_near_runs() -> None:
    runs = _runs(
        run(None, 12.0),
        run(None, 12.5, loader="sdk"),
        run(8, 4.6),  # the pick, 15% behind the best: a contender
        run(9, 4.0),
        run(10, 4.7),  # 17.5% behind: not a contender
        run(3, 1.0, measured=False),  # a bound is never re-measured
    )

    order = contenders(runs, [(8, "sdk")], repeats=3)

    round_ = [(8, "sdk"), (None, "raw"), (None, "sdk"), (9, "sdk")]
    assert order == round_ + round_  # measured once each already: two rounds to go


def test_a_run_already_repeated_is_not_measured_again_and_one_repeat_measures_nothing() -> None:
    runs = _runs(run(None, 3.0, repeats=2), run(None, 3.1, loader="sdk"), run(10, 5.0))

    assert contenders(runs, [(None, "raw")], repeats=2) == [(None, "sdk")]
    assert contenders(runs, [(None, "raw")], repeats=1) == []


def test_the_no_pushdown_loaders_are_contenders_even_far_behind() -> None:
    runs = _runs(run(None, 30.0), run(None, 33.0, loader="sdk"), run(10, 5.0))

    assert contenders(runs, [(10, "sdk")], repeats=2) == [(10, "sdk"), (None, "raw"), (None, "sdk")]


def test_repeats_reach_the_config_and_bad_values_are_refused(tmp_path: Path) -> None:
    assert _config(False, tmp_path, {**CLI_OPTIONS, "repeats": None}).repeats == 3
    assert _config(True, tmp_path, {**CLI_OPTIONS, "repeats": None}).repeats == 2
    assert _config(True, tmp_path, {**CLI_OPTIONS, "repeats": 5}).repeats == 5
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        BenchConfig(out=tmp_path, repeats=0)


def test_steal_is_read_per_core_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  100 0 50 900 0 0 0 30 0 0\n"
        "cpu0 50 0 25 450 0 0 0 10 0 0\n"
        "cpu1 50 0 25 450 0 0 0 20 0 0\n"
        "intr 12345\n"
    )
    tick = 1 / os.sysconf("SC_CLK_TCK")

    assert steal_seconds([0], stat) == pytest.approx(10 * tick)
    assert steal_seconds([1], stat) == pytest.approx(20 * tick)
    assert steal_seconds([0, 1], stat) == pytest.approx(30 * tick)  # not the "cpu" total
    assert steal_seconds([7], stat) == 0.0


class _Client:
    """Epoch times in the order given (a seam: the testbed's client tier)."""

    def __init__(self, times: list[float]) -> None:
        self._times = iter(times)

    def epoch(self, split: int | None, advance: object, loader: str) -> RunResult:
        epoch_s = next(self._times)
        return run(
            split, epoch_s, loader=loader, attempts_s=(epoch_s,), client_steal_s=epoch_s / 10
        )


class _Quiet:
    def log(self, message: str) -> None:
        pass

    def run(self, label: str, total: int) -> object:
        return lambda n: None

    def done(self, result: RunResult) -> None:
        pass


def test_the_median_epoch_counts_and_every_epoch_is_kept() -> None:
    measured = SimpleNamespace(manifest=SimpleNamespace(name="resnet18"), samples=100)
    cell = _Cell(_Client([5.0, 4.0, 4.5, 3.0]), measured, "balanced", _Quiet(), {})  # type: ignore[arg-type]
    first = cell.measure(10)
    assert (first.epoch_s, first.repeats, first.attempts_s) == (5.0, 1, (5.0,))
    assert cell.measure(10).epoch_s == 4.0  # of two, the faster
    result = cell.measure(10)

    assert result.epoch_s == 4.5 and result.repeats == 3  # the median, not the luckiest
    assert result.attempts_s == (5.0, 4.0, 4.5)
    assert result.client_steal_s == pytest.approx(0.45)  # the counted epoch's own steal
    assert cell.measure(10).epoch_s == 4.0  # of four, the lower middle one


def test_pushdown_runs_record_the_share_of_its_core_the_gateway_had() -> None:
    measured = SimpleNamespace(manifest=SimpleNamespace(name="resnet18"), samples=100)
    served = iter([0.51, 0.55])
    cell = _Cell(_Client([5.0, 4.5, 4.0]), measured, "balanced", _Quiet(), {}, lambda: next(served))  # type: ignore[arg-type]

    assert cell.measure(None, "raw").storage_available is None  # no blocks ran there
    assert cell.measure(10).storage_available == 0.51
    assert cell.measure(10).storage_available == 0.55  # the counted (faster) run's own


def test_only_a_competitor_makes_the_storage_core_share_count(tmp_path: Path) -> None:
    # On a quiet core the gateway had 90-98% of it, the rest the store beside it, whose
    # CPU the tier's seconds already count: dividing by it read efficiencies of 0.92.
    def served() -> float:
        return 0.51

    quiet = BenchConfig(out=tmp_path, models=("resnet18",))
    loaded = BenchConfig(out=tmp_path, models=("resnet18",), storage_competitor=True)

    assert core_share(quiet, served) is None
    assert core_share(loaded, served) is served


def test_the_plan_s_pick_and_what_its_trial_kept_are_both_contenders() -> None:
    runs = _runs(run(None, 12.0), run(None, 12.5, loader="sdk"), run(7, 5.9), run(8, 4.0))

    order = contenders(runs, [(7, "sdk"), (8, "sdk")], repeats=2)

    assert order == [(7, "sdk"), (8, "sdk"), (None, "raw"), (None, "sdk")]


def test_a_near_tie_is_tried_apart_from_the_runs_the_judge_counts() -> None:
    chosen = replan(near_tie_cell())  # picks split 7; split 8 is predicted within 5%
    measured = SimpleNamespace(manifest=SimpleNamespace(name="efficientnet_lite0"), samples=256)
    cell = _Cell(_Client([2.9, 2.6, 2.8]), measured, "compute-bound", _Quiet(), {})  # type: ignore[arg-type]
    cell.measure(7)  # the pick's first epoch is the trial's warm-up

    trial = cell.trial(chosen)

    assert trial is not None
    assert (trial["rival"], trial["epochs_s"], trial["kept"]) == (8, [2.9, 2.6, 2.8], 8)
    assert trial["why"].startswith("Kept split 8")
    assert cell.runs[(7, "sdk")].attempts_s == (2.9,)  # the trial's epochs are not runs
    assert (8, "sdk") not in cell.runs


def test_more_rounds_measure_each_undecided_configuration_once_per_round() -> None:
    measured = SimpleNamespace(manifest=SimpleNamespace(name="resnet18"), samples=100)
    cell = _Cell(_Client([4.0, 4.1, 4.2, 4.3]), measured, "balanced", _Quiet(), {})  # type: ignore[arg-type]

    cell.more_rounds([(None, "raw"), (None, "sdk")], rounds=2)

    assert cell.runs[(None, "raw")].attempts_s == (4.0, 4.2)
    assert cell.runs[(None, "sdk")].attempts_s == (4.1, 4.3)
