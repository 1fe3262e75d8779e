"""The storage side's own times, measured on real traffic, for ``/_hapi/models/{name}``.

A batcher runs blocks ``[0, split)`` as a chain of one session per block, and
:class:`TimedChain` times each block's run alone: no decode, queueing or HTTP is inside
it. On the CPU provider with one intra-op thread the block computes in the calling
thread, so its thread CPU time is taken: a core shared with decoding threads or another
process does not inflate it. Otherwise (a GPU, or several intra-op threads) the wall
time is. Decoding is timed the same way, per sample, in the decoding threads.

How loaded the storage host is, is measured apart from the block times: while a block
runs on the CPU, the gateway process's CPU time over the wall time is the share of a core
it gets (1 alone, about 0.5 next to one CPU-bound process). The planner divides the
storage side's CPU work by that share, instead of reading inflated block times.

Figures are keyed by block content hash (models sharing a block share its figure),
device and batch-size bucket (powers of two); each is the mean of its latest batches.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hapi.models import BlockTime, Figure, Manifest, StorageLoad, StorageProfile

BlockRun = Callable[[np.ndarray], np.ndarray]
_WINDOW = 64  # batches a figure averages over: recent enough to follow a change of load


def batch_bucket(size: int) -> int:
    """The power of two a batch of ``size`` samples is counted under (1, 2, 4, 8...)."""
    return 1 << max(0, size - 1).bit_length()


@dataclass
class _Tally:
    """Recent (seconds, samples) pairs and the total samples ever, with the last update."""

    window: collections.deque[tuple[float, int]] = field(
        default_factory=lambda: collections.deque(maxlen=_WINDOW)
    )
    samples: int = 0
    updated: float = 0.0

    def add(self, seconds: float, samples: int) -> None:
        self.window.append((seconds, samples))
        self.samples += samples
        self.updated = time.monotonic()

    def ms(self) -> float:
        seconds = sum(s for s, _ in self.window)
        return 1000.0 * seconds / max(1, sum(n for _, n in self.window))

    def age(self) -> float:
        return round(time.monotonic() - self.updated, 3)


@dataclass(frozen=True)
class _Key:
    block: str
    device: str
    bucket: int
    clock: str


class StorageProfiler:
    """Per-block inference times, decode time and the host's availability, as measured."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[_Key, _Tally] = {}
        self._decode = _Tally()
        self._cpu = _Tally()  # (process CPU seconds, wall milliseconds) while blocks ran

    def record_block(
        self, block: str, device: str, batch: int, seconds: float, *, clock: str = "cpu"
    ) -> None:
        """One run of ``block`` (a content hash) on ``batch`` samples took ``seconds``."""
        key = _Key(block, device, batch_bucket(batch), clock)
        with self._lock:
            self._blocks.setdefault(key, _Tally()).add(seconds, batch)

    def record_decode(self, seconds: float) -> None:
        """One sample took ``seconds`` of CPU time to decode and preprocess."""
        with self._lock:
            self._decode.add(seconds, 1)

    def record_availability(self, cpu_s: float, wall_s: float) -> None:
        """The process used ``cpu_s`` of CPU time during ``wall_s`` of block runs."""
        if wall_s > 0:
            with self._lock:
                self._cpu.add(cpu_s, max(1, round(wall_s * 1e6)))

    def profile(self, manifest: Manifest) -> StorageProfile:
        """The figures of ``manifest``'s frozen blocks (the manifest's where never run)."""
        with self._lock:
            batches = [
                self._batch_time(index, key, tally)
                for index, block in enumerate(manifest.blocks[: manifest.freeze])
                for key, tally in sorted(self._blocks.items(), key=lambda kv: kv[0].bucket)
                if key.block == block.hash
            ]
            return StorageProfile(
                blocks=[_overall(index, manifest, batches) for index in range(manifest.freeze)],
                batches=batches,
                decode=self._decode_figure(),
                load=self._load(),
            )

    def _batch_time(self, index: int, key: _Key, tally: _Tally) -> BlockTime:
        return BlockTime(
            block=index,
            device=key.device,
            batch=key.bucket,
            clock="cpu" if key.clock == "cpu" else "wall",
            ms=round(tally.ms(), 4),
            source="measured",
            samples=tally.samples,
            age_s=tally.age(),
        )

    def _decode_figure(self) -> Figure | None:
        if not self._decode.samples:
            return None
        return Figure(
            ms=round(self._decode.ms(), 4),
            source="measured",
            samples=self._decode.samples,
            age_s=self._decode.age(),
        )

    def _load(self) -> StorageLoad:
        if not self._cpu.samples:
            return StorageLoad(available=1.0, source="manifest")
        cpu_s = sum(s for s, _ in self._cpu.window)
        wall_s = sum(n for _, n in self._cpu.window) / 1e6
        return StorageLoad(
            available=round(min(1.0, max(0.01, cpu_s / wall_s)), 4),
            source="measured",
            samples=len(self._cpu.window),
            age_s=self._cpu.age(),
        )


def _overall(index: int, manifest: Manifest, batches: Sequence[BlockTime]) -> BlockTime:
    """One figure per block: its buckets' mean weighted by samples, or the manifest's."""
    mine = [b for b in batches if b.block == index]
    if not mine:
        cpu_ms = manifest.blocks[index].cpu_ms
        return BlockTime(block=index, device="cpu", ms=cpu_ms, source="manifest")
    total = sum(b.samples for b in mine)
    latest = min(mine, key=lambda b: b.age_s or 0.0)
    return BlockTime(
        block=index,
        device=latest.device,
        clock=latest.clock,
        ms=round(sum(b.ms * b.samples for b in mine) / total, 4),
        source="measured",
        samples=total,
        age_s=latest.age_s,
    )


class TimedChain:
    """Runs blocks one after another, timing each run alone into a :class:`StorageProfiler`.

    Args:
        runs: One run function per block, in order.
        hashes: The blocks' content hashes.
        device: ``cpu`` or ``cuda``: where the sessions run.
        profiler: Where the times go.
        cpu_clock: The blocks compute in the calling thread (CPU provider, one intra-op
            thread), so its CPU time is their time; otherwise wall time is taken.
    """

    def __init__(
        self,
        runs: Sequence[BlockRun],
        hashes: Sequence[str],
        *,
        device: str,
        profiler: StorageProfiler,
        cpu_clock: bool,
    ) -> None:
        self._runs = list(zip(hashes, runs, strict=True))
        self._device = device
        self._profiler = profiler
        self._cpu_clock = cpu_clock

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        out = batch
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        for digest, run in self._runs:
            out = self._one(digest, run, out)
        if self._device == "cpu":
            self._profiler.record_availability(
                time.process_time() - cpu_started, time.perf_counter() - wall_started
            )
        return out

    def _one(self, digest: str, run: BlockRun, batch: np.ndarray) -> np.ndarray:
        clock = time.thread_time if self._cpu_clock else time.perf_counter
        started = clock()
        out = run(batch)
        seconds = clock() - started
        self._profiler.record_block(
            digest, self._device, len(batch), seconds, clock="cpu" if self._cpu_clock else "wall"
        )
        return out
