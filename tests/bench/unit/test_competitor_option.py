"""``--storage-competitor``: from the flag to the config, results.json and the report."""

from __future__ import annotations

from pathlib import Path

from hapi.bench._cli import _config
from hapi.bench._competitor import competitor_command
from hapi.bench._report import _run_line
from tests.bench.support import CLI_OPTIONS


def test_the_flag_reaches_the_config_quick_or_not(tmp_path: Path) -> None:
    assert _config(True, tmp_path, {**CLI_OPTIONS, "storage_competitor": True}).storage_competitor
    assert _config(False, tmp_path, {**CLI_OPTIONS, "storage_competitor": True}).storage_competitor
    assert not _config(
        True, tmp_path, {**CLI_OPTIONS, "storage_competitor": False}
    ).storage_competitor


def test_the_competitor_is_pinned_to_the_storage_core_at_the_tiers_niceness() -> None:
    command = competitor_command(1, -10)
    assert command[:6] == ["taskset", "-c", "1", "nice", "-n", "-10"]


def _meta(competitor: bool) -> dict[str, object]:
    return {
        "date": "2026-11-23 01:00:00 UTC",
        "machine": {
            "cpu": "cpu",
            "cores": 2,
            "client_cpu": 0,
            "storage_cpu": 1,
            "niceness": -10,
            "storage_competitor": competitor,
        },
        "phases": {"total_s": 100.0, "competitor_cpu_s": 61.4},
    }


def test_the_run_line_says_when_the_storage_core_was_shared() -> None:
    loaded = _run_line(_meta(True))[0]
    assert "a CPU-bound competitor on CPU 1 used 61 CPU s" in loaded
    assert "competitor" not in _run_line(_meta(False))[0]
