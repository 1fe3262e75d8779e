"""A bounded, ordered background pipeline of fetches and computes.

Pushdown pays only when the storage side extracts the next batches while the client
trains on the current one, and a plain-GET loader pays only when fetching overlaps the
client's compute. :class:`Pipeline` splits each request in two stages, the fetch and the
compute it returns: fetches run ahead on their own threads, computes run one at a time
in submission order. A stage's exception is raised in the consuming thread, at the item
it belongs to; closing (``close()``, leaving a ``with`` block, or dropping the iterator)
cancels what has not started and waits for what has, so no thread outlives it.
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


class Pipeline(Generic[T, R]):
    """Iterate ``fetch(job)()`` for every job: fetches ahead on ``depth`` threads, the
    calls they return (the compute) one at a time on a thread of their own, in order.

    Fetching the next requests never waits for a compute to finish, as in a plain-GET
    loader: a fetch slot frees as soon as the compute of what it fetched starts, so up
    to ``depth`` requests are received (their bytes held) ahead of the one computing,
    and at most ``2 * depth`` requests are held in all (received or computed, not yet
    taken).

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

    def close(self, *, wait: bool = True) -> None:
        """Cancel what has not started, wait for what has (unless ``wait`` is false),
        stop the threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending)
            self._pending.clear()
        for future in pending:
            future.cancel()
        self._fetching.shutdown(wait=wait, cancel_futures=True)
        self._computing.shutdown(wait=wait, cancel_futures=True)

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
        # An abandoned iterator (a training loop that broke out early) still stops its
        # threads. The last reference may drop on one of them (a compute finishing after
        # the consumer let go), which cannot join itself: they finish what runs and exit.
        if not getattr(self, "_closed", True):
            self.close(wait=False)
