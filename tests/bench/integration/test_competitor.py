"""The storage competitor really runs on the core it is given, and stops with its block."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from hapi_bench.testbed._competitor import BUSY_LOOP, storage_competitor


def _running_the_loop(pid: int, within_s: float = 10.0) -> bool:
    """Whether ``pid`` has become the busy loop (taskset and nice exec into it; their
    own command lines hold the loop's text too, so argv[0] tells them apart)."""
    tick = threading.Event()
    for _ in range(int(within_s / 0.05)):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[0] == sys.executable.encode() and BUSY_LOOP.encode() in argv:
            return True
        tick.wait(0.05)
    return False


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_the_competitor_runs_pinned_and_stops_at_the_end() -> None:
    cpu = max(os.sched_getaffinity(0))
    phases: dict[str, float] = {}
    with storage_competitor(cpu, 0, phases) as pid:
        assert _running_the_loop(pid)
        assert os.sched_getaffinity(pid) == {cpu}
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped
    assert phases["competitor_cpu_s"] >= 0
