"""Without pushdown a request's objects are read concurrently, as a plain-GET loader
reads them: a request of several objects does not pay one round trip after another."""

from __future__ import annotations

import threading
from typing import Any

from hapi.sdk._compute import GET_THREADS, Engine, Spec
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
    compute = engine.receive("data", keys)  # the reads happen here; the compute is left
    assert compute is not None
    assert store.most == GET_THREADS  # all in flight together, never more than the pool
