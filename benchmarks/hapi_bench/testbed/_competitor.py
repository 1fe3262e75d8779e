"""A CPU-bound process competing with the storage tier for its core.

The planner must pick well on a loaded storage side too (issue: picks under load). With
``--storage-competitor`` the sweep runs with a busy loop pinned to the storage tier's
core at the tiers' niceness, from the testbed's start to its end, so every profile and
every run sees the same competition.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hapi_bench.testbed._tier import cpu_seconds

BUSY_LOOP = "while True: pass"


def competitor_command(cpu: int, niceness: int) -> list[str]:
    """The competitor's command line: a Python busy loop on ``cpu`` at ``niceness``."""
    return ["taskset", "-c", str(cpu), "nice", "-n", str(niceness), sys.executable, "-c", BUSY_LOOP]


@contextmanager
def storage_competitor(cpu: int, niceness: int, phases: dict[str, float]) -> Iterator[int]:
    """Run the competitor for the block; yields its pid and records its CPU seconds
    in ``phases["competitor_cpu_s"]`` when it stops."""
    process = subprocess.Popen(
        competitor_command(cpu, niceness),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process.pid
    finally:
        phases["competitor_cpu_s"] = round(cpu_seconds([process.pid]), 2)
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
