"""A bounded, ordered background prefetcher.

Pushdown pays only when the storage side extracts the next batches while the client
trains on the current one. :class:`Prefetcher` keeps ``depth`` calls of a function in
flight on its own threads, hands results back in submission order, and starts the next
call as soon as one result is taken, so at most ``depth`` results (plus the one being
used) are held at any time. A call's exception is raised in the consuming thread, at
the item it belongs to; closing (``close()``, leaving a ``with`` block, or dropping the
iterator) cancels what has not started and waits for what has, so no thread outlives it.
"""

from __future__ import annotations

import itertools
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
