"""``make bench-pushdown``'s arithmetic: ratios to the bare loop, and what the cores allow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hapi_bench.core._errors import BenchError
from hapi_bench.core._host import busy_seconds
from hapi_bench.micro._ceiling import GOALS, Run, _cell, _modes, _report, baseline_tree


def _runs(store: float | None = 1.0) -> dict[str, list[Run]]:
    return {
        "bare": [Run(800.0, 2.0), Run(700.0, 2.2), Run(760.0, 2.1)],
        "batch": [
            Run(560.0, 2.5, store, 1.7),
            Run(600.0, 2.4, store, 1.8),
            Run(580.0, 2.5, store, 1.7),
        ],
        "single": [
            Run(350.0, 3.2, store, 1.5),
            Run(340.0, 3.3, store, 1.4),
            Run(360.0, 3.1, store, 1.5),
        ],
    }


def _results(cells: list[dict]) -> dict:
    """What ``run`` hands ``_report``, around ``cells``."""
    return {
        "rounds": 3,
        "seconds_per_run": 6,
        "load": "wrk",
        "cpu_count": 2,
        "cpu": "a test CPU",
        "goals": GOALS,
        "cells": cells,
    }


def test_ratios_are_medians_over_the_bare_loops_median_with_each_rounds_range() -> None:
    cell = _cell("resnet18", 0, _runs())
    assert cell["bare_samples_per_s"] == 760.0
    assert cell["batch"]["ratio"] == pytest.approx(580 / 760)
    # each round's gateway run against the same round's bare loop
    assert cell["batch"]["ratio_range"] == pytest.approx([560 / 800, 600 / 700])
    assert cell["batch"]["cpu_ratio"] == pytest.approx(2.5 / 2.1)
    # the goal is CPU per sample: 2.5 / 2.1 = 1.19x the bare loop's, over the batches' 1.1x
    assert not cell["batch"]["meets_cpu"] and not cell["batch"]["meets_goal"]
    assert GOALS["batch"] == 1.1


def test_what_the_cores_allow_counts_the_stores_cpu_beside_the_gateways() -> None:
    cell = _cell("resnet18", 0, _runs(store=1.0))
    cores = os.cpu_count() or 1
    assert cell["single"]["store_cpu_ms_per_sample"] == 1.0
    assert cell["single"]["busy_cores"] == 1.5
    assert cell["single"]["cores_allow_ratio"] == pytest.approx(cores * 1000 / (3.2 + 1.0) / 760)
    assert cell["batch"]["cores_allow_ratio"] > cell["single"]["cores_allow_ratio"]


def test_runs_without_the_stores_cpu_leave_the_bound_out(tmp_path) -> None:
    cell = _cell("resnet18", 0, _runs(store=None))
    assert "cores_allow_ratio" not in cell["batch"]
    results = _results([cell, _cell("resnet18", 1, _runs())])
    _report(tmp_path, results)
    table = (tmp_path / "bench-pushdown.md").read_text().splitlines()
    header = [c.strip() for c in next(t for t in table if t.startswith("| model")).split("|")]
    rows = [[c.strip() for c in t.split("|")] for t in table if t.startswith("| resnet18")]
    bounds = [header.index(f"{mode}: cores allow") for mode in ("batch", "single")]
    assert [rows[0][i] for i in bounds] == ["-", "-"]  # no store CPU measured: no bound shown
    assert "(misses)" in rows[1][header.index("batch CPU")]
    assert "(misses)" not in rows[1][header.index("batch")]  # a rate is not judged
    assert all(rows[1][i].endswith("x") for i in bounds)
    written = json.loads((tmp_path / "bench-pushdown.json").read_text())["cells"][1]["batch"]
    cores = os.cpu_count() or 1
    assert written["cores_allow_ratio"] == pytest.approx(cores * 1000 / (2.5 + 1.0) / 760)
    assert (tmp_path / "bench-pushdown.png").stat().st_size > 0


def test_busy_seconds_leave_idle_and_iowait_out(tmp_path) -> None:
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(
        f"cpu  {3 * ticks} 0 {ticks} {50 * ticks} {2 * ticks} 0 0 {ticks} 0 0\ncpu0 1 2 3\n"
    )
    assert busy_seconds(stat) == pytest.approx(5.0)


def test_a_gateway_decoding_in_processes_is_judged_beside_the_threaded_one(tmp_path) -> None:
    runs = _runs()
    runs["batch-processes"] = [
        Run(700.0, 2.3, 1.0, 1.9),
        Run(690.0, 2.2, 1.0, 1.9),
        Run(720.0, 2.3, 1.0, 1.9),
    ]
    runs["single-processes"] = [Run(400.0, 3.0, 1.0, 1.6)] * 3
    cell = _cell("resnet18", 0, runs)
    assert cell["batch-processes"]["ratio"] == pytest.approx(700 / 760)
    assert cell["batch-processes"]["meets_goal"]  # 2.3 / 2.1 = 1.095x the CPU: within 1.1x
    assert not cell["single-processes"]["meets_goal"]  # 1.43x against single GETs' 1.25x
    results = _results([cell])
    _report(tmp_path, results)
    table = (tmp_path / "bench-pushdown.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| model"))
    assert "batch-processes" in header and "single-processes" in header
    row = next(line for line in table.splitlines() if line.startswith("| resnet18"))
    assert row.count("|") == header.count("|")  # a column for every mode
    assert "0.92x" in row


def test_the_gateway_is_set_against_the_reference_that_reads_from_the_store(tmp_path) -> None:
    runs = _runs()
    runs["from-store"] = [Run(600.0, 2.6, 0.9), Run(560.0, 2.7, 1.0), Run(640.0, 2.5, 1.1)]
    cell = _cell("resnet18", 0, runs) | {"bare_batch": 16}
    assert cell["from_store"]["samples_per_s"] == 600.0
    assert cell["from_store"]["ratio"] == pytest.approx(600 / 760)
    assert cell["from_store"]["store_cpu_ms_per_sample"] == 1.0
    assert cell["batch"]["vs_from_store"] == pytest.approx(580 / 600)
    assert not cell["batch"]["meets_from_store"]
    assert not cell["batch"]["meets_goal"]  # below the reference, whatever its CPU
    assert _modes(cell) == ["batch", "single"]  # the references are not judged as modes
    results = _results([cell])
    _report(tmp_path, results)
    table = (tmp_path / "bench-pushdown.md").read_text().splitlines()
    header = [c.strip() for c in next(t for t in table if t.startswith("| model")).split("|")]
    row = [c.strip() for c in next(t for t in table if t.startswith("| resnet18")).split("|")]
    assert row[header.index("bare batch")] == "16"
    assert row[header.index("from-store samples/s")] == "600.0"
    assert row[header.index("batch / from-store")] == "0.97x (misses)"


def test_a_gateway_within_its_cpu_cap_and_over_the_reference_meets_its_goal() -> None:
    runs = _runs()
    runs["from-store"] = [Run(500.0, 2.6, 0.9)] * 3
    runs["batch"] = [Run(560.0, 2.3, 1.0, 1.7)] * 3  # 2.3 / 2.1: within 1.1x; 560 > 500
    runs["single"] = [Run(560.0, 2.7, 1.0, 1.7)] * 3  # 2.7 / 2.1 = 1.29x: over 1.25x
    cell = _cell("resnet18", 0, runs)
    assert cell["batch"]["meets_cpu"] and cell["batch"]["meets_from_store"]
    assert cell["batch"]["meets_goal"]
    assert cell["single"]["meets_from_store"] and not cell["single"]["meets_cpu"]
    assert not cell["single"]["meets_goal"]


def test_the_event_loops_share_is_the_median_of_its_rounds_and_absent_where_unmeasured() -> None:
    runs = _runs()
    runs["single"] = [
        Run(350.0, 3.2, 1.0, 1.5, 1.4),
        Run(340.0, 3.3, 1.0, 1.4, 1.2),
        Run(360.0, 3.1, 1.0, 1.5, 1.3),
    ]
    cell = _cell("resnet18", 0, runs)
    assert cell["single"]["loop_cpu_ms_per_sample"] == 1.3
    assert "loop_cpu_ms_per_sample" not in cell["batch"]  # no round measured it
    assert cell["runs"]["single"][0]["loop_cpu_ms_per_sample"] == 1.4  # every round kept


def test_a_threads_cpu_is_read_from_its_own_task() -> None:
    from hapi_bench.micro._wrk import cpu_seconds, thread_cpu_seconds

    end = time.process_time() + 0.05
    while time.process_time() < end:  # some CPU on this (the main) thread
        pass
    own = thread_cpu_seconds(os.getpid())
    assert 0 < own <= cpu_seconds(os.getpid()) + 0.02  # one thread of the process's total


def test_a_baseline_tree_imports_hapi_from_the_other_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "gateway").mkdir(parents=True)
    (checkout / "gateway" / "__init__.py").write_text("WHERE = 'baseline'\n")
    (checkout / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"hapi.gateway" = "gateway"\n'
    )
    tree = baseline_tree(checkout, tmp_path / "tree")
    found = subprocess.run(
        [sys.executable, "-c", "import hapi.gateway as g; print(g.WHERE, g.__file__)"],
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert found[0] == "baseline" and found[1].startswith(str(tree))


def test_a_baseline_without_a_mapped_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"hapi.gateway" = "gateway"\n'
    )
    with pytest.raises(BenchError, match=r"no folder gateway for hapi\.gateway"):
        baseline_tree(tmp_path, tmp_path / "tree")
