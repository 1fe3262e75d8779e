"""``hapi bench``: the two-tier testbed, from the command line.

Exit codes: 0 done (targets are reported, not enforced), 1 the benchmark failed,
2 this machine cannot host the testbed or bad options (one line on stderr),
130 interrupted (after the testbed is torn down).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import click

from hapi.models.cli import UserError
from hapi_bench.core._errors import BenchError, TestbedUnavailable
from hapi_bench.reports._results import RunResult
from hapi_bench.testbed._config import REGIMES, BenchConfig

DEFAULT_OUT = Path("bench-results") / "testbed"
Runner = Callable[[BenchConfig, Any], tuple[list[Any], dict[str, Any]]]


class RichProgress:
    """Progress bars and one line per run, with rich."""

    def __init__(self, console: Any) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task: Any = None

    def log(self, message: str) -> None:
        self.bar.console.print(message)

    def run(self, label: str, total: int) -> Callable[[int], None]:
        self._task = self.bar.add_task(label, total=total)
        task = self._task
        return lambda count: self.bar.advance(task, count)

    def done(self, result: RunResult) -> None:
        if self._task is not None and result.measured:
            self.bar.remove_task(self._task)
            self._task = None
        if result.measured:
            self.log(
                f"  {result.label:<16} {result.epoch_s:7.2f} s  {result.samples_per_s:6.1f}/s  "
                f"{result.bytes_per_sample / 1000:8.1f} KB/sample  stall {result.stall_s:5.2f} s  "
                f"bottleneck {result.bottleneck}, efficiency {result.efficiency or 0:.2f}"
            )
        else:
            self.log(f"  {result.label:<16} >= {result.epoch_s:.1f} s (link bound, not run)")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP interrupt, so the same teardown runs. SIGINT is handled
    explicitly too: a background job of a non-interactive shell (a CI script) starts with
    it ignored, and Python then never turns it into KeyboardInterrupt."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _csv(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(p.strip() for p in text.split(",") if p.strip())


def _integers(text: str | None, option: str) -> tuple[int, ...] | None:
    try:
        return None if (parts := _csv(text)) is None else tuple(int(p) for p in parts)
    except ValueError:
        raise UserError(f"{option} takes integers, not {text!r}") from None


def _config(quick: bool, out: Path, options: dict[str, Any]) -> BenchConfig:
    """The run's configuration: ``--quick`` or the default, with the options given."""
    base = BenchConfig.quick(out) if quick else BenchConfig(out=out)
    changes: dict[str, Any] = {
        "models": _csv(options["models"]),
        "regimes": _csv(options["regimes"]),
        "seconds": options["seconds"],
        "splits": _integers(options["splits"], "--splits"),
        "storage_batch": options["storage_batch"],
        "storage_competitor": options["storage_competitor"] or None,
        "storage_device": options.get("storage_device"),
        "niceness": options["nice"],
        "bound_factor": 0.0 if options["full_sweep"] else None,
        "epochs": options.get("epochs"),
        "sweep_jobs": options.get("sweep_jobs"),
        "repeats": options.get("repeats"),
    }
    try:
        return dataclasses.replace(base, **{k: v for k, v in changes.items() if v is not None})
    except ValueError as exc:
        raise UserError(str(exc)) from exc


@click.command("bench", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="One model, two bandwidths, short epochs (~1-2 min).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="Results directory (JSON, markdown, PNG plots, logs).",
)
@click.option(
    "--models",
    help="Comma-separated model families [default: resnet18,resnet50,vgg11,efficientnet_lite0].",
)
@click.option("--regimes", help=f"Comma-separated, of: {', '.join(REGIMES)} [default: all].")
@click.option("--seconds", type=float, help="Target epoch seconds of a compute-bound baseline.")
@click.option(
    "--full-sweep", is_flag=True, help="Run every split, even those the link bound rules out."
)
@click.option(
    "--splits", help="Measure only these splits, comma-separated (plus baseline and the pick)."
)
@click.option(
    "--storage-batch",
    type=click.IntRange(min=1),
    help="Fixed storage-side batch size for the gateway [default: its adaptive batching].",
)
@click.option(
    "--storage-competitor",
    is_flag=True,
    help="Run a CPU-bound busy loop on the storage tier's core for the whole sweep.",
)
@click.option(
    "--storage-device",
    type=click.Choice(["cpu", "cuda"]),
    help="Where the storage tier's gateway runs blocks: its core, or onnxruntime's CUDA "
    "provider (decoding and HTTP stay on its core) [default: cpu].",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    help="Epochs of each contender of a cell (the pick, the baseline, the SDK without "
    "pushdown, every run within 15% of the best), in interleaved rounds; the median "
    "counts (the faster of two). With --epochs: the interleaved pairs of an epoch without "
    "the cache and a cold one with it, whose median ratio is the cold overhead (at least "
    "2) [default: 3; 2 with --quick].",
)
@click.option(
    "--nice",
    type=click.IntRange(-20, 19),
    help="Niceness of both tiers; negative puts the benchmark ahead of other work [default: 0].",
)
@click.option(
    "--epochs",
    type=click.IntRange(min=2),
    help="The cache scenario instead of the split sweep: per cell, this many epochs of the "
    "baseline, of one split (the first of --splits, else the planner's) without the feature "
    "cache, with the gateway's cache (emptied, so epoch 1 is cold) and with the SDK's "
    "client-side cache; writes epochs.md, epochs.json and epochs.png.",
)
@click.option(
    "--sweep-jobs",
    type=click.IntRange(min=0),
    help="With --epochs: also this many jobs one after another, each training its own head "
    "for --epochs epochs on the same backbone and objects, per cache and without one; "
    "0 for none [default: 4].",
)
def bench(quick: bool, out: Path, **options: Any) -> None:
    """Two-tier testbed: hapi pushdown against raw objects over a shaped link.

    Needs root (a network namespace, a veth pair, tc tbf), iproute2 and taskset, and two
    CPU cores. Writes results.json, results.md and PNG plots to --out; with --epochs N,
    the feature cache's scenario instead (epochs.json, epochs.md, epochs.png): cold and
    warm epochs, the cold epoch's overhead, and a sweep of several heads.
    """
    from hapi_bench.testbed._preflight import check_environment

    config = _config(quick, out, options)
    if config.storage_device == "cuda":
        from hapi.models import cuda_usable

        if not cuda_usable():
            raise UserError("--storage-device cuda: onnxruntime finds no usable CUDA GPU here")
    try:
        check_environment()
    except TestbedUnavailable as exc:
        raise UserError(str(exc)) from exc
    if config.epochs:
        from hapi_bench.epochs._epochs import run_epochs

        cache_cells, meta = _execute(config, run_epochs)
        _report_epochs(config, cache_cells, meta)
        return
    cells, meta = _execute(config)
    _report(config, cells, meta)


def _execute(config: BenchConfig, runner: Runner | None = None) -> tuple[list[Any], dict[str, Any]]:
    from rich.console import Console

    from hapi_bench.testbed._run import run_bench

    console = Console(stderr=True)
    progress = RichProgress(console)
    try:
        with signals_interrupt(), progress.bar:
            return (runner or run_bench)(config, progress)
    except TestbedUnavailable as exc:
        raise UserError(str(exc)) from exc
    except BenchError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        console.print("interrupted: the testbed is torn down (namespace and processes removed)")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # prefetch threads may still wait on dead sockets; nothing is left to clean


def _report(config: BenchConfig, cells: list[Any], meta: dict[str, Any]) -> None:
    from hapi_bench.reports import _plot, _report

    written = _report.write(config.out, cells, meta)
    written += _plot.plot_all(config.out, cells)
    click.echo(_report.summary_text(cells))
    median = _report.median_efficiency(cells)
    if median is not None:
        click.echo(f"- median pipeline efficiency over every measured run: {median:.2f}")
    click.echo(
        f"\n{meta['phases']['total_s']:.0f} s in all; wrote " + ", ".join(str(p) for p in written)
    )


def _report_epochs(config: BenchConfig, cells: list[Any], meta: dict[str, Any]) -> None:
    from hapi_bench.epochs import _epochs_report

    written = _epochs_report.write(config.out, cells, meta)
    click.echo(_epochs_report.summary_text(cells))
    click.echo(
        f"\n{meta['phases']['total_s']:.0f} s in all; wrote " + ", ".join(str(p) for p in written)
    )
