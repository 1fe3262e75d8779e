"""What a benchmark run does: an immutable value built once from the command line."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hapi.models.testing import FAMILIES

REGIMES: dict[str, float] = {
    "network-bound": 4.0,
    "balanced": 1.0,
    "compute-bound": 0.25,
}
"""Client compute rate over network rate for raw objects, per regime of the baseline."""

DEFAULT_MODELS = ("resnet18", "resnet50", "vgg11", "efficientnet_lite0")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """A benchmark run.

    Args:
        out: The results directory.
        models: Model families to run, at their default freeze points.
        regimes: Regime names (keys of :data:`REGIMES`).
        seconds: Target epoch seconds for a compute-bound baseline: sizes the dataset
            per model from its measured client rate.
        min_batches: Batches per epoch at least (the pipeline's fill and drain are one
            batch each, so fewer batches would dominate the efficiency figure).
        max_samples: Samples per epoch at most (also the dataset's size).
        bound_factor: Skip a split when the link alone needs more than this many times
            the best epoch measured so far (0: measure every split).
        splits: Measure only these splits (besides the baseline and the planner's pick);
            ``None`` for all.
        storage_batch: The gateway's storage-side batch size; ``None`` for its adaptive
            batching.
        storage_competitor: Run a CPU-bound process on the storage tier's core for the
            whole sweep (a loaded storage side).
        storage_device: Where the storage tier's gateway runs blocks: ``cpu`` or ``cuda``
            (onnxruntime's CUDA provider; its decoding and HTTP stay on its core).
        niceness: Scheduling niceness of both tiers: 0 shares the cores fairly with other
            work on the machine; negative (root only) puts the benchmark ahead of it.
        seed: Dataset seed.
        epochs: With 2 or more, the cache scenario instead of the split sweep: per cell,
            that many epochs of the baseline, of the pick without the feature cache, with
            the gateway's cache (epoch 1 cold) and with the SDK's client-side cache
            (``local_cache``); 0 for the sweep.
        sweep_jobs: In the cache scenario, also this many jobs one after another, each
            training its own head for ``epochs`` epochs on the same backbone and objects,
            with each cache and without (0: none).
        repeats: Epochs of each contender of a cell (the pick, the baseline, the SDK's
            no-pushdown path, every run within 15% of the best), in interleaved rounds;
            the median counts (the faster of two).
    """

    out: Path
    models: tuple[str, ...] = DEFAULT_MODELS
    regimes: tuple[str, ...] = tuple(REGIMES)
    seconds: float = 4.0
    min_batches: int = 12
    max_samples: int = 256
    bound_factor: float = 1.5
    splits: tuple[int, ...] | None = None
    storage_batch: int | None = None
    storage_competitor: bool = False
    storage_device: Literal["cpu", "cuda"] = "cpu"
    niceness: int = 0
    seed: int = 0
    epochs: int = 0
    sweep_jobs: int = 4
    repeats: int = 3

    def __post_init__(self) -> None:
        unknown = [m for m in self.models if m not in FAMILIES]
        if unknown or not self.models:
            raise ValueError(
                f"unknown model {', '.join(unknown) or '(none)'}; known: {', '.join(FAMILIES)}"
            )
        bad = [r for r in self.regimes if r not in REGIMES]
        if bad or not self.regimes:
            raise ValueError(
                f"unknown regime {', '.join(bad) or '(none)'}; known: {', '.join(REGIMES)}"
            )
        if self.seconds <= 0 or self.min_batches < 1 or self.max_samples < 8:
            raise ValueError("seconds must be > 0, min_batches >= 1 and max_samples >= 8")
        if self.bound_factor < 0:
            raise ValueError("bound_factor must be >= 0")
        if not -20 <= self.niceness <= 19:
            raise ValueError("niceness must be in -20..19")
        if self.storage_device not in ("cpu", "cuda"):
            raise ValueError(f"storage_device must be cpu or cuda, not {self.storage_device!r}")
        if self.repeats < 1:
            raise ValueError("repeats must be >= 1")
        if self.epochs == 1 or self.epochs < 0 or self.sweep_jobs < 0:
            raise ValueError("epochs must be 0 (the split sweep) or >= 2; sweep_jobs >= 0")

    @classmethod
    def quick(cls, out: Path) -> BenchConfig:
        """One model, two bandwidths, short epochs: about a minute and a half."""
        return cls(
            out=out,
            models=("resnet18",),
            regimes=("network-bound", "compute-bound"),
            seconds=2.5,
            min_batches=8,
            max_samples=96,
            repeats=2,
        )

    def sizing(self, client_rate: float) -> tuple[int, int]:
        """``(samples, batch_size)`` for a model the client runs at ``client_rate``/s.

        The epoch takes about ``seconds`` when compute-bound, has at least
        ``min_batches`` batches, and at most ``max_samples`` samples.
        """
        wanted = client_rate * self.seconds
        batch = 8 if wanted >= 8 * self.min_batches else 4
        samples = max(batch * self.min_batches, batch * math.ceil(wanted / batch))
        return min(samples, self.max_samples - self.max_samples % batch), batch


def bandwidth_for(ratio: float, client_rate: float, raw_bytes: float) -> float:
    """Bits per second at which raw objects arrive ``ratio`` times slower than the client
    computes (``ratio`` = client compute rate / network rate)."""
    return client_rate / ratio * raw_bytes * 8
