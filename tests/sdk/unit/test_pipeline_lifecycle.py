"""The datasets' pipeline over its whole life: order, bounds, errors from either stage,
and no thread outliving it (breaking out early, abandoning it, closing it)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import pytest

from hapi.sdk.datasets._prefetch import Pipeline
from tests.sdk.support import on_fetch_threads

WAIT = 5.0  # bound on every join; the threads stop much sooner


class Counter:
    """A fetch that records how many fetches run at once and which jobs started."""

    def __init__(self, *, fail_fetch_at: int | None = None) -> None:
        self.fail_fetch_at = fail_fetch_at
        self.started: list[int] = []
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def fetch(self, job: int) -> Callable[[], int]:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(job)
        try:
            if job == self.fail_fetch_at:
                raise RuntimeError(f"fetch {job} failed")
            return lambda: job * 10
        finally:
            with self._lock:
                self.running -= 1


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hapi-prefetch")]


def test_results_come_in_order_and_the_threads_stop():
    counter = Counter()
    assert list(Pipeline(range(50), on_fetch_threads(counter.fetch), depth=3)) == [
        n * 10 for n in range(50)
    ]
    assert counter.most <= 3
    assert not _threads()


def test_a_failed_fetch_surfaces_at_its_item_and_stops_the_rest():
    counter = Counter(fail_fetch_at=4)
    seen = []
    with pytest.raises(RuntimeError, match="fetch 4 failed"):
        for result in Pipeline(range(100), on_fetch_threads(counter.fetch), depth=2):
            seen.append(result)
    assert seen == [0, 10, 20, 30]
    assert max(counter.started) < 4 + 2 * 2 + 1  # nothing beyond what the bounds admit
    assert not _threads()


def test_breaking_out_early_and_closing_stops_the_threads():
    counter = Counter()
    running = Pipeline(range(1000), on_fetch_threads(counter.fetch), depth=4)
    for result in running:
        if result == 20:
            break
    running.close()
    assert not _threads() and counter.running == 0
    assert len(counter.started) <= 3 + 2 * 4  # taken, plus at most 2 * depth held


def test_an_abandoned_pipeline_stops_when_collected():
    counter = Counter()
    running = Pipeline(range(1000), on_fetch_threads(counter.fetch), depth=4)
    next(running)
    del running  # the last reference may drop on a pipeline thread: it cannot join itself
    gc.collect()
    for thread in _threads():
        thread.join(WAIT)
    assert not _threads() and counter.running == 0


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Pipeline(range(3), on_fetch_threads(Counter().fetch), depth=0)
