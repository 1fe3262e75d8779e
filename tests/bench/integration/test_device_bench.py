"""``make bench-device`` runs end to end (``--device cpu`` here: CI has no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hapi_bench.micro._device import BATCHES, main

pytestmark = pytest.mark.slow


def test_the_device_bench_writes_its_figures(tmp_path: Path) -> None:
    main(["--device", "cpu", "--models", "alexnet", "--repeats", "1", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "bench-device.json").read_text())
    assert results["device"] == "cpu" and results["memory_budget"]["source"] == "configured (CPU)"
    model = results["models"]["alexnet"]
    assert [row["split"] for row in model["splits"]][-1] == model["freeze"]
    for row in model["splits"]:
        # CPU against CPU: the same kernels, so no error either way
        assert row["fidelity"] == {"tf32_on": 0.0, "tf32_off": 0.0}
        assert sorted(int(b) for b in row["samples_per_s"]) == list(BATCHES)
        assert all(rate > 0 for rate in row["samples_per_s"].values())
    division = model["division"]
    for shares in (division["profile_shares"], division["alone_shares"]):
        assert len(shares) == model["freeze"] and sum(shares) == pytest.approx(1.0)
    assert "| alexnet |" in (tmp_path / "bench-device.md").read_text()
