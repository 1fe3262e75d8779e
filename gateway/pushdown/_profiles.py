"""The storage side's own times, measured on real traffic, for ``/_hapi/models/{name}``.

A batcher runs blocks ``[0, split)`` as one composed onnxruntime session, and
:class:`TimedRun` times each run alone: no decode, queueing or HTTP is inside it. On the
CPU provider with one intra-op thread the blocks compute in the calling thread, so its
thread CPU time is taken: a core shared with decoding threads or another process does
not inflate it. Otherwise (a GPU, or several intra-op threads) the wall time is. The
run's time is divided among its blocks by onnxruntime's per-node profile of the
session's first batches on the CPU (:class:`ProfiledRun`; the composed graph keeps each
block's node-name prefix), by each block timed alone on a GPU (:class:`ChainedRun`: the
profile times kernel launches there), or by the manifest's per-block times until then. Decoding is timed
the same way, per sample, in the decoding threads.

How loaded the storage host is, is measured apart from the block times: while a block
runs on the CPU, the gateway process's CPU time over the wall time is the share of a core
it gets (1 alone, about 0.5 next to one CPU-bound process). The planner divides the
storage side's CPU work by that share, instead of reading inflated block times. Before
any block has run, a plan on the gateway's view (a profile request, or a request with
``split=auto``) probes it instead (:func:`probe_share`: a short computation on one
thread, its CPU time over wall time), so a fresh gateway on a busy node does not claim
a whole core to the first plan.

Figures are keyed by block content hash (models sharing a block share its figure),
device and batch-size bucket (powers of two); each is the mean of its latest batches.

A run that starts after the process has run no block for :data:`COLD_GAP_S` is *cold*:
on a virtual machine a core woken from idle can run the same batch slower than back to
back (ResNet18's ten blocks measured 33 ms per sample back to back, 36-50 ms after 0.3 s
asleep, the same after 0.3 s of busy waiting). The storage side's figure decides a plan
where the storage side is the bottleneck, and there it runs back to back: so
back-to-back figures are served whenever there are any, and figures (and the host's
availability) from runs after idle gaps only where nothing else was measured.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hapi.models import Manifest, block_times
from hapi.protocol import BlockTime, Figure, StorageLoad, StorageProfile

BlockRun = Callable[[np.ndarray], np.ndarray]
_WINDOW = 64  # batches a figure averages over: recent enough to follow a change of load
COLD_GAP_S = 0.05
"""A block run starting this long after the process's previous one ended is cold."""
PROBE_S = 0.1
"""How long :func:`probe_share` computes: about 25 scheduler slices of a shared core."""
PROBE_TTL_S = 30.0
"""A probe is served this long; a profile request after that probes again (while no
block run has measured the share)."""


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
    split_by: str
    warm: bool = True  # run back to back with the previous one (see COLD_GAP_S)


class StorageProfiler:
    """Per-block inference times, decode time and the host's availability, as measured.

    Args:
        clock: Wall seconds (``time.perf_counter``); tests pass their own.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._blocks: dict[_Key, _Tally] = {}
        self._decode = _Tally()
        # (process CPU seconds, wall microseconds) while blocks ran: back to back, cold
        self._cpu = {True: _Tally(), False: _Tally()}
        self._running = 0
        self._last_end: float | None = None
        self._probed: tuple[float, float] | None = None  # (share, when)
        self._probing = threading.Lock()  # one probe at a time

    def run_started(self) -> bool:
        """A block run starts; returns whether it is warm: another run is under way or
        ended less than :data:`COLD_GAP_S` ago."""
        with self._lock:
            now = self._clock()
            idle = self._last_end is None or now - self._last_end > COLD_GAP_S
            warm = self._running > 0 or not idle
            self._running += 1
            return warm

    def run_ended(self) -> None:
        """The run :meth:`run_started` announced has ended."""
        with self._lock:
            self._running -= 1
            self._last_end = self._clock()

    def record_block(
        self,
        block: str,
        device: str,
        batch: int,
        seconds: float,
        *,
        clock: str = "cpu",
        split_by: str = "measured",
        warm: bool = True,
    ) -> None:
        """``block`` (a content hash) took ``seconds`` of a run on ``batch`` samples
        (``warm``: run back to back with the previous one)."""
        key = _Key(block, device, batch_bucket(batch), clock, split_by, warm)
        with self._lock:
            tally = self._blocks.setdefault(key, _Tally())
            tally.add(seconds, batch)
            if split_by == "measured":  # a learned division replaces the manifest's
                self._blocks.pop(_Key(block, device, key.bucket, clock, "manifest", warm), None)

    def record_decode(self, seconds: float) -> None:
        """One sample took ``seconds`` of CPU time to decode and preprocess."""
        with self._lock:
            self._decode.add(seconds, 1)

    def record_availability(self, cpu_s: float, wall_s: float, *, warm: bool = True) -> None:
        """The process used ``cpu_s`` of CPU time during ``wall_s`` of a block run."""
        if wall_s > 0:
            with self._lock:
                self._cpu[warm].add(cpu_s, max(1, round(wall_s * 1e6)))

    def _needs_probe(self) -> bool:
        """No block run has measured the share, and no probe younger than
        :data:`PROBE_TTL_S` has."""
        with self._lock:
            measured = self._cpu[True].samples or self._cpu[False].samples
            fresh = self._probed is not None and self._clock() - self._probed[1] < PROBE_TTL_S
            return not (measured or fresh)

    def probe_load(self) -> None:
        """Probe the share of a core a thread gets now (:func:`probe_share`) where
        :meth:`_needs_probe`. Blocks for :data:`PROBE_S`: call it off the event loop."""
        with self._probing:
            if not self._needs_probe():  # another caller probed while this one waited
                return
            share = probe_share(PROBE_S)
            with self._lock:
                self._probed = (share, self._clock())

    async def current(self, manifest: Manifest) -> StorageProfile:
        """:meth:`profile`, the share of a core probed first (off the event loop) where
        nothing has measured it: what every plan on the gateway's view reads."""
        if self._needs_probe():
            await asyncio.to_thread(self.probe_load)
        return self.profile(manifest)

    def profile(self, manifest: Manifest) -> StorageProfile:
        """The figures of ``manifest``'s frozen blocks (the manifest's where never run;
        back-to-back runs' where there are any)."""
        with self._lock:
            kept = {
                key: tally
                for key, tally in self._blocks.items()
                if key.warm or dataclasses.replace(key, warm=True) not in self._blocks
            }
            batches = [
                self._batch_time(index, key, tally)
                for index, block in enumerate(manifest.blocks[: manifest.freeze])
                for key, tally in sorted(kept.items(), key=lambda kv: kv[0].bucket)
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
            split_by="measured" if key.split_by == "measured" else "manifest",
            ms=tally.ms(),
            source="measured",
            samples=tally.samples,
            age_s=tally.age(),
        )

    def _decode_figure(self) -> Figure | None:
        if not self._decode.samples:
            return None
        return Figure(
            ms=self._decode.ms(),
            source="measured",
            samples=self._decode.samples,
            age_s=self._decode.age(),
        )

    def _load(self) -> StorageLoad:
        tally = self._cpu[True] if self._cpu[True].samples else self._cpu[False]
        if not tally.samples:
            if self._probed is None:
                return StorageLoad(available=1.0, source="manifest")
            share, when = self._probed
            age_s = round(self._clock() - when, 3)
            return StorageLoad(available=round(share, 4), source="probed", samples=1, age_s=age_s)
        cpu_s = sum(s for s, _ in tally.window)
        wall_s = sum(n for _, n in tally.window) / 1e6
        return StorageLoad(
            available=round(min(1.0, max(0.01, cpu_s / wall_s)), 4),
            source="measured",
            samples=len(tally.window),
            age_s=tally.age(),
        )


def probe_share(seconds: float) -> float:
    """The share of a core one thread of this process gets now: its CPU time over the
    wall time while it hashes for ``seconds`` (1 alone, about 0.5 beside one CPU-bound
    process at the same niceness). Hashing a large buffer releases the interpreter's
    lock, so the event loop and other threads run meanwhile."""
    data = bytes(1 << 20)
    cpu_started, started = time.thread_time(), time.perf_counter()
    while time.perf_counter() - started < seconds:
        hashlib.sha256(data).digest()
    wall = time.perf_counter() - started
    return min(1.0, max(0.01, (time.thread_time() - cpu_started) / wall))


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
        split_by=latest.split_by,
        ms=sum(b.ms * b.samples for b in mine) / total,
        source="measured",
        samples=total,
        age_s=latest.age_s,
    )


class ProfiledRun:
    """An onnxruntime session's run whose first ``batches`` batches are profiled per node,
    to learn how a batch's time divides among the composed blocks (:attr:`shares`).

    Profiling then ends (onnxruntime keeps every event in memory until it does), and the
    trace file is removed. Serving runs the composed graph throughout: a chain of one
    session per block costs about 15% more CPU (layout reorders at every boundary).
    """

    def __init__(self, run: BlockRun, session: Any, blocks: int, *, batches: int = 3) -> None:
        self._run = run
        self._session = session
        self._blocks = blocks
        self._left = batches
        self._lock = threading.Lock()
        self.shares: tuple[float, ...] | None = None

    @property
    def profiling(self) -> bool:
        """Whether the next run is still profiled per node (its time is not the
        serving time: every node adds an event)."""
        return self._left > 0

    def profiling_for(self, size: int) -> bool:
        """:attr:`profiling`, whatever the batch's size (the interface
        :class:`TimedRun` reads, shared with :class:`ChainedRun`)."""
        return self.profiling

    def shares_for(self, size: int) -> tuple[float, ...] | None:
        """:attr:`shares`: on the CPU the division barely moves with the batch size."""
        return self.shares

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        out = self._run(batch)
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self.shares = self._end_profiling()
        return out

    def close(self) -> None:
        """End profiling if it still runs (onnxruntime would write its trace file when
        the session is dropped) and remove the trace."""
        with self._lock:
            if self._left > 0:
                self._left = 0
                self._end_profiling()

    def _end_profiling(self) -> tuple[float, ...] | None:
        path = self._session.end_profiling()
        try:
            times = block_times(path, self._blocks)
        except (OSError, ValueError):
            return None
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)
        if self._blocks == 1:  # one block is not composed: its nodes carry no prefix
            return (1.0,)
        return _normalized(times)


class ChainedRun:
    """A GPU session's run that learns how a batch's time divides among the composed
    blocks, per batch-size bucket, by also running a bucket's first batch through one
    session per block, each block timed alone (its output back on the host, so the device
    has finished it): once to warm the chain up (cuDNN picks its algorithms for a new
    shape then), then ``repeats`` times, the median per block counting.

    On a GPU onnxruntime's per-node profile (:class:`ProfiledRun`) times each kernel's
    launch, not its work: on an H100 it gave ResNet18's eleven blocks shares of 0.02 to
    0.27 of a 32-sample batch where each block timed alone took 0.18 down to 0.003 (the
    largest gap 0.18; VGG11 0.24, ResNet50 0.08). And the division moves with the batch
    size there (launches dominate small batches, the early high-resolution blocks large
    ones), so each bucket learns its own. Repeats back to back, and their median, because
    a block takes well under a millisecond there, about what the gateway's other threads
    (decoding, HTTP) can delay one timing by: summing two served batches' chain times put
    one of ResNet18's six blocks at 0.50 where alone it takes 0.24. The composed session's
    output is what is returned throughout.
    The chain's sessions (a second copy of the blocks' weights on the device) live as long
    as the run.

    Args:
        run: The composed session's run (blocks ``[0, split)``).
        chain: One run per block, in order.
        repeats: Timed chain runs of a bucket's first batch, after the warm-up one.
        clock: Wall seconds; tests pass their own.
    """

    def __init__(
        self,
        run: BlockRun,
        chain: Sequence[BlockRun],
        *,
        repeats: int = 5,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._run = run
        self._chain: list[BlockRun] = list(chain) if len(chain) > 1 else []
        self._blocks = len(chain)
        self._repeats = repeats
        self._clock = clock
        self._lock = threading.Lock()
        self._shares: dict[int, tuple[float, ...]] = {}

    def profiling_for(self, size: int) -> bool:
        """Whether a batch of ``size`` samples also runs the chain (its time is then not
        the serving time)."""
        with self._lock:
            return bool(self._chain) and batch_bucket(size) not in self._shares

    def shares_for(self, size: int) -> tuple[float, ...] | None:
        """The learned division for batches of ``size`` samples' bucket, if learned."""
        if self._blocks == 1:
            return (1.0,)
        with self._lock:
            return self._shares.get(batch_bucket(size))

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        out = self._run(batch)
        bucket = batch_bucket(len(batch))
        with self._lock:
            if self._chain and bucket not in self._shares:
                self._chained(batch)  # the warm-up: cuDNN picks its algorithms for the shape
                runs: list[list[float]] = [[] for _ in self._chain]
                for _ in range(self._repeats):
                    for index, seconds in enumerate(self._chained(batch)):
                        runs[index].append(seconds)
                learned = _normalized([statistics.median(r) for r in runs])
                if learned is not None:
                    self._shares[bucket] = learned
        return out

    def _chained(self, batch: np.ndarray) -> list[float]:
        times, activation = [], batch
        for block in self._chain:
            started = self._clock()
            activation = block(activation)
            times.append(self._clock() - started)
        return times

    def close(self) -> None:
        """Drop the chain's sessions: no bucket learns from here on."""
        with self._lock:
            self._chain = []


def _normalized(times: Sequence[float]) -> tuple[float, ...] | None:
    total = sum(times)
    return tuple(t / total for t in times) if total > 0 else None


class TimedRun:
    """Runs a batch through blocks ``[0, split)`` and times that run alone (no decode,
    queueing or HTTP) into a :class:`StorageProfiler`, divided among the blocks.

    The division comes from the run's ``shares_for`` the batch when it has learned it (a
    :class:`ProfiledRun` or a :class:`ChainedRun`), else from the
    manifest's per-block times (export-time); each figure says which (``split_by``).
    The session's first run (it plans and allocates its memory) and the runs profiled
    per node are not counted: neither is what a batch costs once the session serves.

    Args:
        run: Runs one batch through blocks ``[0, split)``.
        manifest: The model (block hashes, manifest times).
        split: How many blocks ``run`` runs.
        device: ``cpu`` or ``cuda``: where the session runs.
        profiler: Where the times go.
        cpu_clock: The blocks compute in the calling thread (CPU provider, one intra-op
            thread), so its CPU time is their time and the host's availability is
            measured apart; otherwise wall time is taken (and contains any load).
    """

    def __init__(
        self,
        run: BlockRun,
        manifest: Manifest,
        split: int,
        *,
        device: str,
        profiler: StorageProfiler,
        cpu_clock: bool,
    ) -> None:
        self._run = run
        self._hashes = manifest.hashes[:split]
        self._manifest_shares = _normalized([b.cpu_ms for b in manifest.blocks[:split]]) or tuple(
            1.0 / split for _ in range(split)
        )
        self._device = device
        self._profiler = profiler
        self._cpu_clock = cpu_clock
        self._cold = True

    def close(self) -> None:
        """Let the run release what it holds (a :class:`ProfiledRun`'s trace)."""
        close = getattr(self._run, "close", None)
        if callable(close):
            close()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        warm = self._profiler.run_started()
        try:
            return self._timed(batch, warm)
        finally:
            self._profiler.run_ended()

    def _timed(self, batch: np.ndarray, warm: bool) -> np.ndarray:
        warming = self._cold or _profiling(self._run, len(batch))
        self._cold = False
        if warming:
            return self._run(batch)
        clock = time.thread_time if self._cpu_clock else time.perf_counter
        cpu_started, wall_started, started = time.process_time(), time.perf_counter(), clock()
        out = self._run(batch)
        seconds = clock() - started
        if self._cpu_clock:
            self._profiler.record_availability(
                time.process_time() - cpu_started, time.perf_counter() - wall_started, warm=warm
            )
        learned = _learned(self._run, len(batch))
        shares = learned or self._manifest_shares
        split_by = "measured" if learned else "manifest"
        for digest, share in zip(self._hashes, shares, strict=True):
            self._profiler.record_block(
                digest,
                self._device,
                len(batch),
                seconds * share,
                clock="cpu" if self._cpu_clock else "wall",
                split_by=split_by,
                warm=warm,
            )
        return out


def _profiling(run: BlockRun, size: int) -> bool:
    """Whether ``run`` learns from a batch of ``size`` (a plain run never does)."""
    profiling_for = getattr(run, "profiling_for", None)
    return callable(profiling_for) and bool(profiling_for(size))


def _learned(run: BlockRun, size: int) -> tuple[float, ...] | None:
    """The division ``run`` learned for a batch of ``size``; ``None`` if none."""
    shares_for = getattr(run, "shares_for", None)
    learned: tuple[float, ...] | None = shares_for(size) if callable(shares_for) else None
    return learned
