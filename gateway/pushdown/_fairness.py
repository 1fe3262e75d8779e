"""Fairness between identities (the callers' access keys) where pushdown's work is shared.

:class:`FairQueue` is the batchers' queue: one queue per identity, served in start-time
fair order over samples, so one identity's backlog never stands in front of another's
request. :class:`FairPool` is the decoding threads, which take queued jobs round-robin
across identities. :class:`RequestRate` is the optional per-identity request rate, a
token bucket each. Each holds one entry per identity with work or a recent request:
identities are the configured keys and ``anonymous``, so all are bounded by configuration.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sized
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, Generic, Protocol, TypeVar

from .._errors import SlowDown


class Queued(Protocol):
    """What :class:`FairQueue` needs of a job."""

    taken: int  # samples already taken into batches

    @property
    def identity(self) -> str: ...

    @property
    def samples(self) -> Sized: ...

    @property
    def enqueued(self) -> float: ...


J = TypeVar("J", bound=Queued)


class FairQueue(Generic[J]):
    """Queued jobs, one queue per identity, served in start-time fair order over samples.

    Each identity has a virtual finish time: the samples taken from it, counted from the
    virtual time at which it joined. The identity with the earliest finish goes next
    (ties: the oldest job); each take moves the virtual time to where it started. An
    identity that was idle joins at the virtual time: idleness banks no credit, and a
    backlog earns no priority. Within one identity, jobs leave in arrival order.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._queues: dict[str, collections.deque[J]] = {}
        self._finish: dict[str, float] = {}
        self._virtual = 0.0
        self._clock = clock
        self._taken_at: dict[str, float] = {}
        self.held: collections.Counter[str] = collections.Counter()  # untaken samples
        self.queued = 0

    def __iter__(self) -> Iterator[J]:
        return (job for queue in list(self._queues.values()) for job in list(queue))

    def __bool__(self) -> bool:
        return bool(self._queues)

    def recent(self, within_s: float) -> set[str]:
        """Identities with samples queued, or taken in the last ``within_s`` seconds."""
        now = self._clock()
        self._taken_at = {k: t for k, t in self._taken_at.items() if now - t < within_s}
        return {*self._taken_at, *self._queues}

    def push(self, job: J) -> None:
        queue = self._queues.get(job.identity)
        if queue is None:
            # An idle identity whose finish is behind would join at the virtual time anyway.
            self._finish = {
                k: v for k, v in self._finish.items() if k in self._queues or v > self._virtual
            }
            self._finish[job.identity] = max(self._finish.get(job.identity, 0.0), self._virtual)
            queue = self._queues[job.identity] = collections.deque()
        queue.append(job)
        self._count(job.identity, len(job.samples))

    def head(self, skip: Collection[str] = ()) -> J | None:
        """The next job in fair order, of an identity not in ``skip``."""
        best: tuple[tuple[float, float], J] | None = None
        for identity, queue in self._queues.items():
            if identity not in skip:
                order = (self._finish[identity], queue[0].enqueued)
                if best is None or order < best[0]:
                    best = (order, queue[0])
        return None if best is None else best[1]

    def take(self, job: J, count: int) -> None:
        """``count`` more samples of ``job`` go into a batch."""
        self._virtual = max(self._virtual, self._finish[job.identity])
        self._finish[job.identity] += count
        self._taken_at[job.identity] = self._clock()
        job.taken += count
        self._count(job.identity, -count)
        if job.taken == len(job.samples):
            self.remove(job)

    def remove(self, job: J) -> int:
        """Forget ``job``; returns how many of its samples were never taken."""
        queue = self._queues[job.identity]
        queue.remove(job)
        if not queue:
            del self._queues[job.identity]
        left = len(job.samples) - job.taken
        self._count(job.identity, -left)
        return left

    def _count(self, identity: str, samples: int) -> None:
        self.queued += samples
        self.held[identity] += samples
        if not self.held[identity]:
            del self.held[identity]


_Work = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class FairPool:
    """Worker threads shared by identities: queued jobs run round-robin across the
    identities that have some (one job each in turn), so a job waits behind at most one
    job of each other identity, not behind another identity's whole backlog.

    Args:
        workers: Threads.
        name: Their name prefix.
        initializer: Run by each thread as it starts.
    """

    def __init__(
        self, workers: int, name: str, *, initializer: Callable[[], object] | None = None
    ) -> None:
        self._threads = ThreadPoolExecutor(
            workers, thread_name_prefix=name, initializer=initializer
        )
        self._workers = workers
        self._queues: dict[str, collections.deque[_Work]] = {}  # in turn order
        self._lock = threading.Lock()
        self._draining = 0

    def serving(self, identity: str) -> Executor:
        """An executor whose jobs are ``identity``'s (for ``loop.run_in_executor``)."""
        return _Serving(self, identity)

    def submit(
        self, identity: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            self._queues.setdefault(identity, collections.deque()).append(
                (future, fn, args, kwargs)
            )
            start = self._draining < self._workers  # else a draining thread will take it
            if start:
                self._draining += 1
        if start:
            self._threads.submit(self._drain)
        return future

    def shutdown(self, wait: bool = True) -> None:
        self._threads.shutdown(wait)

    def __enter__(self) -> FairPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    def _drain(self) -> None:
        while (work := self._next()) is not None:
            future, fn, args, kwargs = work
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it started
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the job's, for whoever awaits it
                future.set_exception(exc)
            else:
                future.set_result(result)

    def _next(self) -> _Work | None:
        with self._lock:
            if not self._queues:
                self._draining -= 1
                return None
            identity = next(iter(self._queues))
            queue = self._queues.pop(identity)
            work = queue.popleft()
            if queue:
                self._queues[identity] = queue  # to the back of the turn
            return work


class _Serving(Executor):
    def __init__(self, pool: FairPool, identity: str) -> None:
        self._pool = pool
        self._identity = identity

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._pool.submit(self._identity, fn, *args, **kwargs)


class RequestRate:
    """Requests per second per identity: a token bucket each, whose burst is one second's
    worth of requests (at least one).

    Args:
        per_s: Requests one identity may make per second (0: no limit).
        clock: Seconds, monotonic (injectable for tests).
    """

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = per_s
        self._burst = max(1.0, per_s)
        self._clock = clock
        self._levels: dict[str, tuple[float, float]] = {}

    def take(self, identity: str) -> None:
        """Count one request of ``identity``.

        Raises:
            SlowDown: Over its rate; ``Retry-After`` says when the next one may come.
        """
        if not self._rate:
            return
        now = self._clock()
        level, then = self._levels.get(identity, (self._burst, now))
        level = min(self._burst, level + (now - then) * self._rate)
        if level < 1:
            raise SlowDown(
                f"more than {self._rate:g} pushdown requests per second from {identity}; "
                "retry later",
                retry_after=max(1, math.ceil((1 - level) / self._rate)),
            )
        self._levels[identity] = (level - 1, now)
