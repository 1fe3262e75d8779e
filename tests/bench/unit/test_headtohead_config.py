"""``hapi-bench headtohead``'s options: every field of the configuration has one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hapi_bench.headtohead._cli import config_from, parser
from hapi_bench.headtohead._config import HeadToHeadConfig

FLAGS = {
    "models": ("--models", "efficientnet_lite0", ("efficientnet_lite0",)),
    "bandwidths": ("--bandwidths", "1gbit,unshaped", ("1gbit", "unshaped")),
    "loads": ("--loads", "loaded", ("loaded",)),
    "samples": ("--samples", "64", 64),
    "held_out": ("--held-out", "8", 8),
    "epochs": ("--epochs", "4", 4),
    "batch_size": ("--batch-size", "8", 8),
    "workers": ("--workers", "3", 3),
    "prefetch_factor": ("--prefetch-factor", "2", 2),
    "seed": ("--seed", "7", 7),
    "niceness": ("--nice", "-5", -5),
    "cache_split": ("--cache-split", "auto", "auto"),
    "dtype": ("--dtype", "float16", "float16"),
    "encoding": ("--encoding", "dense", "dense"),
}


def test_every_field_reaches_the_command_line(tmp_path: Path) -> None:
    fields = {f.name for f in dataclasses.fields(HeadToHeadConfig)} - {"out"}
    assert fields == set(FLAGS)
    for name, (flag, text, value) in FLAGS.items():
        config = config_from(parser().parse_args(["--out", str(tmp_path), flag, text]))
        assert getattr(config, name) == value, name
        assert config.out == tmp_path


def test_quick_is_small_and_options_apply_over_it(tmp_path: Path) -> None:
    config = config_from(parser().parse_args(["--quick", "--epochs", "3"]))
    assert config.models == ("resnet18",) and config.samples == 48 and config.epochs == 3


@pytest.mark.parametrize(
    "changes",
    [
        {"models": ("nope",)},
        {"bandwidths": ("2mbit",)},
        {"loads": ()},
        {"epochs": 1},
        {"samples": 4},
        {"cache_split": "sometimes"},
        {"dtype": "int8"},
        {"encoding": "gzip"},
    ],
)
def test_bad_configurations_are_refused(tmp_path: Path, changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(HeadToHeadConfig(out=tmp_path), **changes)  # type: ignore[arg-type]


def test_the_default_cells_are_the_four_bandwidths_clusters_have(tmp_path: Path) -> None:
    config = config_from(parser().parse_args(["--out", str(tmp_path)]))
    assert config.bandwidths == ("10mbit", "100mbit", "1gbit", "unshaped")
    slow = config_from(parser().parse_args(["--out", str(tmp_path), "--bandwidths", "5mbit"]))
    assert slow.bandwidths == ("5mbit",)
