"""``hapi bench --epochs``, end to end on the real testbed: both caches emptied before each
cold epoch, warm epochs served from them, the second gateway without a cache, the sweep.

Slow (two to five minutes, with the machine's load); needs root, iproute2 and two cores. No ``hapi-bench-*``
namespace of the run may remain.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hapi_bench.testbed._netns import PREFIX, namespaces

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0
        or not all(shutil.which(t) for t in ("ip", "tc", "taskset"))
        or len(os.sched_getaffinity(0)) < 2,
        reason="needs root, ip, tc, taskset and two cores",
    ),
]
SMALL = [
    "--quick", "--regimes", "compute-bound", "--splits", "10", "--seconds", "0.5",
    "--storage-batch", "2", "--epochs", "2", "--sweep-jobs", "1",
]  # fmt: skip


def _runs(cell: dict[str, object], config: str) -> list[dict[str, float]]:
    runs = cell["runs"]
    assert isinstance(runs, list)
    return [run for run in runs if run["config"] == config]


def _stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM first: the run then tears its tier down (a SIGKILL would orphan it)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.timeout(600)
def test_cold_and_warm_epochs_with_each_cache(tmp_path: Path) -> None:
    out = tmp_path / "results"
    process = subprocess.Popen(
        [sys.executable, "-m", "hapi_bench", *SMALL, "--out", str(out)],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        output, _ = process.communicate(timeout=480)
    finally:
        _stop(process)
        left = [name for name in namespaces() if name == f"{PREFIX}{process.pid}"]
        for name in left:
            subprocess.run(["ip", "netns", "del", name], check=False)
    assert process.returncode == 0, output[-3000:]
    assert left == []
    data = json.loads((out / "epochs.json").read_text())
    (cell,) = data["cells"]
    assert cell["split"] == 10
    baseline = _runs(cell, "baseline")
    assert [r["epoch"] for r in baseline] == [1, 2]
    # Without the cache, nothing is ever a hit.
    assert [r["gateway_hit_ratio"] for r in _runs(cell, "no cache")] == [0.0, 0.0]
    gateway = _runs(cell, "gateway cache")
    assert [(r["repeat"], r["epoch"]) for r in gateway] == [(1, 1), (1, 2), (2, 1)]
    # Each cold epoch starts from an emptied cache; the warm one finds every entry.
    assert [r["gateway_hit_ratio"] for r in gateway] == [0.0, 1.0, 0.0]
    client = _runs(cell, "client cache")
    assert [r["local_hit_ratio"] for r in client] == [0.0, 1.0]
    assert client[0]["gateway_hit_ratio"] == 0.0
    assert client[1]["link_bytes"] < client[0]["link_bytes"] / 10  # no features crossed
    sweep = cell["sweep"]
    assert sweep["jobs"] == 1 and set(sweep["total_s"]) == {
        "no cache",
        "gateway cache",
        "client cache",
    }
    assert all(len(jobs) == 1 for jobs in sweep["job_s"].values())
    for name in ("epochs.md", "epochs.png"):
        assert (out / name).stat().st_size > 0
    assert "cold epoch overhead" in output
