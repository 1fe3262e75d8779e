"""The datasets' fetch/compute pipeline: fetching runs ahead while a request computes,
computes run one at a time, and received bytes stay bounded (events from instrumented
fakes, no timing)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from hapi.sdk.datasets._prefetch import Deferred, Pipeline
from tests.sdk.support import on_fetch_threads

WAIT = 5.0  # bound on every wait; the events come much sooner


class Recorder:
    """A fetch whose returned compute is held at job 0 until released."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.release = threading.Event()
        self.fetch_started = {n: threading.Event() for n in range(16)}
        self.held = 0  # received, compute not started
        self.most_held = 0
        self.computing = 0
        self.most_computing = 0
        self._lock = threading.Lock()

    def fetch(self, job: int) -> Callable[[], int]:
        with self._lock:
            self.events.append(f"fetch {job}")
            self.held += 1
            self.most_held = max(self.most_held, self.held)
        self.fetch_started[job].set()
        return lambda: self._compute(job)

    def _compute(self, job: int) -> int:
        with self._lock:
            self.events.append(f"compute {job}")
            self.held -= 1
            self.computing += 1
            self.most_computing = max(self.most_computing, self.computing)
        if job == 0:
            self.release.wait(WAIT)
        with self._lock:
            self.computing -= 1
            self.events.append(f"computed {job}")
        return job * 10


def test_fetches_run_ahead_while_a_request_computes():
    fake = Recorder()
    with Pipeline(range(8), on_fetch_threads(fake.fetch), depth=2) as running:
        # compute 0 is held: both fetch slots move on to the next two requests
        assert fake.fetch_started[1].wait(WAIT) and fake.fetch_started[2].wait(WAIT)
        assert "computed 0" not in fake.events
        fake.release.set()
        assert list(running) == [n * 10 for n in range(8)]
    order = fake.events
    assert order.index("fetch 2") < order.index("computed 0")


def test_computes_run_one_at_a_time_and_received_bytes_stay_bounded():
    fake = Recorder()
    fake.release.set()
    assert list(Pipeline(range(12), on_fetch_threads(fake.fetch), depth=3)) == [
        n * 10 for n in range(12)
    ]
    assert fake.most_computing == 1
    assert fake.most_held <= 3 + 1  # three received ahead of the one computing


def test_an_error_in_a_compute_surfaces_at_its_item():
    def fetch(job: int) -> Callable[[], int]:
        def compute() -> int:
            if job == 3:
                raise RuntimeError("job 3 failed")
            return job

        return compute

    seen = []
    running = Pipeline(range(10), on_fetch_threads(fetch), depth=2)
    try:
        for result in running:
            seen.append(result)
    except RuntimeError as exc:
        assert "job 3" in str(exc)
    assert seen == [0, 1, 2]
    assert not [t for t in threading.enumerate() if t.name.startswith("hapi-prefetch")]


class _Slow:
    """Requests whose network wait for job 0 is held until released."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.release = threading.Event()

    def start(self, job: int) -> Deferred[int]:
        self.started.append(job)  # the pipeline calls this under its lock, in order

        def wait() -> Callable[[], int]:
            if job == 0:
                self.release.wait(WAIT)
            return lambda: job

        return Deferred(wait)


def test_requests_start_in_order_and_depth_of_them_queue_behind_the_awaited_one():
    # As a plain-GET loader refills its queue when it takes a batch, before the batch's
    # bytes are in. Before: the next request started only once request 0's compute did,
    # so one request fewer was on the link while the training loop waited.
    slow = _Slow()
    with Pipeline(range(8), slow.start, depth=2) as running:
        deadline = time.monotonic() + WAIT / 2  # job 0 stays held longer than this
        while len(slow.started) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # and no more than that
        assert slow.started == [0, 1, 2]
        slow.release.set()
        assert list(running) == list(range(8))
    assert slow.started == list(range(8))


def test_an_error_in_a_start_surfaces_at_its_item():
    def start(job: int) -> Deferred[int]:
        if job == 2:
            raise RuntimeError("request 2 could not be queued")
        return Deferred(lambda: lambda: job)

    seen = []
    with pytest.raises(RuntimeError, match="request 2"):
        for result in Pipeline(range(6), start, depth=2):
            seen.append(result)
    assert seen == [0, 1]
    assert not [t for t in threading.enumerate() if t.name.startswith("hapi-prefetch")]
