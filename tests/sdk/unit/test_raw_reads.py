"""Without pushdown a request's objects are read concurrently, as a plain-GET loader
reads them: a request of several objects does not pay one round trip after another; and
requests queue their reads in order, so the GET threads serve the request the training
loop waits for first."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import pytest

from hapi.sdk.datasets import _compute
from hapi.sdk.datasets._compute import GET_THREADS, Batch, Engine, Spec
from hapi.sdk.datasets._prefetch import Pipeline
from tests.planner.synthetic import manifest

WAIT = 5.0  # bound on the barrier; concurrent reads meet it at once


class _Store:
    """A boto3 stand-in whose GETs wait until ``GET_THREADS`` of them are in flight."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(GET_THREADS, timeout=WAIT)
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def get_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            self.barrier.wait()  # raises BrokenBarrierError when reads run one by one
            return {"Body": _Body(Key.encode())}
        finally:
            with self.lock:
                self.running -= 1


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self) -> bytes:
        return self._data


def test_a_requests_objects_are_read_concurrently_and_bounded() -> None:
    store = _Store()
    spec = Spec(endpoints=(), registry_bucket="models", manifest=manifest(), freeze=3, split=None)
    engine = Engine(spec, s3=store)
    keys = [f"images/{n}.jpg" for n in range(2 * GET_THREADS)]
    compute = engine.start("data", keys).wait()  # the reads happen here; the compute is left
    assert compute is not None
    assert store.most == GET_THREADS  # all in flight together, never more than the pool


class _Recording:
    """A boto3 stand-in that records the order its GETs start in; the first GET of
    ``hold`` waits for ``release``."""

    def __init__(self, hold: str | None = None) -> None:
        self.keys: list[str] = []
        self.hold = hold
        self.holding = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def get_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        with self.lock:
            self.keys.append(Key)
        if Key == self.hold:
            self.holding.set()
            self.release.wait(WAIT)
        time.sleep(0.001)  # long enough for the fetch threads to race
        return {"Body": _Body(Key.encode())}


def _one_get_thread(monkeypatch: pytest.MonkeyPatch, store: _Recording) -> Engine:
    """An engine whose single GET thread starts reads in the order they were queued."""
    monkeypatch.setattr(_compute, "GET_THREADS", 1)
    spec = Spec(endpoints=(), registry_bucket="models", manifest=manifest(), freeze=3, split=None)
    engine = Engine(spec, s3=store)

    def keys_only(bucket: str, objects: list[tuple[str, bytes]]) -> list[str]:
        return [key for key, _ in objects]  # no decoding: the order is under test

    monkeypatch.setattr(engine, "decode_and_run", keys_only)
    return engine


@pytest.mark.parametrize("depth", [4, 8])
def test_requests_queue_their_reads_in_order(monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
    # Before: each request's fetch thread queued its own reads, and the threads raced
    # (request 5's reads began at the 13th GET, ahead of request 1's).
    store = _Recording()
    engine = _one_get_thread(monkeypatch, store)
    keys = [f"images/{n:04d}.jpg" for n in range(256)]
    requests = [keys[i : i + 8] for i in range(0, len(keys), 8)]
    start = functools.partial(engine.start, "data")
    with Pipeline(requests, start, depth=depth) as running:
        received: list[Any] = [key for batch in running for key in batch]
    assert received == keys
    assert store.keys == keys


def test_closing_drops_the_reads_queued_and_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [f"images/{n:04d}.jpg" for n in range(64)]
    store = _Recording(hold=keys[0])
    engine = _one_get_thread(monkeypatch, store)
    running: Pipeline[list[str], Batch] = Pipeline(
        [keys[i : i + 8] for i in range(0, len(keys), 8)],
        functools.partial(engine.start, "data"),
        depth=4,
    )  # four requests started: 32 reads queued, the first one held
    assert store.holding.wait(WAIT)
    running.close(wait=False)  # a training loop that stopped early
    store.release.set()
    engine.reads.shutdown(wait=True)
    assert store.keys == [keys[0]]
