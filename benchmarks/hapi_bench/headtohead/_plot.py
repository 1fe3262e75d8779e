"""The head-to-head's figure: epoch time per configuration, cell by cell, per model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from ._loaders import CONFIGS
from ._results import Cell


def plot(path: Path, cells: Sequence[Cell]) -> Path:
    """Bars of the warm epoch time (cold as a dot) per configuration; one panel per model;
    log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    models = list(dict.fromkeys(c.model for c in cells))
    fig, axes = plt.subplots(len(models), 1, figsize=(11, 3.6 * len(models)), squeeze=False)
    width = 0.8 / len(CONFIGS)
    for ax, name in zip(axes[:, 0], models, strict=True):
        mine = [c for c in cells if c.model == name]
        for index, config in enumerate(CONFIGS):
            xs = [i + (index - (len(CONFIGS) - 1) / 2) * width for i in range(len(mine))]
            results = [c.config(config) for c in mine]
            bars = ax.bar(xs, [r.warm_s for r in results], width, label=f"{config} (warm)")
            ax.plot(xs, [r.cold_s for r in results], "o", color=bars[0].get_facecolor(), ms=4)
        ax.set_xticks(range(len(mine)), [f"{c.bandwidth}\n{c.load}" for c in mine])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))
        ax.set_ylabel("epoch s (dot: cold)")
        ax.set_title(f"{name}: {mine[0].samples} samples per epoch")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _two_and_five(value: float, _: int) -> str:
    """A log axis's minor label at 2 and 5 times a power of ten only (every one of them
    labelled ran together: "8.00 9.00 10.00")."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
    return f"{value:g}" if mantissa in (2.0, 5.0) else ""
