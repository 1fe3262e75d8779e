"""The cache scenario's results, report and plot on synthetic epochs (no testbed)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from hapi_bench import bench
from hapi_bench.epochs._epochs import choose_split, pending_writes
from hapi_bench.epochs._epochs_report import markdown, summary_text, to_json, write
from hapi_bench.epochs._epochs_results import (
    BASELINE,
    CLIENT,
    GATEWAY,
    UNCACHED,
    CacheCell,
    EpochRun,
    SweepResult,
    summarize,
    targets,
)
from hapi_bench.testbed._config import BenchConfig
from hapi_bench.testbed._tier import (
    UNCACHED_PORT,
    TierSpec,
    _gateway_settings,
    main_gateway_settings,
)

PNG = b"\x89PNG\r\n\x1a\n"


def epoch(config: str, number: int, seconds: float, **fields: object) -> EpochRun:
    values: dict[str, object] = {
        "config": config,
        "epoch": number,
        "epoch_s": seconds,
        "samples": 96,
        "link_bytes": 96 * 2_000,
    }
    values.update(fields)
    return EpochRun(**values)  # type: ignore[arg-type]


def cache_cell(regime: str = "network-bound", **fields: object) -> CacheCell:
    """Baseline 20 s per epoch; no cache 4.0 and 4.4 s; cold 4.3 then 4.1 s, warm 1.0
    and 1.5 s; the client cache 4.2 s then 0.2 s with 0.1 s of head training."""
    runs = (
        *(epoch(BASELINE, n, 20.0) for n in (1, 2, 3)),
        epoch(UNCACHED, 1, 4.4, storage_cpu_s=4.0),
        epoch(GATEWAY, 1, 4.3, drain_s=0.5, storage_cpu_s=4.2),
        epoch(GATEWAY, 2, 1.0, gateway_hit_ratio=1.0),
        epoch(GATEWAY, 3, 1.5, gateway_hit_ratio=0.5),
        epoch(UNCACHED, 1, 4.0, repeat=2, storage_cpu_s=4.1),
        epoch(GATEWAY, 1, 4.1, repeat=2, storage_cpu_s=4.4),
        epoch(CLIENT, 1, 4.2),
        epoch(CLIENT, 2, 0.2, head_s=0.1, local_hit_ratio=1.0),
        epoch(CLIENT, 3, 0.2, head_s=0.1, local_hit_ratio=1.0),
    )
    values: dict[str, object] = {
        "model": "resnet18",
        "regime": regime,
        "bandwidth_bps": 8e6,
        "split": 9,
        "samples": 96,
        "batch_size": 8,
        "epochs": 3,
        "runs": runs,
        "sweep": SweepResult(
            jobs=4,
            epochs=3,
            job_s={
                UNCACHED: (12.0,) * 4,
                GATEWAY: (6.0, 3.0, 3.0, 3.0),
                CLIENT: (4.6, 0.6, 0.6, 0.6),
            },
        ),
    }
    values.update(fields)
    return CacheCell(**values)  # type: ignore[arg-type]


def test_each_epoch_counts_its_fastest_repeat() -> None:
    cell = cache_cell()

    assert cell.epoch_times(GATEWAY) == [4.1, 1.0, 1.5]
    assert cell.epoch_times(UNCACHED) == [4.0]
    assert cell.cold_s(GATEWAY) == 4.1
    assert cell.warm_s(GATEWAY) == pytest.approx(1.25)
    assert cell.warm_head_s(CLIENT) == pytest.approx(0.1)


def test_summary_figures() -> None:
    summary = summarize(cache_cell())

    assert summary.baseline_s == pytest.approx(20.0)
    assert summary.uncached_s == 4.0
    # Two interleaved pairs: (4.4 s, 4.3 s) and (4.0 s, 4.1 s); CPU (4.0, 4.2), (4.1, 4.4).
    assert summary.cold_pairs == 2
    assert summary.cold_overhead == pytest.approx((4.3 / 4.4 + 4.1 / 4.0) / 2 - 1)
    assert summary.cold_overhead_range == pytest.approx((4.3 / 4.4 - 1, 4.1 / 4.0 - 1))
    assert summary.cold_cpu_overhead == pytest.approx((4.2 / 4.0 + 4.4 / 4.1) / 2 - 1)
    assert summary.warm_speedup == pytest.approx(20.0 / 1.25)
    assert summary.client_speedup == pytest.approx(100.0)
    assert summary.client_over_head == pytest.approx(2.0)
    assert summary.warm_hit_ratio == pytest.approx(0.75)


def test_the_cold_overhead_is_the_median_pair_not_the_fastest_of_each() -> None:
    runs = (
        epoch(UNCACHED, 1, 4.0, storage_cpu_s=4.0),
        epoch(GATEWAY, 1, 4.4, storage_cpu_s=4.0),  # +10%
        epoch(GATEWAY, 1, 3.9, repeat=2, storage_cpu_s=4.0),  # +0% (4.0 s, CPU +0%)
        epoch(UNCACHED, 1, 3.9, repeat=2, storage_cpu_s=4.0),
        epoch(UNCACHED, 1, 5.0, repeat=3, storage_cpu_s=4.0),
        epoch(GATEWAY, 1, 5.1, repeat=3, storage_cpu_s=4.2),  # +2%, CPU +5%
        epoch(GATEWAY, 1, 2.0, repeat=4),  # no pair: not counted
    )
    summary = summarize(cache_cell(runs=runs, sweep=None))

    assert summary.cold_pairs == 3
    assert summary.cold_overhead == pytest.approx(5.1 / 5.0 - 1)
    assert summary.cold_overhead_range == pytest.approx((0.0, 0.1))
    assert summary.cold_cpu_overhead == pytest.approx(0.0)
    assert summary.cold_cpu_overhead_range == pytest.approx((0.0, 0.05))


def test_the_writes_left_for_after_the_epoch_count_in_the_whole_cpu_cost() -> None:
    # The gateway writes a cold epoch's entries once no request is served: the epoch's
    # own storage CPU leaves them out, the drain's holds them.
    runs = (
        epoch(UNCACHED, 1, 4.0, storage_cpu_s=4.0),
        epoch(GATEWAY, 1, 4.0, storage_cpu_s=4.1, drain_cpu_s=0.7),  # +2.5%, whole +20%
        epoch(UNCACHED, 1, 4.0, repeat=2, storage_cpu_s=4.0),
        epoch(GATEWAY, 1, 4.0, repeat=2, storage_cpu_s=4.0, drain_cpu_s=0.4),  # +0%, +10%
    )
    summary = summarize(cache_cell(runs=runs, sweep=None))

    assert summary.cold_cpu_overhead == pytest.approx(0.0125)
    assert summary.cold_cpu_with_drain == pytest.approx(0.15)
    assert summary.cold_cpu_with_drain_range == pytest.approx((0.1, 0.2))


def test_a_cell_without_the_cache_runs_has_no_figures_for_them() -> None:
    cell = cache_cell(runs=(epoch(BASELINE, 1, 20.0), epoch(BASELINE, 2, 22.0)), sweep=None)

    summary = summarize(cell)

    assert summary.baseline_s == pytest.approx(21.0)
    assert summary.cold_overhead is None and summary.warm_speedup is None
    assert [t.met for t in targets([summary])] == [None, None, None]


def test_targets_judge_network_bound_speedups_and_every_cold_overhead() -> None:
    good = summarize(cache_cell())
    slow_cold = summarize(
        cache_cell(
            regime="compute-bound",
            runs=(
                epoch(UNCACHED, 1, 4.0),
                epoch(GATEWAY, 1, 4.4),
                epoch(GATEWAY, 2, 3.0),
            ),
        )
    )

    found = {t.name.split(",")[0]: t for t in targets([good, slow_cold])}
    verdicts = [t.met for t in targets([good, slow_cold])]

    assert verdicts == [True, False, False]  # 16x; client 2x its head; 10% cold overhead
    assert found["gateway cache"].value == pytest.approx(16.0)
    assert targets([good])[2].met is True  # 2.5% is within 3%


def test_sweep_totals_and_speedups() -> None:
    sweep = cache_cell().sweep
    assert sweep is not None

    assert sweep.total_s(UNCACHED) == pytest.approx(48.0)
    assert sweep.total_s(GATEWAY) == pytest.approx(15.0)
    assert sweep.speedup(GATEWAY) == pytest.approx(3.2)
    assert sweep.speedup(UNCACHED) == pytest.approx(1.0)
    assert SweepResult(jobs=1, epochs=2).speedup(GATEWAY) is None


def test_cells_round_trip_through_json() -> None:
    cell = cache_cell()

    again = CacheCell.from_dict(json.loads(json.dumps(cell.to_dict())))

    assert again == cell
    assert CacheCell.from_dict({**cell.to_dict(), "sweep": None}).sweep is None


def test_report_has_the_tables_the_sweep_and_the_goals() -> None:
    text = markdown([cache_cell()], {"description": "synthetic"})

    assert "| gateway cache | 4.10 | 1.00 | 1.50 |" in text
    assert "| baseline | 20.00 | 20.00 | 20.00 |" in text
    assert "| no cache | 4.00 |  |  |" in text
    assert "| gateway cache | 15.0 | 6.0, 3.0, 3.0, 3.0 | 3.20x |" in text
    assert "| +0.1% (-2.3..+2.5%) | +6.2% (+5.0..+7.3%) | +6.2% (+5.0..+7.3%) | 16.0x |" in text
    assert "(target >= 10x): met" in text
    assert "(target <= 1.5x): MISSED" in text
    printed = summary_text([cache_cell()])
    assert "sweep of 4 jobs: no cache 48.0 s, gateway cache 15.0 s, client cache 6.4 s" in printed


def test_write_puts_json_markdown_and_a_png(tmp_path: Path) -> None:
    cells = [cache_cell(), cache_cell(regime="balanced", bandwidth_bps=3e7, sweep=None)]

    paths = write(tmp_path, cells, {"description": "synthetic"})

    assert [p.name for p in paths] == ["epochs.json", "epochs.md", "epochs.png"]
    data = json.loads(paths[0].read_text())
    assert data["summary"][0]["cold_overhead"] == pytest.approx((4.3 / 4.4 + 4.1 / 4.0) / 2 - 1)
    assert data["cells"][0]["sweep"]["total_s"]["no cache"] == pytest.approx(48.0)
    assert [CacheCell.from_dict(c) for c in data["cells"]] == cells
    image = paths[2].read_bytes()
    assert image.startswith(PNG) and len(image) > 10_000
    assert to_json(cells, {})["targets"][0]["met"] is True


def test_pending_writes_reads_the_gauge() -> None:
    metrics = (
        "# HELP hapi_cache_writes_pending Feature cache writes queued.\n"
        "# TYPE hapi_cache_writes_pending gauge\n"
        "hapi_cache_writes_pending 3.0\n"
        'hapi_cache_writes_total{model="m",outcome="written"} 7.0\n'
    )

    assert pending_writes(metrics) == 3.0
    assert pending_writes("hapi_requests_in_flight 1.0\n") is None


def test_the_split_is_the_first_asked_else_the_pick_else_the_best_pushdown(tmp_path: Path) -> None:
    candidates = [
        SimpleNamespace(split=None, epoch_s=5.0),
        SimpleNamespace(split=3, epoch_s=float("inf")),
        SimpleNamespace(split=7, epoch_s=6.0),
        SimpleNamespace(split=9, epoch_s=8.0),
    ]
    plan = SimpleNamespace(split=None, candidates=candidates)

    assert choose_split(BenchConfig(out=tmp_path, splits=(4, 5)), plan) == 4
    assert choose_split(BenchConfig(out=tmp_path), SimpleNamespace(split=9, candidates=[])) == 9
    assert choose_split(BenchConfig(out=tmp_path), plan) == 7


def test_one_epoch_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="epochs"):
        BenchConfig(out=tmp_path, epochs=1)
    result = CliRunner().invoke(bench, ["--epochs", "1", "--out", str(tmp_path)])

    assert result.exit_code == 2
    assert "--epochs" in result.stderr


def test_the_uncached_gateway_is_asked_for_and_has_its_cache_off(tmp_path: Path) -> None:
    plain = TierSpec.generate("10.0.0.2", tmp_path)
    both = TierSpec.generate("10.0.0.2", tmp_path, uncached_port=UNCACHED_PORT)

    assert plain.uncached_url is None
    assert both.uncached_url == f"http://10.0.0.2:{UNCACHED_PORT}"
    assert _gateway_settings(both, both.store_url, cache=False).cache_enabled is False
    assert _gateway_settings(both, both.store_url, cache=True).cache_enabled is True


def test_the_split_sweep_gateway_computes_every_epoch(tmp_path: Path) -> None:
    """The sweep repeats epochs over the same objects: a feature cache would serve the
    measured epoch from the warm-up's entries, timing reads instead of the blocks."""
    sweep = TierSpec.generate("10.0.0.2", tmp_path)
    scenario = TierSpec.generate("10.0.0.2", tmp_path, uncached_port=UNCACHED_PORT)
    assert main_gateway_settings(sweep).cache_enabled is False
    assert main_gateway_settings(scenario).cache_enabled is True
