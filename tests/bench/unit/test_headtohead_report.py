"""The head-to-head's report: the table, the goals, the projection; JSON both ways."""

from __future__ import annotations

from pathlib import Path

from hapi_bench.headtohead._loaders import CONFIGS, HAPI, HAPI_CACHE, S3TORCH
from hapi_bench.headtohead._report import goals, link_bound, render, table
from hapi_bench.headtohead._results import Cell, ConfigResult, Epoch, read_json, write_json

SAMPLES = 100


def _result(
    config: str, seconds: tuple[float, ...], link_bytes: int, split: int | None = None
) -> ConfigResult:
    epochs = tuple(
        Epoch(
            epoch=i + 1,
            epoch_s=s,
            samples=SAMPLES,
            link_bytes=link_bytes * SAMPLES,
            client_cpu_s=s / 2,
            storage_cpu_s=s / 5,
        )
        for i, s in enumerate(seconds)
    )
    return ConfigResult(
        config=config, epochs=epochs, accuracy=0.75, split=split, split_reason="why"
    )


def _cell(bandwidth: str, bps: float | None, hapi_s: float, warm_s: float) -> Cell:
    configs = {
        S3TORCH: _result(S3TORCH, (10.0, 10.0, 10.0), 30_000),
        "s3torch-gateway": _result("s3torch-gateway", (10.5, 10.0, 10.2), 30_000),
        HAPI: _result(HAPI, (hapi_s, hapi_s, hapi_s), 2_000, split=10),
        HAPI_CACHE: _result(HAPI_CACHE, (hapi_s, warm_s, warm_s), 2_000, split=10),
    }
    return Cell(
        model="resnet18",
        bandwidth=bandwidth,
        bandwidth_bps=bps,
        load="quiet",
        samples=SAMPLES,
        batch_size=16,
        configs=tuple(configs[name] for name in CONFIGS),
        same_samples=None,
    )


def test_the_table_has_a_row_per_configuration_with_its_figures() -> None:
    text = table([_cell("10mbit", 10e6, 2.5, 0.5)])
    lines = text.splitlines()
    assert len(lines) == 2 + len(CONFIGS)
    hapi_row = next(line for line in lines if "| hapi |" in line)
    # cold 2.5 s, warm 2.5 s, 40 samples/s, 2 KB, 1.25 s / 100 = 12.5 ms of client CPU,
    # 0.5 s / 100 = 5 ms of storage CPU, 4x the contender cold and warm.
    assert "| 10 | 2.50 | 2.50 | 40.0 | 2.0 | 12.5 | 5.0 | 0.75 | 4.00 | 4.00 |" in hapi_row


def test_goals_are_met_or_missed_per_cell() -> None:
    # 30 kB * 100 * 8 / 0.25 Mbit/s = 96 s >= 80% of 10 s: link-bound.
    slow_link = _cell("slow", 0.25e6, 2.5, 0.5)
    assert link_bound(slow_link)
    assert goals(slow_link) == [
        "hapi 4.00x the contender (met: >= 0.95)",
        "link-bound: met (>= 3x)",
        "cache warm 20.0x (met: >= 10x)",
    ]
    unshaped = _cell("unshaped", None, 11.0, 5.0)
    assert not link_bound(unshaped)
    assert goals(unshaped) == [
        "hapi 0.91x the contender (MISSED: >= 0.95)",
        "cache warm 2.0x (MISSED: >= 10x)",
    ]


def test_the_report_projects_and_checks_the_model_against_every_cell() -> None:
    cells = [_cell("10mbit", 10e6, 2.5, 0.5), _cell("unshaped", None, 3.0, 0.5)]
    text = render(cells, {"description": "synthetic"})
    assert "| resnet18 | GPU node" in text
    assert "| resnet18 | CPU node, 32 cores | 100 Gbit/s | 512 |" in text
    assert f"The model against every measured cell ({2 * len(CONFIGS)} epoch series" in text
    assert "| resnet18 unshaped quiet hapi |" in text


def test_results_survive_json(tmp_path: Path) -> None:
    cells = [_cell("10mbit", 10e6, 2.5, 0.5)]
    path = write_json(tmp_path / "h.json", cells, {"date": "now"})
    again, meta = read_json(path)
    assert again == cells
    assert meta == {"date": "now"}


def test_the_command_renders_a_results_file_again_with_device_figures(tmp_path: Path) -> None:
    import json

    from hapi_bench.headtohead._cli import main

    results = write_json(tmp_path / "in.json", [_cell("unshaped", None, 3.0, 0.5)], {"total_s": 1})
    device = tmp_path / "bench-device.json"
    rows = [{"split": 10, "samples_per_s": {"64": 7_000.0}}]
    device.write_text(json.dumps({"device": "cuda", "models": {"resnet18": {"splits": rows}}}))
    main(["--from-json", str(results), "--device-json", str(device), "--out", str(tmp_path / "o")])
    text = (tmp_path / "o" / "headtohead.md").read_text()
    assert "blocks 7,000/s (measured, split 10)" in text
    assert (tmp_path / "o" / "headtohead.png").stat().st_size > 0
    assert not (tmp_path / "o" / "headtohead.json").exists()


def test_a_failed_loader_is_reported_with_the_gateways_5xx_answers_and_refusals() -> None:
    from hapi_bench.headtohead._run import refusals

    metrics = "\n".join(
        [
            "# HELP hapi_requests_total Requests handled, by S3 operation and status.",
            'hapi_requests_total{operation="GetObject",status="200"} 5120.0',
            'hapi_requests_total{operation="GetObject",status="503"} 3.0',
            'hapi_requests_total{operation="PutObject",status="500"} 0.0',
            'hapi_requests_total{operation="GetObject",status="404"} 2.0',
            'hapi_identity_limited_total{identity="c",bound="upstream"} 3.0',
            'hapi_upstream_errors_total{kind="reset"} 1.0',
            'hapi_upstream_errors_total{kind="timeout"} 1.5e+06',  # how large counts print
            'hapi_pushdown_rate_limited_total{identity="c"} 0.0',
            "hapi_cache_writes_pending 0.0",
        ]
    )
    assert refusals(metrics) == [
        'hapi_requests_total{operation="GetObject",status="503"}=3',
        'hapi_identity_limited_total{identity="c",bound="upstream"}=3',
        'hapi_upstream_errors_total{kind="reset"}=1',
        'hapi_upstream_errors_total{kind="timeout"}=1.5e+06',
    ]
    assert refusals('hapi_requests_total{operation="GetObject",status="200"} 9.0') == []


def test_the_log_axis_labels_its_minor_ticks_at_two_and_five_only() -> None:
    from hapi_bench.headtohead._plot import _two_and_five

    ticks = (0.2, 0.3, 0.5, 0.7, 2.0, 3.0, 5.0, 8.0, 9.0, 20.0, 50.0)
    shown = {v: _two_and_five(v, 0) for v in ticks}
    assert [v for v, text in shown.items() if text] == [0.2, 0.5, 2.0, 5.0, 20.0, 50.0]
    assert shown[0.5] == "0.5" and shown[20.0] == "20" and _two_and_five(0.0, 0) == ""


def test_the_report_says_which_models_ran_with_random_weights() -> None:
    cells = [_cell("10mbit", 10e6, 5.0, 0.5)]
    said = render(
        cells,
        {"weights": {"resnet18": "random(seed=0)", "efficientnet_lite0": "pkg==0.1.0"}},
    )
    assert "resnet18: random(seed=0); efficientnet_lite0: pkg==0.1.0" in said
    assert "resnet18 runs with random weights" in said
    assert "efficientnet_lite0 runs" not in said
    real = render(cells, {"weights": {"efficientnet_lite0": "pkg==0.1.0"}})
    assert "Weights: efficientnet_lite0: pkg==0.1.0." in real and "random" not in real
    assert "Weights:" not in render(cells, {})  # a run that recorded none
