"""The report math on synthetic results: speedup, regret, efficiency, bytes reduction."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from hapi_bench.reports import _report
from hapi_bench.reports._results import CellResult
from tests.bench.support import cell, run


def test_speedup_regret_and_bytes_of_a_winning_pick(cells: list[CellResult]) -> None:
    summary = _report.summarize_cell(cells[0])

    assert summary.speedup == pytest.approx(4.0)
    assert summary.best == 10
    assert summary.regret == pytest.approx(0.0)
    assert summary.within
    assert summary.bytes_reduction == pytest.approx(15.0)
    assert (summary.measured_runs, summary.bounded_runs) == (3, 1)
    assert summary.sdk_local_s == pytest.approx(26.0)


def test_a_pick_behind_the_best_counts_against_the_planner(cells: list[CellResult]) -> None:
    summary = _report.summarize_cell(cells[1])

    assert summary.best == 10
    assert summary.regret == pytest.approx(5.5 / (5.0 / 1.05) - 1)
    assert not summary.within
    assert summary.speedup == pytest.approx(5.0 / 5.5)


def test_a_pick_exactly_five_percent_behind_is_within_tolerance() -> None:
    edge = cell("balanced", 9, [run(None, 10.0), run(9, 10.5), run(10, 10.0)])

    assert _report.summarize_cell(edge).within


def test_the_baseline_can_be_the_best_and_the_pick() -> None:
    summary = _report.summarize_cell(cell("compute-bound", None, [run(None, 3.0), run(10, 4.0)]))

    assert (summary.pick, summary.best, summary.speedup, summary.regret) == (None, None, 1.0, 0.0)
    assert summary.bytes_reduction == pytest.approx(1.0)


def test_bounded_runs_never_count_as_the_best() -> None:
    bounded = run(3, 1.0, measured=False)
    summary = _report.summarize_cell(cell("balanced", 10, [run(None, 8.0), bounded, run(10, 4.0)]))

    assert summary.best == 10
    assert bounded.efficiency is None


def test_efficiency_is_epoch_over_the_slowest_stage() -> None:
    result = run(5, 6.0, client_cpu_s=2.0, storage_cpu_s=5.0, link_s=4.0, batches=None)

    assert result.efficiency == pytest.approx(1.2)
    assert result.bottleneck == "storage"
    assert result.slowest_stage_s == 5.0


def test_a_pick_that_was_not_measured_is_an_error() -> None:
    with pytest.raises(ValueError, match="split 7 was not measured"):
        _report.summarize_cell(cell("balanced", 7, [run(None, 8.0)]))


def test_targets_judge_each_goal(cells: list[CellResult]) -> None:
    found = {t.name: t for t in _report.targets([_report.summarize_cell(c) for c in cells])}

    assert found["speedup where network-bound, models pushdown can help (min)"].met is True
    assert found["speedup anywhere (min)"].value == pytest.approx(5.0 / 5.5)
    assert found["speedup anywhere (min)"].met is False
    assert found["picks within 5% of the best"].value == pytest.approx(0.5)
    assert found["picks within 5% of the best"].met is False
    # The network-bound pick: storage 4.6 s, plus client and link for one of 25 batches.
    bound = 4.6 + (0.2 + 0.2) / 25
    assert found["pipeline efficiency at the pick (max)"].value == pytest.approx(5.0 / bound)
    assert found["pipeline efficiency at the pick (max)"].met is True
    assert found["sdk no-pushdown / baseline epoch (max)"].value == pytest.approx(1.3)
    assert found["sdk no-pushdown / baseline epoch (max)"].met is False


def test_the_no_pushdown_target_is_met_within_three_percent() -> None:
    close = cell("balanced", None, [run(None, 10.0), run(None, 10.3, loader="sdk")])
    found = {t.name: t for t in _report.targets([_report.summarize_cell(close)])}

    assert found["sdk no-pushdown / baseline epoch (max)"].met is True


def test_the_no_pushdown_overhead_is_the_median_of_paired_rounds() -> None:
    # The host slowed down in round 2 for both loaders; pairing cancels it.
    paired = cell(
        "balanced",
        None,
        [
            run(None, 10.0, attempts_s=(10.0, 15.0, 10.0)),
            run(None, 10.2, loader="sdk", attempts_s=(10.2, 15.3, 9.9)),
        ],
    )
    summary = _report.summarize_cell(paired)

    assert summary.local_overhead == pytest.approx(1.02)  # median of 1.02, 1.02, 0.99
    unpaired = cell("balanced", None, [run(None, 10.0), run(None, 10.5, loader="sdk")])
    assert _report.summarize_cell(unpaired).local_overhead == pytest.approx(1.05)


def test_steal_is_summed_over_counted_epochs_and_named_where_worst() -> None:
    quiet = cell("network-bound", None, [run(None, 10.0, client_steal_s=0.1)])
    noisy = cell(
        "compute-bound",
        10,
        [run(None, 5.0, storage_steal_s=1.0), run(10, 5.0, client_steal_s=0.5)],
    )
    lines = _report.steal_lines([_report.summarize_cell(c) for c in (quiet, noisy)])

    assert lines == [
        "- host steal: 1.6 s over 20 s of counted epochs (8.0%; the busier core of each run), "
        "most in resnet18 compute-bound (15.0%)"
    ]
    assert (
        _report.steal_lines([_report.summarize_cell(cell("balanced", None, [run(None, 1.0)]))])
        == []
    )


def test_targets_without_a_network_bound_cell_say_so(cells: list[CellResult]) -> None:
    found = _report.targets([_report.summarize_cell(cells[1])])

    assert found[0].value is None and found[0].met is None


def test_results_round_trip_through_json(cells: list[CellResult]) -> None:
    text = json.dumps(_report.to_json(cells, {"description": "test"}))
    data = json.loads(text)

    assert [CellResult.from_dict(c) for c in data["cells"]] == cells
    assert data["summary"][0]["speedup"] == pytest.approx(4.0)
    assert not any(isinstance(v, float) and math.isinf(v) for v in data["summary"][0].values())


def test_markdown_and_summary_show_every_cell_and_run(cells: list[CellResult]) -> None:
    text = _report.markdown(cells, {"description": "the testbed"})
    summary = _report.summary_text(cells)

    assert (
        "| resnet18 | network-bound | 2 Mbit/s | 4 | 20.00 | 26.00 (+30.0%) | 10 | 5.00 | 10 |"
        in text
    )
    assert "| split 9 | >= 40.0 (link bound, not run)" in text
    assert "| split 10 (pick) | 5.00 |" in text
    assert "| 0.00 / 0.00 |  | 5.00 |" in text  # steal, drops (not recorded), every epoch
    assert "| sdk, no pushdown | 26.00 |" in text
    assert "4.00x" in summary and "MISSED" in summary


def test_write_puts_json_and_markdown_in_the_directory(tmp_path, cells: list[CellResult]) -> None:
    paths = _report.write(tmp_path / "out", cells, {"description": ""})

    assert [p.name for p in paths] == ["results.json", "results.md"]
    assert json.loads(paths[0].read_text())["targets"]


def test_efficiency_at_a_no_pushdown_pick_is_hapis_pipeline_not_the_baseline_loaders() -> None:
    # When the planner keeps raw objects, what a user runs is hapi.sdk with split=None;
    # the baseline loader is the yardstick, not hapi's pipeline.
    baseline = run(None, 13.6, client_cpu_s=10.0, link_s=9.8)
    sdk = run(None, 10.5, loader="sdk", client_cpu_s=10.0, link_s=9.8)
    summary = _report.summarize_cell(cell("balanced", None, [baseline, sdk]))

    assert summary.efficiency == pytest.approx(10.5 / (10.0 + (9.8 + 10.5 / 2) / 25))
    alone = _report.summarize_cell(cell("balanced", None, [baseline]))
    assert alone.efficiency is None  # the SDK's path was not measured: nothing to judge


def test_a_no_pushdown_pick_is_timed_by_hapis_own_path_not_the_baseline_loader() -> None:
    # Where the planner keeps raw objects, split="auto" runs hapi.sdk's split=None path:
    # that is the pick's epoch. Judging it by the baseline loader counted a right choice
    # as a miss when the SDK's path was the fastest run of the cell (ResNet18
    # compute-bound, five-round quiet sweep: 7.20 s baseline, 6.71 s split=None).
    baseline = run(None, 7.20)
    sdk = run(None, 6.71, loader="sdk")
    summary = _report.summarize_cell(cell("compute-bound", None, [baseline, sdk, run(10, 7.5)]))

    assert summary.pick_s == pytest.approx(6.71)
    assert summary.regret == pytest.approx(0.0)
    assert summary.within
    assert summary.speedup == pytest.approx(7.20 / 6.71)


def test_the_sdks_own_overhead_is_judged_by_the_speedup_not_the_planners_regret() -> None:
    # Every configuration is timed through hapi.sdk, so the planner's regret compares
    # like with like; the SDK's overhead against the baseline loader (what users pick
    # instead) shows in the speedup and the no-pushdown overhead.
    baseline = run(None, 6.0)
    sdk = run(None, 6.6, loader="sdk")
    summary = _report.summarize_cell(cell("compute-bound", None, [baseline, sdk, run(10, 6.7)]))

    assert summary.pick_s == pytest.approx(6.6)
    assert (summary.best, summary.best_s, summary.regret) == (None, 6.6, 0.0)
    assert summary.speedup == pytest.approx(6.0 / 6.6)
    assert summary.local_overhead == pytest.approx(1.1)
    # Without the SDK's run the baseline loader stands in for no pushdown.
    alone = _report.summarize_cell(cell("compute-bound", None, [baseline, run(10, 6.7)]))
    assert (alone.pick_s, alone.best_s, alone.regret) == (6.0, 6.0, 0.0)


def test_speedup_and_regret_compare_paired_rounds_not_medians_from_different_rounds() -> None:
    # VGG11 compute-bound, final quiet sweep: the host ran round 1 slowly for the
    # baseline and round 3 slowly for the SDK, so their medians (7.06 s, 8.01 s) come
    # from different moments and read as a 12% slowdown; round by round the SDK took
    # 0.79, 0.97 and 1.18 of the baseline's epoch.
    baseline = run(None, 7.06, attempts_s=(10.90, 7.06, 6.81), repeats=3)
    sdk = run(None, 8.01, loader="sdk", attempts_s=(8.66, 6.82, 8.01), repeats=3)
    split = run(8, 8.20, attempts_s=(8.90, 7.10, 8.20), repeats=3)
    summary = _report.summarize_cell(cell("compute-bound", None, [baseline, sdk, split]))

    assert summary.speedup == pytest.approx(7.06 / 6.82)
    assert (summary.best, summary.regret) == (None, 0.0)
    # The split is judged round by round too: 1.03, 1.04, 1.02 of the SDK's epoch.
    behind = _report.summarize_cell(cell("compute-bound", 8, [baseline, sdk, split]))
    assert behind.regret == pytest.approx(8.90 / 8.66 - 1)
    assert behind.within


def test_efficiency_is_against_the_least_time_a_pipeline_of_these_batches_can_take() -> None:
    # A perfect pipeline of N batches still fills and drains: the first batch crosses
    # every stage before the slowest one is busy, so even a flawless two-stage pipeline
    # of 12 equal batches takes 13 batch times (VGG11 balanced: link 10.5 s, client 10.2 s,
    # 12 batches). The old figure, epoch over the slowest stage, called that 1.08 where the
    # pipeline wasted nothing.
    flawless = run(
        None,
        10.5 + (10.2 + 0.3) / 12,
        client_cpu_s=10.2,
        storage_cpu_s=0.3,
        link_s=10.5,
        batches=12,
    )

    assert flawless.efficiency == pytest.approx(1.0)
    assert flawless.pipeline_bound_s == pytest.approx(10.5 + 10.5 / 12)
    # Without the batch count (older recordings) the bound is the slowest stage alone...
    unknown = run(None, 6.0, client_cpu_s=5.0, storage_cpu_s=0.5, link_s=1.0, batches=None)
    assert unknown.efficiency == pytest.approx(1.2)
    # ...and a recorded cell supplies it from its batch size.
    loaded = CellResult.from_dict(cell("balanced", None, [replace(unknown)]).to_dict())
    assert loaded.runs[0].batches == 25  # 100 samples in batches of 4


def test_the_storage_stage_is_its_cpu_over_the_share_of_its_core_it_had() -> None:
    # With a busy loop on the storage core the gateway had half of it: ResNet18's split
    # 10 used 4.3 s of its CPU in an 8.4 s epoch, a pipeline bound by the storage side,
    # not one that wasted 49% of its time.
    loaded = run(10, 8.4, client_cpu_s=0.1, storage_cpu_s=4.3, link_s=1.2, storage_available=0.51)

    assert loaded.storage_stage_s == pytest.approx(4.3 / 0.51)
    assert loaded.bottleneck == "storage"
    assert loaded.efficiency == pytest.approx(8.4 / (4.3 / 0.51 + (0.1 + 1.2) / 25))
    table = "\n".join(_report.runs_table(cell("network-bound", 10, [run(None, 20.0), loaded])))
    assert "| 4.30 (51% of its core) |" in table
    # Not measured (or a whole core): the CPU seconds are the stage.
    assert run(10, 8.4, storage_cpu_s=4.3).storage_stage_s == 4.3
    assert run(10, 8.4, storage_cpu_s=4.3, storage_available=1.0).storage_stage_s == 4.3


def test_the_network_bound_target_leaves_out_models_no_split_can_help() -> None:
    # Before: VGG11's raw objects (its features outweigh them at every split) read 1.0x
    # and missed the target in every default sweep, whatever the planner did.
    helped = cell("network-bound", 10, [run(None, 20.0), run(10, 5.0)])
    outweighed = cell(
        "network-bound",
        None,
        [run(None, 8.0), run(None, 8.0, loader="sdk"), run(3, 30.0)],
        model="vgg11",
        wire_bytes=(602_112, *([100_352] * 9)),
    )
    summaries = [_report.summarize_cell(c) for c in (helped, outweighed)]
    found = {t.name: t for t in _report.targets(summaries)}

    assert [_report.can_help(c) for c in (helped, outweighed)] == [True, False]
    target = found["speedup where network-bound, models pushdown can help (min)"]
    assert target.value == pytest.approx(4.0) and target.met is True


def test_dropped_frames_are_shown_per_run_and_summed() -> None:
    lossy = cell(
        "balanced",
        10,
        [
            run(None, 10.0, link_frames=1031, link_dropped=89),
            run(10, 5.0, link_frames=200, link_dropped=0),
        ],
    )
    text = _report.markdown([lossy], {"description": "the testbed"})

    assert "| 0.00 / 0.00 | 89 of 1031 |" in text
    assert _report.drop_lines([lossy]) == [
        "- link queue: 89 of 1231 frames dropped in the counted epochs, "
        "most in resnet18 balanced baseline (89 of 1031)"
    ]
    assert "89 of 1231 frames dropped" in _report.summary_text([lossy])
    assert _report.drop_lines([cell("balanced", None, [run(None, 1.0)])]) == []


def test_a_near_tie_s_trial_is_judged_by_what_it_kept_and_the_plan_beside_it() -> None:
    trial = {"rival": 9, "epochs_s": [3.2, 2.9, 3.1], "kept": 9, "why": "Kept split 9: ..."}
    runs = [run(None, 4.0), run(7, 2.90), run(8, 2.81), run(9, 2.70)]
    tied = cell("compute-bound", 7, runs, trial=trial)

    summary = _report.summarize_cell(tied)

    assert (summary.pick, summary.kept, summary.best) == (7, 9, 9)
    assert summary.regret == pytest.approx(0.0) and summary.within
    assert summary.planned_regret == pytest.approx(2.90 / 2.70 - 1) and not summary.planned_within
    assert summary.speedup == pytest.approx(4.0 / 2.70)
    table = "\n".join(_report.summary_table([summary]))
    assert "| 9 (planned 7, +7.4%) | 2.70 |" in table
    found = {t.name: t for t in _report.targets([summary])}
    assert found["picks within 5% of the best"].met is True
    assert found["the plan's picks within 5% of the best (before any trial)"].met is False
    markdown = _report.markdown([tied], {})
    assert "Trial of split 7 against split 9 (epochs 3.20, 2.90, 3.10 s" in markdown
    assert CellResult.from_dict(json.loads(json.dumps(tied.to_dict()))) == tied


def test_a_cell_without_a_trial_keeps_the_plan_s_pick() -> None:
    plain = cell("balanced", 10, [run(None, 8.0), run(10, 4.0)])

    assert plain.kept == 10 and plain.trial is None
    assert "Trial of" not in _report.markdown([plain], {})


def test_comparisons_whose_rounds_fall_on_both_sides_of_their_limit_are_undecided() -> None:
    raw = run(None, 4.0, attempts_s=(4.0, 4.0, 4.0))
    settled_local = run(None, 4.2, loader="sdk", attempts_s=(4.2, 4.2, 4.3))  # +5% each round
    torn_local = run(None, 4.1, loader="sdk", attempts_s=(4.0, 4.2, 4.1))  # 0%, +5%, +2.5%
    pick = run(10, 2.0, attempts_s=(2.0, 2.0, 2.0))

    assert _report.undecided(cell("balanced", 10, [raw, settled_local, pick])) == []
    assert _report.undecided(cell("balanced", 10, [raw, torn_local, pick])) == [
        (None, "raw"),
        (None, "sdk"),
    ]
    # A pick 4% and 7% behind the best in two of three rounds: undecided either way.
    behind = run(9, 2.1, attempts_s=(2.08, 2.14, 2.0))
    assert _report.undecided(cell("balanced", 9, [raw, settled_local, behind, pick])) == [
        (9, "sdk"),
        (10, "sdk"),
    ]
    assert _report.paired(pick, pick) == []
    assert _report.paired(behind, pick) == pytest.approx([1.04, 1.07, 1.0])
