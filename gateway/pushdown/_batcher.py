"""Adaptive storage-side batching: one batcher per run of frozen blocks, sized by memory.

Samples from every concurrent request for the same blocks queue together; a batch runs
when it reaches the largest size that fits the tenant's share of the memory budget, or
when its oldest sample has waited ``max_delay_s`` (Triton's dynamic batching, with the
size derived from memory rather than configured). Unlike a fixed delay, a batch waits only
while more samples are known to be on their way (requests announced by the gateway, still
fetching or decoding): a lone client pays no queueing delay. The size comes from

    share of budget = (budget - weights of cached sessions) / active tenants
    max batch       = share // per-sample estimate

A request of several samples is already a batch (the SDK sends its request batches that
way), so a batch closes once it holds the largest waiting request's worth of whole
requests: merging requests of 4 into batches of 8 delays every first response by the
second request's compute, and the link idles while the storage side computes (the
pipeline loses its overlap; docs/results.md measured it). Single-sample requests (plain
GETs) still merge up to the memory bound.

An out-of-memory error splits the batch in two, retries both halves, and raises the
per-sample estimate so the next batch is smaller. Only a single sample that does not fit
fails, and then only the requests it belongs to.

A request whose client went away cancels its job: its samples still queued are dropped
(counted in ``samples_dropped``), and a job partly taken into a batch is not taken from
again; only the batch already on the device finishes.

Identities (the callers' access keys) share a batcher fairly: each has its own queue, and
batches are formed in start-time fair order over samples (:class:`._fairness.FairQueue`),
so one identity's backlog never stands in front of another's request. A request of
another identity joins a batch only while that identity has no more samples in it than
the batch's first identity, so a single sample is not held up by computing someone
else's window with it. While several identities use the batcher (samples queued,
announced or run in the last seconds), a batch holds about ``_SLICE_S`` of compute at
most: a batch on the device runs to its end, and that is what a newcomer waits for. A
full queue refuses (``SlowDown``) only an identity that holds its share of the queue or
more; another waits for room, which goes to the identity holding the fewest queued
samples first. With one identity, everything above holds unchanged. Each batch's run
time is metered to its identities in proportion to their samples in it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import InsufficientMemory, InvalidRequest, SlowDown
from ._fairness import FairQueue

Run = Callable[[np.ndarray], np.ndarray]
Meter = Callable[[str, int, float], None]  # identity, samples computed, its share of seconds
# after each batch: its size, its run time, and each request slice's wait in the queue
Observer = Callable[[int, float, Sequence[float]], None]
# While identities share a batcher, a batch holds about this much compute (at least one
# sample), so a request of one waits for little of another's batch on the device (a
# batch runs to its end). On a GPU that still allows large batches; on a CPU, where
# batching gains little, a few samples.
_SLICE_S = 0.010
_WAIT_SHARE = 0.25  # of a batch's expected run time, the most it waits for announced requests
_SHARING_S = 2.0  # an identity whose samples ran this recently still shares the batcher
BUSY_WINDOW_S = 10.0  # the span /_hapi/stats' busy share covers


class OutOfMemory(Exception):
    """Raised by a run function when a batch does not fit the device's memory."""


@dataclass
class MemoryBudget:
    """Bytes the storage side may use for inference, shared by all tenants.

    Attributes:
        total: The budget: free device memory at start-up on a GPU, a configured size on CPU.
        weights: Bytes held by cached sessions' weights (charged once per session).
        source: Where ``total`` came from (for ``/_hapi/stats``).
    """

    total: int
    weights: int = 0
    source: str = "configured"
    _active: set[str] = field(default_factory=set)

    def share(self) -> int:
        """Activation bytes one active tenant may use now."""
        return max(0, self.total - self.weights) // max(1, len(self._active))

    def activate(self, tenant: str) -> None:
        self._active.add(tenant)

    def deactivate(self, tenant: str) -> None:
        self._active.discard(tenant)

    @property
    def active_tenants(self) -> int:
        return len(self._active)


@dataclass
class _Job:
    samples: np.ndarray
    future: asyncio.Future[np.ndarray]
    enqueued: float
    identity: str
    parts: dict[int, np.ndarray] = field(default_factory=dict)  # by start index
    taken: int = 0
    finished: int = 0
    batch_size: int = 0


@dataclass
class _Slice:
    job: _Job
    start: int
    stop: int


class Batcher:
    """Batches samples for one run function (a session of blocks ``[0, split)``).

    Args:
        name: Tenant name, for stats and the budget.
        run: Runs one batch; raises :class:`OutOfMemory` when it does not fit.
        per_sample_bytes: Initial per-sample memory estimate (from the manifest).
        budget: The shared memory budget.
        pool: Where ``run`` executes (one thread per device serializes device use).
        max_delay_s: Longest a sample waits for company.
        max_queue_samples: Queued samples beyond which requests get ``SlowDown``.
        max_batch: Upper bound on the batch size whatever the memory allows.
        fixed_batch: A fixed batch size instead of the adaptive one (for comparisons).
        meter: Told, after each batch, each identity's samples in it and its share of the
            batch's run time (in proportion to its samples).
        observer: Told, after each batch, its size, its run time and how long each
            request's samples in it waited in the queue (the operator's view in /metrics).
    """

    def __init__(
        self,
        name: str,
        run: Run,
        *,
        per_sample_bytes: int,
        budget: MemoryBudget,
        pool: Executor,
        max_delay_s: float = 0.004,
        max_queue_samples: int = 4096,
        max_batch: int = 512,
        fixed_batch: int | None = None,
        meter: Meter | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.name = name
        self._run = run
        self.per_sample_bytes = max(1, per_sample_bytes)
        self._budget = budget
        self._pool = pool
        self._max_delay = max_delay_s
        self._max_queue = max_queue_samples
        self._max_batch = max_batch
        self._fixed = fixed_batch
        self._meter = meter
        self._observer = observer
        self._queue: FairQueue[_Job] = FairQueue()
        self._waiting: collections.Counter[str] = collections.Counter()  # submits, by identity
        self._incoming: collections.Counter[str] = collections.Counter()  # announced
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.stats = BatcherStats()

    @property
    def queued(self) -> int:
        return self._queue.queued

    @property
    def max_queue(self) -> int:
        """The most samples that may wait at once (one request's window must fit)."""
        return self._max_queue

    def max_batch_size(self) -> int:
        """The largest batch the current memory share allows (at least 1)."""
        if self._fixed is not None:
            return self._fixed
        return max(1, min(self._max_batch, self._budget.share() // self.per_sample_bytes))

    def expecting(self, identity: str = "") -> Arrival:
        """Announce a request of ``identity`` whose samples are on their way (fetching,
        decoding), so the batcher waits a little for them:
        ``with batcher.expecting(identity) as arrival: ...``.

        Its first :meth:`Arrival.submit` ends the announcement; leaving the block without
        one (the request failed, or was cancelled) withdraws it. Either way exactly once.
        """
        self._incoming[identity] += 1
        return Arrival(self, identity)

    def _withdraw(self, identity: str) -> None:
        self._incoming[identity] -= 1
        if not self._incoming[identity]:
            del self._incoming[identity]
        self._wakeup.set()

    async def submit(
        self,
        samples: np.ndarray,
        *,
        identity: str = "",
        announced: bool = False,
        wait: bool = False,
    ) -> tuple[np.ndarray, int]:
        """Queue samples ``[N, ...]``; returns their outputs and the largest batch size used.

        Args:
            samples: The preprocessed inputs.
            identity: Who asks (the caller's access key): what batches are fair between
                and what the meter is told.
            announced: The first submission of an :class:`Arrival` (the request is no
                longer on its way); :meth:`Arrival.submit` sets it.
            wait: When the queue is full, wait for room instead of raising ``SlowDown``
                (for a request whose response has already started).

        Raises:
            InvalidRequest: More samples than the queue can ever hold.
            SlowDown: The queue is full, ``identity`` holds its share of it or more (and
                ``wait`` is false).
            InsufficientMemory: One sample alone does not fit the budget.
        """
        if announced:
            self._withdraw(identity)
        if len(samples) > self._max_queue:
            raise InvalidRequest(
                f"{len(samples)} samples at once exceed the queue bound of {self._max_queue} "
                f"(HAPI_MAX_QUEUE_SAMPLES) for {self.name}"
            )
        if not self._may_enter(identity, len(samples)):
            await self._wait_for_room(identity, len(samples), wait)
        loop = asyncio.get_running_loop()
        job = _Job(samples, loop.create_future(), loop.time(), identity)
        self._queue.push(job)
        self._budget.activate(self.name)
        self._ensure_running()
        self._wakeup.set()
        try:
            result = await job.future
        except asyncio.CancelledError:
            self._wakeup.set()  # let the loop drop what is left of it now
            raise
        return result, job.batch_size

    def _may_enter(self, identity: str, count: int) -> bool:
        """Whether ``count`` samples of ``identity`` may queue now: they fit, and no
        identity holding fewer queued samples is waiting for room."""
        if self._queue.queued + count > self._max_queue:
            return False
        mine = self._queue.held[identity]
        return all(self._queue.held[other] >= mine for other in self._waiting)

    async def _wait_for_room(self, identity: str, count: int, wait: bool) -> None:
        self._waiting[identity] += 1
        try:
            while not self._may_enter(identity, count):
                share = self._max_queue // len({*self._queue.held, identity})
                if not wait and self._queue.held[identity] + count > share:
                    raise SlowDown(
                        f"the storage side is saturated for {self.name}; retry shortly",
                        retry_after=1,
                    )
                self._room.clear()
                await self._room.wait()
        finally:
            self._waiting[identity] -= 1
            if not self._waiting[identity]:
                del self._waiting[identity]
            self._room.set()  # who waited behind this identity may go now

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"batcher {self.name}"
            )

    async def close(self) -> None:
        """Stop the loop; queued requests fail."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for job in self._queue:
            if not job.future.done():
                job.future.set_exception(SlowDown("the gateway is shutting down", retry_after=1))
        self._budget.deactivate(self.name)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._drop_cancelled()
            if not self._queue:
                self._wakeup.clear()
                self._budget.deactivate(self.name)
                continue
            size = self._slice(self.max_batch_size())
            deadline = min(job.enqueued for job in self._queue) + self._wait_s(size)
            while (
                self._queue.queued < self._target(size)
                and self._incoming
                and (remaining := deadline - loop.time()) > 0
            ):
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            await self._run_one(size, self._target(size))
            if not self._queue:  # idle: no longer a tenant sharing the budget
                self._budget.deactivate(self.name)

    def _slice(self, size: int) -> int:
        """``size``, or while identities share the batcher, the samples of about
        ``_SLICE_S`` of compute (at the mean time per sample so far)."""
        sharing = {*self._queue.recent(_SHARING_S), *self._incoming}
        if len(sharing) < 2 or self._fixed is not None or not self.stats.samples:
            return size
        per_sample = self.stats.busy_s / self.stats.samples
        return max(1, min(size, int(_SLICE_S / per_sample)))

    def _wait_s(self, size: int) -> float:
        """How long the oldest queued sample may wait for announced requests: the queue
        delay, or a share of the batch's expected run time when that is longer. Where a
        sample takes milliseconds to run (later splits on a CPU), a wait of a fraction of
        the run fills the batch, and a fuller batch runs each sample for less (ResNet18
        split 8 behind 8 clients of single GETs: batches of 4 with the 4 ms delay, of 8
        with 20 ms, and 5-16% more samples/s); the decoders meanwhile have the cores."""
        if not self.stats.samples:
            return self._max_delay
        per_sample = self.stats.busy_s / self.stats.samples
        coming = self._queue.queued + sum(self._incoming.values())  # at least a sample each
        expected = min(self._target(size), coming)
        return max(self._max_delay, _WAIT_SHARE * per_sample * expected)

    def _target(self, size: int) -> int:
        """Samples after which a batch closes: one largest waiting request's worth."""
        largest = max((len(job.samples) for job in self._queue), default=1)
        # single samples merge up to the bound; so does an empty request (every sample
        # of a batch came from the cache or failed), which a target of 0 would never take
        return size if largest <= 1 else min(size, largest)

    async def _run_one(self, size: int, target: int) -> None:
        slices = self._take(size, target)
        if not slices:
            return
        batch = _joined([s.job.samples[s.start : s.stop] for s in slices])
        now = asyncio.get_running_loop().time()
        waits = [now - s.job.enqueued for s in slices]
        started = time.perf_counter()
        try:
            outputs = await self._execute(batch)
        except Exception as exc:  # the error belongs to these requests, not to the loop
            for s in slices:
                if not s.job.future.done():
                    s.job.future.set_exception(exc)
            return
        seconds = time.perf_counter() - started
        self.stats.record(len(batch), seconds, self._queue.queued)
        self._meter_batch(slices, seconds)
        if self._observer is not None:
            self._observer(len(batch), seconds, waits)
        self._deliver(slices, outputs, len(batch))

    def _take(self, size: int, target: int) -> list[_Slice]:
        """Whole requests in fair order until ``target``; only ``size`` cuts the first. A
        request of another identity than the first's joins only while its identity has
        no more samples in the batch than the first one."""
        slices: list[_Slice] = []
        room = size
        taken: collections.Counter[str] = collections.Counter()
        skip: set[str] = set()
        while room and size - room < target and (job := self._queue.head(skip)) is not None:
            if job.future.done():  # cancelled: take no more of it
                self._drop(job)
                continue
            left = len(job.samples) - job.taken
            if slices and left > room:
                break  # only a batch's first request is cut, so each leaves in one piece
            first = slices[0].job.identity if slices else job.identity
            if job.identity != first and taken[job.identity] + left > taken[first]:
                skip.add(job.identity)  # would hold the first identity's samples up
                continue
            count = min(room, left)
            slices.append(_Slice(job, job.taken, job.taken + count))
            self._queue.take(job, count)
            taken[job.identity] += count
            room -= count
        self._room.set()
        return slices

    def _meter_batch(self, slices: list[_Slice], seconds: float) -> None:
        if self._meter is None:
            return
        samples: collections.Counter[str] = collections.Counter()
        for s in slices:
            samples[s.job.identity] += s.stop - s.start
        for identity, count in samples.items():
            if count:  # not an empty request's (every sample cached or failed)
                self._meter(identity, count, seconds * count / samples.total())

    def _deliver(self, slices: list[_Slice], outputs: np.ndarray, batch_size: int) -> None:
        offset = 0
        for s in slices:
            count = s.stop - s.start
            job = s.job
            job.parts[s.start] = outputs[offset : offset + count]
            offset += count
            job.finished += count
            job.batch_size = max(job.batch_size, batch_size)
            if job.finished == len(job.samples) and not job.future.done():
                job.future.set_result(_joined([job.parts[k] for k in sorted(job.parts)]))

    def _drop_cancelled(self) -> None:
        for job in self._queue:
            if job.future.done():
                self._drop(job)

    def _drop(self, job: _Job) -> None:
        """Forget a job that is over (cancelled or failed); its untaken samples never run."""
        left = self._queue.remove(job)
        if job.future.cancelled():  # not a job that failed: its request went away
            self.stats.samples_dropped += left
            self.stats.requests_cancelled += 1
        self._room.set()

    async def _execute(self, batch: np.ndarray) -> np.ndarray:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, self._run, batch)
        except OutOfMemory:
            self.stats.oom_events += 1
            if len(batch) == 1:
                raise InsufficientMemory(
                    f"one sample of {self.name} does not fit the storage side's memory budget "
                    f"({self._budget.total} bytes)"
                ) from None
            half = len(batch) // 2
            self._lower_estimate(half)
            first = await self._execute(batch[:half])
            second = await self._execute(batch[half:])
            return np.concatenate([first, second])

    def _lower_estimate(self, fits_at_most: int) -> None:
        """After an OOM at ``2 * fits_at_most``: make the next max batch at most that."""
        needed = self._budget.share() // max(1, fits_at_most) + 1
        self.per_sample_bytes = max(self.per_sample_bytes, needed)


@dataclass
class BatcherStats:
    """What ``/_hapi/stats`` shows per tenant."""

    batches: int = 0
    samples: int = 0
    oom_events: int = 0
    samples_dropped: int = 0  # queued samples of requests whose client went away
    requests_cancelled: int = 0  # requests that went away with samples still queued
    busy_s: float = 0.0
    recent_sizes: collections.deque[int] = field(
        default_factory=lambda: collections.deque(maxlen=64)
    )
    _window: collections.deque[tuple[float, int]] = field(
        default_factory=lambda: collections.deque(maxlen=256)
    )
    _runs: collections.deque[tuple[float, float]] = field(default_factory=collections.deque)

    def record(self, size: int, seconds: float, queued: int) -> None:
        self.batches += 1
        self.samples += size
        self.busy_s += seconds
        self.recent_sizes.append(size)
        now = time.monotonic()
        self._window.append((now, size))
        self._runs.append((now, seconds))
        while self._runs and self._runs[0][0] <= now - BUSY_WINDOW_S:
            self._runs.popleft()

    def busy_share(self, now: float | None = None) -> float:
        """The share of the last :data:`BUSY_WINDOW_S` seconds this batcher spent running
        batches: its work in progress, which a queue read between two of a job's requests
        does not show (a job that sends its next request when the last one is answered
        leaves the queue empty most of the time it keeps the device busy)."""
        now = time.monotonic() if now is None else now
        start = now - BUSY_WINDOW_S
        busy = sum(min(seconds, end - start) for end, seconds in self._runs if end > start)
        return min(1.0, busy / BUSY_WINDOW_S)

    def samples_per_s(self) -> float:
        if len(self._window) < 2:
            return 0.0
        span = self._window[-1][0] - self._window[0][0]
        return sum(n for _, n in list(self._window)[1:]) / span if span > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        sizes = list(self.recent_sizes)
        return {
            "batches": self.batches,
            "samples": self.samples,
            "oom_events": self.oom_events,
            "samples_dropped": self.samples_dropped,
            "requests_cancelled": self.requests_cancelled,
            "samples_per_s": round(self.samples_per_s(), 2),
            "ms_per_sample": round(1000 * self.busy_s / self.samples, 3) if self.samples else None,
            "recent_batch_sizes": sizes,
            "mean_batch_size": round(sum(sizes) / len(sizes), 2) if sizes else None,
            "busy_share": round(self.busy_share(), 3),
        }


class Arrival:
    """A request announced to a :class:`Batcher` (:meth:`Batcher.expecting`): its first
    submission, or leaving the ``with`` block, ends the announcement, exactly once."""

    def __init__(self, batcher: Batcher, identity: str = "") -> None:
        self.batcher = batcher
        self.identity = identity
        self._expected = True

    @property
    def expected(self) -> bool:
        """Whether the announcement still stands (nothing submitted yet)."""
        return self._expected

    async def submit(self, samples: np.ndarray, *, wait: bool) -> tuple[np.ndarray, int]:
        """:meth:`Batcher.submit`, counting the first call as the announced arrival."""
        announced, self._expected = self._expected, False
        return await self.batcher.submit(
            samples, identity=self.identity, announced=announced, wait=wait
        )

    def __enter__(self) -> Arrival:
        return self

    def __exit__(self, *_: object) -> None:
        if self._expected:
            self._expected = False
            self.batcher._withdraw(self.identity)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` end to end; a single part as it is (a view: batches and outputs are
    hundreds of KB a sample, and every copy on the event loop delays every request)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
