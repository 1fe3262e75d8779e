"""``--storage-competitor`` and ``--storage-device``: from the flag to the config, the tier's
gateway, results.json and the report."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hapi.models import cuda_usable
from hapi_bench._cli import _config, bench
from hapi_bench.reports._report import _run_line
from hapi_bench.testbed._competitor import competitor_command
from hapi_bench.testbed._config import BenchConfig
from hapi_bench.testbed._tier import TierSpec, main_gateway_settings
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


def test_the_storage_device_reaches_the_tiers_gateway(tmp_path: Path) -> None:
    assert _config(True, tmp_path, CLI_OPTIONS).storage_device == "cpu"
    config = _config(False, tmp_path, {**CLI_OPTIONS, "storage_device": "cuda"})
    assert config.storage_device == "cuda"
    spec = TierSpec.generate("10.0.0.2", tmp_path, device=config.storage_device)
    assert main_gateway_settings(spec).device == "cuda"
    assert main_gateway_settings(TierSpec.generate("10.0.0.2", tmp_path)).device == "cpu"
    with pytest.raises(ValueError, match="storage_device must be cpu or cuda"):
        BenchConfig(out=tmp_path, storage_device="tpu")  # type: ignore[arg-type]


@pytest.mark.skipif(cuda_usable(), reason="the machine has a usable GPU")
def test_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = CliRunner().invoke(
        bench, ["--quick", "--storage-device", "cuda", "--out", str(tmp_path)]
    )
    assert done.exit_code == 2
    assert done.output.strip().splitlines()[-1] == (
        "Error: --storage-device cuda: onnxruntime finds no usable CUDA GPU here"
    )
    assert not list(tmp_path.iterdir())  # refused before anything ran


def test_the_run_line_says_where_the_storage_blocks_ran() -> None:
    meta = _meta(False)
    meta["machine"]["storage_device"] = "cuda"  # type: ignore[index]
    assert "storage on CPU 1 with its blocks on the GPU" in _run_line(meta)[0]
    assert "GPU" not in _run_line(_meta(False))[0]
