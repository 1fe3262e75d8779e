"""What the cache scenario records (``hapi bench --epochs N``), and its figures.

Per cell (one model at one bandwidth, one split), four configurations run ``N`` epochs
each, or one for the configuration without a cache:

- ``baseline``: raw objects, every frozen block on the client;
- ``no cache``: the split through a gateway whose feature cache is off;
- ``gateway cache``: the split through the gateway with its cache, emptied before
  epoch 1 (cold; later epochs read the entries epoch 1 wrote);
- ``client cache``: the same with the SDK's ``local_cache`` as well, both emptied before
  epoch 1 (later epochs read the features from the training machine's disk).

Pure values, JSON both ways, so the report and the plot can be tested without a testbed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

BASELINE = "baseline"
UNCACHED = "no cache"
GATEWAY = "gateway cache"
CLIENT = "client cache"
CONFIGS = (BASELINE, UNCACHED, GATEWAY, CLIENT)


@dataclass(frozen=True, kw_only=True)
class EpochRun:
    """One measured epoch of one configuration.

    Args:
        config: One of :data:`CONFIGS`.
        epoch: 1 for the first (cold) epoch of a series, then 2, 3...
        repeat: Which series of ``config`` it belongs to (the cold epoch and the run
            without a cache are measured twice, interleaved; the faster counts).
        epoch_s: Wall time of the epoch.
        samples: Samples in the epoch.
        link_bytes: Bytes the client's end of the link received.
        head_s: Of ``epoch_s``, the time spent training the head (its SGD steps).
        gateway_hit_ratio: Requests the gateway answered from its cache.
        local_hit_ratio: Samples read from the client-side cache.
        drain_s: After the epoch, the wait until the gateway had written every entry
            (not in ``epoch_s``; the next epoch starts after it).
        storage_cpu_s: CPU seconds of the storage tier during the epoch (both gateways
            and the store): what the cache costs or saves there, less sensitive than the
            wall time to other work on the machine.
        client_cpu_s: CPU seconds of the client process during the epoch.
        drain_cpu_s: CPU seconds of the storage tier during the drain: the entry writes
            the gateway left for after the epoch (it writes them once no request is
            being served), which ``storage_cpu_s`` does not hold.
    """

    config: str
    epoch: int
    repeat: int = 1
    epoch_s: float
    samples: int
    link_bytes: int = 0
    head_s: float = 0.0
    gateway_hit_ratio: float = 0.0
    local_hit_ratio: float = 0.0
    drain_s: float = 0.0
    storage_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    drain_cpu_s: float = 0.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpochRun:
        """The inverse of ``asdict``."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """``jobs`` jobs one after another, each training its own head for ``epochs`` epochs
    on the same backbone, split and objects: total seconds per configuration.

    Args:
        jobs: Jobs run per configuration.
        epochs: Epochs per job.
        job_s: Per configuration, each job's seconds: its epochs' (the waits for the
            gateway's cache writes between them are not counted, as in the epochs).
    """

    jobs: int
    epochs: int
    job_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def total_s(self, config: str) -> float | None:
        """The sweep's total seconds with ``config`` (``None``: not run)."""
        times = self.job_s.get(config)
        return sum(times) if times else None

    def speedup(self, config: str) -> float | None:
        """The total without a cache over the total with ``config``."""
        uncached, total = self.total_s(UNCACHED), self.total_s(config)
        return None if not uncached or not total else uncached / total

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "jobs": self.jobs,
            "epochs": self.epochs,
            "job_s": {k: list(v) for k, v in self.job_s.items()},
            "total_s": {k: self.total_s(k) for k in self.job_s},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepResult:
        """The inverse of :meth:`to_dict`."""
        jobs = {k: tuple(v) for k, v in data.get("job_s", {}).items()}
        return cls(jobs=data["jobs"], epochs=data["epochs"], job_s=jobs)


@dataclass(frozen=True, kw_only=True)
class CacheCell:
    """The cache scenario of one model at one bandwidth.

    Args:
        model: The model family.
        regime: ``network-bound``, ``balanced`` or ``compute-bound``.
        bandwidth_bps: The shaped rate.
        split: The split of the pushdown configurations.
        samples: Samples per epoch.
        batch_size: Training batch (and request) size.
        epochs: Epochs per series.
        runs: Every epoch measured.
        sweep: The sweep scenario, if run.
    """

    model: str
    regime: str
    bandwidth_bps: float
    split: int
    samples: int
    batch_size: int
    epochs: int
    runs: tuple[EpochRun, ...] = ()
    sweep: SweepResult | None = None

    def epoch_times(self, config: str) -> list[float]:
        """Seconds of epoch 1, 2... of ``config`` (per epoch, the fastest repeat)."""
        by_epoch: dict[int, float] = {}
        for run in self.runs:
            if run.config == config:
                by_epoch[run.epoch] = min(by_epoch.get(run.epoch, run.epoch_s), run.epoch_s)
        return [by_epoch[e] for e in sorted(by_epoch)]

    def cold_s(self, config: str) -> float | None:
        """Epoch 1 of ``config`` (the fastest repeat)."""
        times = self.epoch_times(config)
        return times[0] if times else None

    def warm_s(self, config: str) -> float | None:
        """Mean of epochs 2 and later of ``config``."""
        times = self.epoch_times(config)[1:]
        return statistics.fmean(times) if times else None

    def warm_head_s(self, config: str) -> float | None:
        """Mean head-training time in epochs 2 and later of ``config``."""
        heads = [r.head_s for r in self.runs if r.config == config and r.epoch > 1]
        return statistics.fmean(heads) if heads else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        data = asdict(self)
        data["runs"] = [asdict(run) for run in self.runs]
        data["sweep"] = None if self.sweep is None else self.sweep.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheCell:
        """The inverse of :meth:`to_dict`."""
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        values["runs"] = tuple(EpochRun.from_dict(r) for r in data.get("runs", ()))
        sweep = data.get("sweep")
        values["sweep"] = None if sweep is None else SweepResult.from_dict(sweep)
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class CacheSummary:
    """The headline figures of one cell.

    ``cold_overhead``: the gateway cache's epoch 1 over the same split without a cache,
    minus one, the median over the interleaved pairs (``cold_overhead_range``: the least
    and the most); ``cold_cpu_overhead`` (and its range) the same with the storage tier's
    CPU seconds, and ``cold_cpu_with_drain`` with the CPU of the writes left for after
    the epoch counted too (the cache's whole cost on the storage side). ``warm_speedup``: the baseline epoch over the gateway cache's epochs 2+;
    ``client_speedup`` likewise with the client cache. ``client_over_head``: the client
    cache's epochs 2+ over the time its head's training took in them (1.0: the epoch
    is the head's training alone).
    """

    model: str
    regime: str
    bandwidth_bps: float
    split: int
    baseline_s: float | None
    uncached_s: float | None
    cold_s: float | None
    warm_s: float | None
    client_warm_s: float | None
    head_s: float | None
    cold_overhead: float | None
    cold_cpu_overhead: float | None
    cold_overhead_range: tuple[float, float] | None
    cold_cpu_overhead_range: tuple[float, float] | None
    cold_pairs: int
    cold_cpu_with_drain: float | None = None
    cold_cpu_with_drain_range: tuple[float, float] | None = None
    warm_speedup: float | None
    client_speedup: float | None
    client_over_head: float | None
    warm_hit_ratio: float | None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or not bottom else top / bottom


def cold_pairs(cell: CacheCell) -> list[tuple[EpochRun, EpochRun]]:
    """(without the cache, cold with it) per repeat that ran both: the interleaved pairs."""
    firsts = {(r.config, r.repeat): r for r in cell.runs if r.epoch == 1}
    repeats = sorted({repeat for config, repeat in firsts if config == GATEWAY})
    return [
        (firsts[(UNCACHED, repeat)], firsts[(GATEWAY, repeat)])
        for repeat in repeats
        if (UNCACHED, repeat) in firsts
    ]


def _paired(ratios: list[float]) -> tuple[float | None, tuple[float, float] | None]:
    """The median of ``ratios`` minus one, and the least and most minus one."""
    if not ratios:
        return None, None
    return statistics.median(ratios) - 1.0, (min(ratios) - 1.0, max(ratios) - 1.0)


def summarize(cell: CacheCell) -> CacheSummary:
    """The headline figures of ``cell`` (``None`` where a configuration is missing)."""
    baseline_times = cell.epoch_times(BASELINE)
    baseline = statistics.fmean(baseline_times) if baseline_times else None
    uncached = min(cell.epoch_times(UNCACHED), default=None)
    cold, warm = cell.cold_s(GATEWAY), cell.warm_s(GATEWAY)
    client, head = cell.warm_s(CLIENT), cell.warm_head_s(CLIENT)
    hits = [r.gateway_hit_ratio for r in cell.runs if r.config == GATEWAY and r.epoch > 1]
    pairs = cold_pairs(cell)
    overhead, overhead_range = _paired([c.epoch_s / u.epoch_s for u, c in pairs if u.epoch_s > 0])
    cpu, cpu_range = _paired(
        [c.storage_cpu_s / u.storage_cpu_s for u, c in pairs if u.storage_cpu_s > 0]
    )
    whole, whole_range = _paired(
        [
            (c.storage_cpu_s + c.drain_cpu_s) / u.storage_cpu_s
            for u, c in pairs
            if u.storage_cpu_s > 0
        ]
    )
    return CacheSummary(
        model=cell.model,
        regime=cell.regime,
        bandwidth_bps=cell.bandwidth_bps,
        split=cell.split,
        baseline_s=baseline,
        uncached_s=uncached,
        cold_s=cold,
        warm_s=warm,
        client_warm_s=client,
        head_s=head,
        cold_overhead=overhead,
        cold_cpu_overhead=cpu,
        cold_overhead_range=overhead_range,
        cold_cpu_overhead_range=cpu_range,
        cold_pairs=len(pairs),
        cold_cpu_with_drain=whole,
        cold_cpu_with_drain_range=whole_range,
        warm_speedup=_ratio(baseline, warm),
        client_speedup=_ratio(baseline, client),
        client_over_head=_ratio(client, head),
        warm_hit_ratio=statistics.fmean(hits) if hits else None,
    )


WARM_SPEEDUP_TARGET = 10.0
COLD_OVERHEAD_LIMIT = 0.03
HEAD_BOUND = 1.5


@dataclass(frozen=True, kw_only=True)
class CacheTarget:
    """One goal of the cache scenario, and whether the run met it."""

    name: str
    value: float | None
    goal: str
    met: bool | None  # None: no case to judge


def targets(summaries: Sequence[CacheSummary]) -> list[CacheTarget]:
    """The issue's goals: epochs 2+ at least 10x faster than the baseline where
    network-bound; with the client cache, an epoch within 1.5x of the head's training
    alone; a cold epoch at most 3% slower than the same split without the cache."""
    network = [s for s in summaries if s.regime == "network-bound"]
    speedups = [s.warm_speedup for s in network if s.warm_speedup is not None]
    heads = [s.client_over_head for s in network if s.client_over_head is not None]
    overheads = [s.cold_overhead for s in summaries if s.cold_overhead is not None]

    def judged(name: str, value: float | None, goal: str, ok: bool) -> CacheTarget:
        return CacheTarget(name=name, value=value, goal=goal, met=None if value is None else ok)

    low = min(speedups, default=None)
    high_head = max(heads, default=None)
    worst = max(overheads, default=None)
    return [
        judged(
            "gateway cache, epochs 2+ speedup over the baseline where network-bound (min)",
            low,
            f">= {WARM_SPEEDUP_TARGET:g}x",
            low is not None and low >= WARM_SPEEDUP_TARGET,
        ),
        judged(
            "client cache, epochs 2+ over the head's training alone where network-bound (max)",
            high_head,
            f"<= {HEAD_BOUND:g}x",
            high_head is not None and high_head <= HEAD_BOUND,
        ),
        judged(
            "cold epoch overhead over the same split without the cache (max)",
            worst,
            f"<= {COLD_OVERHEAD_LIMIT:.0%}",
            worst is not None and worst <= COLD_OVERHEAD_LIMIT,
        ),
    ]
