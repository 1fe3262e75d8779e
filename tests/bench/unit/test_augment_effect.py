"""``hapi-bench augment``'s pure parts: the summary over seeds, the table, the plot, options.

The experiment itself runs against a real store and gateway (``make bench-augment``); its
figures are in docs/results.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from hapi_bench.epochs import _augment_effect as augment

PNG = b"\x89PNG\r\n\x1a\n"


def _run(
    config: str, seed: int, accuracy: float, seconds: list[float], hits: list[int]
) -> augment.Run:
    return augment.Run(
        config=config,
        seed=seed,
        accuracy=accuracy,
        epoch_seconds=seconds,
        bytes_per_epoch=[1000] * len(seconds),
        gateway_hits=hits,
        requests=[4] * len(seconds),
    )


def _runs() -> list[augment.Run]:
    return [
        _run("none", 0, 0.9, [4.0, 0.5, 0.5, 0.5], [0, 4, 4, 4]),
        _run("none", 1, 0.8, [3.0, 0.7, 0.5, 0.5], [0, 4, 4, 4]),
        _run("K=2", 0, 0.7, [4.0, 4.0, 0.5, 0.5], [0, 0, 4, 4]),
        _run("K=2", 1, 0.75, [5.0, 3.0, 0.6, 0.4], [0, 0, 4, 4]),
    ]


def test_the_summary_is_per_configuration_over_seeds() -> None:
    summary = augment.summary(_runs())

    assert list(summary) == ["none", "K=2"]  # in CONFIGS' order, only those run
    assert summary["none"]["accuracy_mean"] == pytest.approx(0.85)
    assert (summary["none"]["accuracy_min"], summary["none"]["accuracy_max"]) == (0.8, 0.9)
    assert summary["none"]["first_epoch_s"] == pytest.approx(3.5)
    assert summary["none"]["later_epoch_s"] == pytest.approx(0.5)
    # K=2: epochs 3 and 4 of each seed hit, 16 of 32 requests; none: epochs 2-4, 24 of 32.
    assert summary["K=2"]["cache_hit_share"] == pytest.approx(0.5)
    assert summary["none"]["cache_hit_share"] == pytest.approx(0.75)


def test_the_report_and_the_plot(tmp_path: Path) -> None:
    runs = _runs()
    results = {
        "model": "efficientnet_lite0",
        "split": 19,
        "policy": augment.POLICY,
        "dataset": "digits",
        "train_per_class": 20,
        "test_per_class": 50,
        "raw_train_bytes": 729_000,
        "epochs": 4,
        "batch_size": 16,
        "seeds": 2,
        "runs": [asdict(r) for r in runs],
        "summary": augment.summary(runs),
    }
    text = augment.markdown(results)
    assert "| none | 0.850 (0.800-0.900) | 3.50 | 0.50 | 1 | 75% |" in text
    assert "| K=2 | 0.725 (0.700-0.750) |" in text
    image = augment.plot(tmp_path / "augment.png", results).read_bytes()
    assert image.startswith(PNG) and len(image) > 5_000
    # --from-json renders the same files again without running anything
    (tmp_path / "augment.json").write_text(json.dumps(results))
    augment.main(["--from-json", str(tmp_path / "augment.json")])
    assert (tmp_path / "augment.md").read_text() == text


@pytest.mark.parametrize(
    "argv", [["--seeds", "0"], ["--epochs", "3"], ["--policy", "crop(scale=2:3)"]]
)
def test_bad_options_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        augment.main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("hapi-bench augment:")
