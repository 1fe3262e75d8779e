"""The host a benchmark runs on: its CPU's name, and how busy its cores are."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (results name the host they were measured on)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def busy_seconds(stat: Path = Path("/proc/stat")) -> float:
    """CPU seconds the whole machine has spent busy (not idle or waiting for I/O) since
    boot, summed over its cores."""
    fields = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
