"""A bounded, ordered background prefetcher.

Pushdown pays only when the storage side extracts the next batches while the client
trains on the current one. :class:`Prefetcher` keeps ``depth`` calls of a function in
flight on its own threads, hands results back in submission order, and starts the next
call as soon as one result is taken, so at most ``depth`` results (plus the one being
used) are held at any time. A call's exception is raised in the consuming thread, at
the item it belongs to; closing (``close()``, leaving a ``with`` block, or dropping the
iterator) cancels what has not started and waits for what has, so no thread outlives it.

:class:`Pipeline` splits each call in two stages, the fetch and the compute it returns,
so that fetching runs ahead while one request computes (what the datasets use).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Prefetcher(Generic[T, R]):
    """Iterate ``fn(job)`` for every job, computed ``depth`` ahead on background threads.

    Args:
        jobs: The inputs, consumed lazily.
        fn: Called once per job on a worker thread.
        depth: Calls in flight at most (>= 1).

    Attributes:
        wait_s: Seconds the consumer spent blocked waiting for results.
    """

    def __init__(self, jobs: Iterable[T], fn: Callable[[T], R], *, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, not {depth}")
        self._jobs = iter(jobs)
        self._fn = fn
        self._pool = ThreadPoolExecutor(depth, thread_name_prefix="hapi-prefetch")
        self._pending: deque[Future[R]] = deque()
        self._closed = False
        self.wait_s = 0.0
        for job in itertools.islice(self._jobs, depth):
            self._pending.append(self._pool.submit(fn, job))

    def __iter__(self) -> Iterator[R]:
        return self

    def __next__(self) -> R:
        if not self._pending:
            self.close()
            raise StopIteration
        future = self._pending.popleft()
        started = time.perf_counter()
        try:
            result = future.result()
        except BaseException:
            self.close()
            raise
        finally:
            self.wait_s += time.perf_counter() - started
        for job in itertools.islice(self._jobs, 1):
            self._pending.append(self._pool.submit(self._fn, job))
        return result

    def close(self) -> None:
        """Cancel calls not started, wait for running ones, stop the threads."""
        if self._closed:
            return
        self._closed = True
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Prefetcher[T, R]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # An abandoned iterator (a training loop that broke out early) still stops its
        # threads; close() is idempotent.
        if not getattr(self, "_closed", True):
            self.close()


class Pipeline(Generic[T, R]):
    """Iterate ``fetch(job)()`` for every job: fetches ahead on ``depth`` threads, the
    calls they return (the compute) one at a time on a thread of their own, in order.

    Fetching the next requests never waits for a compute to finish, as in a plain-GET
    loader: a fetch slot frees as soon as the compute of what it fetched starts, so up
    to ``depth`` requests are received (their bytes held) ahead of the one computing,
    and at most ``2 * depth`` requests are held in all (received or computed, not yet
    taken). Errors, ordering and closing behave as in :class:`Prefetcher`.

    Args:
        jobs: The inputs, consumed lazily.
        fetch: Called once per job on a fetch thread; returns the compute left to do.
        depth: Fetches in flight or held at most (>= 1).

    Attributes:
        wait_s: Seconds the consumer spent blocked waiting for results.
    """

    def __init__(
        self, jobs: Iterable[T], fetch: Callable[[T], Callable[[], R]], *, depth: int
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, not {depth}")
        self._jobs = iter(jobs)
        self._fetch = fetch
        self._depth = depth
        self._fetching = ThreadPoolExecutor(depth, thread_name_prefix="hapi-prefetch")
        self._computing = ThreadPoolExecutor(1, thread_name_prefix="hapi-prefetch-compute")
        self._pending: deque[Future[R]] = deque()
        self._lock = threading.Lock()
        self._received = 0  # admitted jobs whose compute has not started
        self._closed = False
        self.wait_s = 0.0
        self._admit()

    def _admit(self) -> None:
        with self._lock:
            if self._closed:
                return
            room = min(self._depth - self._received, 2 * self._depth - len(self._pending))
            for job in itertools.islice(self._jobs, max(0, room)):
                fetched = self._fetching.submit(self._fetch, job)
                self._received += 1
                self._pending.append(self._computing.submit(self._compute, fetched))

    def _compute(self, fetched: Future[Callable[[], R]]) -> R:
        try:
            compute = fetched.result()
        finally:
            with self._lock:
                self._received -= 1
            self._admit()  # the next fetch starts while this one computes
        return compute()

    def __iter__(self) -> Iterator[R]:
        return self

    def __next__(self) -> R:
        with self._lock:
            future = self._pending.popleft() if self._pending else None
        if future is None:
            self.close()
            raise StopIteration
        started = time.perf_counter()
        try:
            result = future.result()
        except BaseException:
            self.close()
            raise
        finally:
            self.wait_s += time.perf_counter() - started
        self._admit()
        return result

    def close(self) -> None:
        """Cancel what has not started, wait for what has, stop the threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending)
            self._pending.clear()
        for future in pending:
            future.cancel()
        self._fetching.shutdown(wait=True, cancel_futures=True)
        self._computing.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Pipeline[T, R]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()
