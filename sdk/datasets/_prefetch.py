"""A bounded, ordered background pipeline of fetches and computes.

Pushdown pays only when the storage side extracts the next batches while the client
trains on the current one, and a plain-GET loader pays only when fetching overlaps the
client's compute. :class:`Pipeline` splits each request in three: starting it, which
queues its network work at once and in request order; waiting for that work to finish,
on a fetch thread of its own; and the compute the wait returns, one at a time in request
order. Queueing in order matters on a narrow link: GET threads shared by several
requests serve the request the training loop waits for first, as a plain-GET loader
that queues every object in order does (fetch threads that each queued their own reads
raced, and a later request's reads could take the link from an earlier one's).

A stage's exception is raised in the consuming thread, at the item it belongs to;
closing (``close()``, leaving a ``with`` block, or dropping the iterator) cancels what
has not started, queued network work included, and waits for what has, so no thread
outlives it.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Fetch(Protocol[R_co]):
    """A request whose network work has been queued (see :class:`Pipeline`)."""

    def wait(self) -> Callable[[], R_co]:
        """Block until the request's bytes are in; return the compute left to do."""
        ...

    def cancel(self) -> None:
        """Drop the queued work that has not started (the pipeline is closing)."""
        ...


class Deferred(Generic[R]):
    """A :class:`Fetch` that queues nothing ahead: ``receive`` does all of it in
    :meth:`wait` (a single HTTP request, whose order no other request can take)."""

    def __init__(self, receive: Callable[[], Callable[[], R]]) -> None:
        self._receive = receive

    def wait(self) -> Callable[[], R]:
        return self._receive()

    def cancel(self) -> None:
        pass


def _raise(error: BaseException) -> Callable[[], R]:
    raise error


class Pipeline(Generic[T, R]):
    """Iterate ``start(job).wait()()`` for every job: starts in job order, waits ahead
    on ``depth`` fetch threads, and the calls they return (the compute) one at a time on
    a thread of their own, in order.

    Fetching the next requests never waits for a compute to finish, as in a plain-GET
    loader that refills its queue when it takes a batch: as soon as the compute thread
    turns to a request (and waits for its bytes) the next one starts, so ``depth``
    requests are started or received (their bytes held) behind the one awaited; at most
    ``depth`` wait on fetch threads at once (a pushdown request is one HTTP request on
    its fetch thread; raw reads queue at the start), and at most ``2 * depth`` requests
    are held in all (received or computed, not yet taken).

    Args:
        jobs: The inputs, consumed lazily.
        start: Called once per job, in job order, as the job is admitted; it only
            queues (it runs under the pipeline's lock) and returns the :class:`Fetch`
            whose ``wait`` runs on a fetch thread.
        depth: Requests started or held at most (>= 1).

    Attributes:
        wait_s: Seconds the consumer spent blocked waiting for results.
    """

    def __init__(self, jobs: Iterable[T], start: Callable[[T], Fetch[R]], *, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, not {depth}")
        self._jobs = iter(jobs)
        self._start = start
        self._depth = depth
        self._fetching = ThreadPoolExecutor(depth, thread_name_prefix="hapi-prefetch")
        self._computing = ThreadPoolExecutor(1, thread_name_prefix="hapi-prefetch-compute")
        self._pending: deque[tuple[Future[R], Fetch[R]]] = deque()
        self._lock = threading.Lock()
        self._received = 0  # admitted jobs the compute thread has not turned to yet
        self._closed = False
        self.wait_s = 0.0
        self._admit()

    def _admit(self) -> None:
        with self._lock:
            if self._closed:
                return
            room = min(self._depth - self._received, 2 * self._depth - len(self._pending))
            for job in itertools.islice(self._jobs, max(0, room)):
                try:
                    started: Fetch[R] = self._start(job)
                except Exception as exc:  # raised at its own item, like a failed wait
                    started = Deferred(functools.partial(_raise, exc))
                fetched = self._fetching.submit(started.wait)
                self._received += 1
                computed = self._computing.submit(self._compute, fetched)
                self._pending.append((computed, started))

    def _compute(self, fetched: Future[Callable[[], R]]) -> R:
        # The next request starts as soon as this one is the one awaited, as a plain-GET
        # loader refills its queue when it takes a batch: ``depth`` requests stay queued
        # on the link behind the one the compute waits for.
        with self._lock:
            self._received -= 1
        self._admit()
        return fetched.result()()

    def __iter__(self) -> Iterator[R]:
        return self

    def __next__(self) -> R:
        with self._lock:
            future = self._pending.popleft()[0] if self._pending else None
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
        for future, started in pending:
            future.cancel()
            started.cancel()
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
