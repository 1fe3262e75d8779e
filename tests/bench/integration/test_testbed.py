"""The real testbed, end to end: a namespace, a shaped veth, both tiers, the report.

Slow (about a minute); needs root, iproute2 and two cores. Whatever happens, no
``hapi-bench-*`` namespace of the run may remain.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
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
MODULE = [sys.executable, "-m", "hapi_bench"]
SMALL = ["--models", "resnet18", "--regimes", "compute-bound", "--splits", "10", "--seconds", "1"]


def _ours(pid: int) -> list[str]:
    return [name for name in namespaces() if name == f"{PREFIX}{pid}"]


def _clean_up(pid: int) -> None:
    """Last resort if the run did not clean up after itself (the test then fails)."""
    for name in _ours(pid):
        subprocess.run(["ip", "netns", "del", name], check=False)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_small_sweep_reports_and_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "results"
    process = subprocess.Popen(
        [*MODULE, *SMALL, "--storage-batch", "2", "--out", str(out)],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        output, _ = process.communicate(timeout=150)
    finally:
        _stop(process)
        left = _ours(process.pid)
        _clean_up(process.pid)
    assert process.returncode == 0, output[-3000:]
    assert left == []
    data = json.loads((out / "results.json").read_text())
    (cell,) = data["cells"]
    runs = {run["label"]: run for run in cell["runs"]}
    assert runs["baseline"]["measured"] and runs["split 10"]["measured"]
    # The epoch is sized from the client rate measured on the spot (about --seconds of
    # compute, at least 12 batches): the count depends on the machine, its shape does not.
    batch, samples = cell["batch_size"], runs["baseline"]["samples"]
    assert samples >= 12 * batch and samples % batch == 0
    assert runs["split 10"]["samples"] == samples
    assert runs["split 10"]["bytes_per_sample"] < runs["baseline"]["bytes_per_sample"] / 5
    assert 0.1e6 < cell["probed_bps"] < 2 * cell["bandwidth_bps"]
    for name in ("results.md", "epoch_vs_split.png", "bytes_per_sample.png"):
        assert (out / name).stat().st_size > 0
    assert "speedup" in output
    tenants = data["meta"]["gateway_stats"]["tenants"]
    assert tenants and {t["max_batch_size"] for t in tenants} == {2}  # --storage-batch reached it


def _wait_for_line(process: subprocess.Popen[str], text: str, timeout: float) -> str:
    """Read the output until a line contains ``text``; returns what was read."""
    assert process.stdout is not None
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"no line with {text!r} in:\n{''.join(seen)[-3000:]}")


@pytest.mark.parametrize("when", ["while the tier starts", "during an epoch"])
def test_an_interrupt_tears_the_testbed_down(tmp_path: Path, when: str) -> None:
    # Started with SIGINT ignored, as a non-interactive shell starts a background job (a CI
    # script): Ctrl-C (here, SIGINT) must still interrupt it.
    process = subprocess.Popen([*MODULE, *SMALL, "--out", str(tmp_path)], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               preexec_fn=_ignore_sigint)  # fmt: skip
    namespace_pids: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not _ours(process.pid) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert _ours(process.pid), "the namespace never appeared"
        if when == "while the tier starts":
            time.sleep(3)
        else:
            _wait_for_line(process, "baseline", timeout=120)  # the first run is done
        namespace_pids = subprocess.run(
            ["ip", "netns", "pids", f"{PREFIX}{process.pid}"], capture_output=True, text=True
        ).stdout.split()
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    finally:
        _stop(process)
        left = _ours(process.pid)
        _clean_up(process.pid)
    assert process.returncode == 130, output[-3000:]
    assert left == []
    assert "torn down" in output
    assert namespace_pids
    assert _running(namespace_pids) == []


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _running(pids: list[str]) -> list[str]:
    """``pids`` that still run (zombies excepted: their parent reaps them), with commands."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(f"{pid} {state} {command}")
    return alive
