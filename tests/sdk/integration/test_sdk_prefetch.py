"""The SDK's prefetcher: bounded, ordered, exceptions where they belong, clean shutdown.

In-process and fast; it lives with the SDK's integration tests because the pipelining it
provides is what they rely on.
"""

from __future__ import annotations

import threading
import time

import pytest

from hapi.sdk._prefetch import Prefetcher


class _Probe:
    """A job function that records how many calls run at once."""

    def __init__(self, delay: float = 0.01, fail_at: int | None = None) -> None:
        self.delay = delay
        self.fail_at = fail_at
        self.running = 0
        self.most = 0
        self.started: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, job: int) -> int:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(job)
        try:
            time.sleep(self.delay)
            if job == self.fail_at:
                raise RuntimeError(f"job {job} failed")
            return job * 10
        finally:
            with self._lock:
                self.running -= 1


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hapi-prefetch")]


def test_results_come_in_order_with_at_most_depth_in_flight():
    probe = _Probe()
    results = list(Prefetcher(range(20), probe, depth=3))
    assert results == [n * 10 for n in range(20)]
    assert 1 < probe.most <= 3
    assert not _prefetch_threads()


def test_work_runs_ahead_of_a_slow_consumer():
    probe = _Probe(delay=0.0)
    with Prefetcher(range(10), probe, depth=4) as running:
        assert next(running) == 0
        time.sleep(0.05)  # the training step: the next batches are fetched meanwhile
        assert len(probe.started) == 5  # the one taken plus four in flight, no more
        started = time.perf_counter()
        assert next(running) == 10
        assert time.perf_counter() - started < 0.02
    assert running.wait_s >= 0


def test_an_exception_surfaces_at_its_item_and_stops_the_rest():
    probe = _Probe(fail_at=4)
    seen = []
    with pytest.raises(RuntimeError, match="job 4 failed"):
        for result in Prefetcher(range(100), probe, depth=2):
            seen.append(result)
    assert seen == [0, 10, 20, 30]
    assert max(probe.started) < 8  # nothing far beyond the failure was started
    assert not _prefetch_threads()


def test_breaking_out_early_shuts_the_threads_down():
    probe = _Probe(delay=0.02)
    running = Prefetcher(range(1000), probe, depth=4)
    for result in running:
        if result == 20:
            break
    running.close()
    assert not _prefetch_threads() and probe.running == 0
    assert len(probe.started) <= 8


def test_an_abandoned_prefetcher_stops_when_collected():
    probe = _Probe(delay=0.02)
    running = Prefetcher(range(1000), probe, depth=4)
    next(running)
    del running
    assert not _prefetch_threads() and probe.running == 0


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(range(3), _Probe(), depth=0)
