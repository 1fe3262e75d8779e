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
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import InsufficientMemory, InvalidRequest, SlowDown

Run = Callable[[np.ndarray], np.ndarray]


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
        self._jobs: collections.deque[_Job] = collections.deque()
        self._queued = 0
        self._incoming = 0
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.stats = BatcherStats()

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def max_queue(self) -> int:
        """The most samples that may wait at once (one request's window must fit)."""
        return self._max_queue

    def max_batch_size(self) -> int:
        """The largest batch the current memory share allows (at least 1)."""
        if self._fixed is not None:
            return self._fixed
        return max(1, min(self._max_batch, self._budget.share() // self.per_sample_bytes))

    def expecting(self) -> Arrival:
        """Announce a request whose samples are on their way (fetching, decoding), so the
        batcher waits a little for them: ``with batcher.expecting() as arrival: ...``.

        Its first :meth:`Arrival.submit` ends the announcement; leaving the block without
        one (the request failed, or was cancelled) withdraws it. Either way exactly once.
        """
        self._incoming += 1
        return Arrival(self)

    def _withdraw(self) -> None:
        self._incoming -= 1
        self._wakeup.set()

    async def submit(
        self, samples: np.ndarray, *, announced: bool = False, wait: bool = False
    ) -> tuple[np.ndarray, int]:
        """Queue samples ``[N, ...]``; returns their outputs and the largest batch size used.

        Args:
            samples: The preprocessed inputs.
            announced: The first submission of an :class:`Arrival` (the request is no
                longer on its way); :meth:`Arrival.submit` sets it.
            wait: When the queue is full, wait for room instead of raising ``SlowDown``
                (for a request whose response has already started).

        Raises:
            InvalidRequest: More samples than the queue can ever hold.
            SlowDown: The queue is full (and ``wait`` is false).
            InsufficientMemory: One sample alone does not fit the budget.
        """
        if announced:
            self._incoming -= 1
        if len(samples) > self._max_queue:
            raise InvalidRequest(
                f"{len(samples)} samples at once exceed the queue bound of {self._max_queue} "
                f"(HAPI_MAX_QUEUE_SAMPLES) for {self.name}"
            )
        while self._queued + len(samples) > self._max_queue:
            if not wait:
                raise SlowDown(
                    f"the storage side is saturated for {self.name}; retry shortly", retry_after=1
                )
            self._room.clear()
            await self._room.wait()
        loop = asyncio.get_running_loop()
        job = _Job(samples, loop.create_future(), loop.time())
        self._jobs.append(job)
        self._queued += len(samples)
        self._budget.activate(self.name)
        self._ensure_running()
        self._wakeup.set()
        try:
            result = await job.future
        except asyncio.CancelledError:
            self._wakeup.set()  # let the loop drop what is left of it now
            raise
        return result, job.batch_size

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
        for job in self._jobs:
            if not job.future.done():
                job.future.set_exception(SlowDown("the gateway is shutting down", retry_after=1))
        self._budget.deactivate(self.name)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._drop_cancelled()
            if not self._jobs:
                self._wakeup.clear()
                self._budget.deactivate(self.name)
                continue
            size = self.max_batch_size()
            deadline = self._jobs[0].enqueued + self._max_delay
            while (
                self._queued < self._target(size)
                and self._incoming > 0
                and (remaining := deadline - loop.time()) > 0
            ):
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            await self._run_one(size, self._target(size))
            if not self._jobs:  # idle: no longer a tenant sharing the budget
                self._budget.deactivate(self.name)

    def _target(self, size: int) -> int:
        """Samples after which a batch closes: one largest waiting request's worth."""
        largest = max((len(job.samples) for job in self._jobs), default=1)
        # single samples merge up to the bound; so does an empty request (every sample
        # of a batch came from the cache or failed), which a target of 0 would never take
        return size if largest <= 1 else min(size, largest)

    async def _run_one(self, size: int, target: int) -> None:
        slices = self._take(size, target)
        if not slices:
            return
        batch = np.concatenate([s.job.samples[s.start : s.stop] for s in slices])
        started = time.perf_counter()
        try:
            outputs = await self._execute(batch)
        except Exception as exc:  # the error belongs to these requests, not to the loop
            for s in slices:
                if not s.job.future.done():
                    s.job.future.set_exception(exc)
            return
        self.stats.record(len(batch), time.perf_counter() - started, self._queued)
        self._deliver(slices, outputs, len(batch))

    def _take(self, size: int, target: int) -> list[_Slice]:
        """Whole requests in arrival order until ``target``; only ``size`` cuts the first."""
        slices: list[_Slice] = []
        room = size
        while self._jobs and room and size - room < target:
            job = self._jobs[0]
            if job.future.done():  # cancelled: take no more of it
                self._drop(self._jobs.popleft())
                continue
            if slices and len(job.samples) - job.taken > room:
                break  # only a batch's first request is cut, so each leaves in one piece
            count = min(room, len(job.samples) - job.taken)
            slices.append(_Slice(job, job.taken, job.taken + count))
            job.taken += count
            room -= count
            self._queued -= count
            if job.taken == len(job.samples):
                self._jobs.popleft()
        self._room.set()
        return slices

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
                job.future.set_result(np.concatenate([job.parts[k] for k in sorted(job.parts)]))

    def _drop_cancelled(self) -> None:
        kept = collections.deque(job for job in self._jobs if not job.future.done())
        for job in self._jobs:
            if job.future.done():
                self._drop(job)
        self._jobs = kept

    def _drop(self, job: _Job) -> None:
        """Forget a job that is over (cancelled or failed); its untaken samples never run."""
        left = len(job.samples) - job.taken
        self._queued -= left
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

    def record(self, size: int, seconds: float, queued: int) -> None:
        self.batches += 1
        self.samples += size
        self.busy_s += seconds
        self.recent_sizes.append(size)
        self._window.append((time.monotonic(), size))

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
        }


class Arrival:
    """A request announced to a :class:`Batcher` (:meth:`Batcher.expecting`): its first
    submission, or leaving the ``with`` block, ends the announcement, exactly once."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher
        self._expected = True

    @property
    def expected(self) -> bool:
        """Whether the announcement still stands (nothing submitted yet)."""
        return self._expected

    async def submit(self, samples: np.ndarray, *, wait: bool) -> tuple[np.ndarray, int]:
        """:meth:`Batcher.submit`, counting the first call as the announced arrival."""
        announced, self._expected = self._expected, False
        return await self.batcher.submit(samples, announced=announced, wait=wait)

    def __enter__(self) -> Arrival:
        return self

    def __exit__(self, *_: object) -> None:
        if self._expected:
            self._expected = False
            self.batcher._withdraw()
