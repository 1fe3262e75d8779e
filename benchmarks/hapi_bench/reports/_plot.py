"""PNG plots: epoch time against split per bandwidth, and bytes per sample per split."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hapi_bench.reports._results import CellResult


def _figure(count: int) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(count, 2)
    rows = (count + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.2 * rows), squeeze=False)
    flat = list(itertools.chain.from_iterable(axes))
    for unused in flat[count:]:
        unused.set_visible(False)
    return fig, flat[:count]


def _integer_splits(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _by_model(cells: Sequence[CellResult]) -> dict[str, list[CellResult]]:
    models: dict[str, list[CellResult]] = {}
    for cell in cells:
        models.setdefault(cell.model, []).append(cell)
    return models


def _epoch_axis(ax: Any, model: str, cells: Sequence[CellResult]) -> None:
    for index, cell in enumerate(cells):
        color = f"C{index}"
        label = f"{cell.bandwidth_bps / 1e6:.3g} Mbit/s ({cell.regime})"
        sweep = sorted((r for r in cell.runs if r.split is not None), key=lambda r: r.split or 0)
        done = [r for r in sweep if r.measured]
        ax.plot([r.split for r in done], [r.epoch_s for r in done], "o-", color=color, label=label)
        bound = [r for r in sweep if not r.measured]
        ax.plot(
            [r.split for r in bound],
            [r.epoch_s for r in bound],
            "^",
            color=color,
            markerfacecolor="none",
            linestyle="none",
        )
        baseline = cell.run(None)
        if baseline is not None:
            ax.axhline(baseline.epoch_s, color=color, linestyle="--", linewidth=1)
        pick = cell.run(cell.pick)
        if pick is not None:
            x = cell.freeze + 0.6 if pick.split is None else pick.split
            ax.plot([x], [pick.epoch_s], "*", color=color, markersize=16, markeredgecolor="black")
    ax.set(
        title=f"{model}: epoch time by split",
        xlabel="split (blocks run on the storage side)",
        ylabel="epoch seconds (log)",
        yscale="log",
    )
    _integer_splits(ax)
    ax.legend(fontsize=7, title="-- baseline, * planner pick, ^ link bound", title_fontsize=7)


def plot_epoch_times(path: Path, cells: Sequence[CellResult]) -> Path:
    """Epoch time against split, one panel per model, one line per bandwidth."""
    models = _by_model(cells)
    fig, axes = _figure(len(models))
    for ax, (model, group) in zip(axes, models.items(), strict=True):
        _epoch_axis(ax, model, group)
    _save(fig, path)
    return path


def _bytes_axis(ax: Any, model: str, cells: Sequence[CellResult]) -> None:
    first = cells[0]
    splits = list(range(len(first.wire_bytes)))
    ax.plot(
        splits,
        [b / 1000 for b in first.wire_bytes],
        "o-",
        color="C0",
        label="features (payload, from the manifest)",
    )
    for index, cell in enumerate(cells):
        done = [r for r in cell.runs if r.measured and r.split is not None]
        ax.plot(
            [r.split for r in done],
            [r.bytes_per_sample / 1000 for r in done],
            "x",
            color=f"C{index + 1}",
            label=f"on the link at {cell.bandwidth_bps / 1e6:.3g} Mbit/s",
        )
    ax.axhline(
        first.raw_bytes / 1000,
        color="black",
        linestyle="--",
        linewidth=1,
        label="baseline: mean JPEG",
    )
    ax.set(
        title=f"{model}: bytes per sample",
        xlabel="split",
        ylabel="KB per sample (log)",
        yscale="log",
    )
    _integer_splits(ax)
    ax.legend(fontsize=7)


def plot_bytes(path: Path, cells: Sequence[CellResult]) -> Path:
    """Bytes per sample at each split against the raw objects, one panel per model."""
    models = _by_model(cells)
    fig, axes = _figure(len(models))
    for ax, (model, group) in zip(axes, models.items(), strict=True):
        _bytes_axis(ax, model, group)
    _save(fig, path)
    return path


def plot_all(out: Path, cells: Sequence[CellResult]) -> list[Path]:
    """Both plots into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_epoch_times(out / "epoch_vs_split.png", cells),
        plot_bytes(out / "bytes_per_sample.png", cells),
    ]
