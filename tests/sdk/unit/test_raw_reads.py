"""Without pushdown a request's objects are read concurrently, as a plain-GET loader
reads them: a request of several objects does not pay one round trip after another; and
requests queue their reads in order, so the GET threads serve the request the training
loop waits for first."""

from __future__ import annotations

import functools
import io
import threading
import time
from typing import Any

import numpy as np
import pytest

from hapi.models import decode_object
from hapi.sdk import NoSuchKey
from hapi.sdk.datasets import _compute
from hapi.sdk.datasets._compute import GET_THREADS, RUN_EVERY, Batch, Engine, Spec
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


def test_a_requests_objects_are_read_concurrently_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _Store()
    spec = Spec(endpoints=(), registry_bucket="models", manifest=manifest(), freeze=3, split=None)
    engine = Engine(spec, s3=store)
    keys = [f"images/{n}.jpg" for n in range(2 * GET_THREADS)]
    monkeypatch.setattr(engine, "decode_and_run", lambda bucket, got, here: [k for k, _ in got])
    assert engine.start("data", keys).wait()() == keys  # queued at start, taken as they come
    assert store.most == GET_THREADS  # all in flight together, never more than the pool


class _Recording:
    """A boto3 stand-in that records the order its GETs start in; the first GET of
    ``hold`` waits for ``release``."""

    def __init__(self, hold: str | None = None, bodies: dict[str, bytes] | None = None) -> None:
        self.bodies = bodies or {}
        self.keys: list[str] = []
        self.hold = hold
        self.holding = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.done: list[str] = []  # GETs answered, in order

    def get_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        with self.lock:
            self.keys.append(Key)
        if Key == self.hold:
            self.holding.set()
            self.release.wait(WAIT)
        time.sleep(0.001)  # long enough for the fetch threads to race
        with self.lock:
            self.done.append(Key)
        return {"Body": _Body(self.bodies.get(Key, Key.encode()))}


def _one_get_thread(monkeypatch: pytest.MonkeyPatch, store: _Recording) -> Engine:
    """An engine whose single GET thread starts reads in the order they were queued."""
    monkeypatch.setattr(_compute, "GET_THREADS", 1)
    spec = Spec(endpoints=(), registry_bucket="models", manifest=manifest(), freeze=3, split=None)
    engine = Engine(spec, s3=store)

    def keys_only(bucket: str, objects: list[tuple[str, bytes]], arrived: Any) -> list[str]:
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


@pytest.mark.parametrize("threads", [1, GET_THREADS])
def test_each_object_is_decoded_while_the_reads_behind_it_are_on_the_link(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    # Before: the compute got the objects only once every read was done, so a DataLoader
    # worker's link idled while it decoded, and its CPU while it read.
    keys = [f"images/{n:04d}.jpg" for n in range(8)]
    store = _Recording(hold=keys[-1])  # the last read waits until the first is decoded
    monkeypatch.setattr(_compute, "GET_THREADS", threads)
    spec = Spec(endpoints=(), registry_bucket="models", manifest=manifest(), freeze=3, split=None)
    engine = Engine(spec, s3=store)
    answered_at_decode: dict[str, list[str]] = {}

    def decode(bucket: str, objects: Any, arrived: Any) -> list[str]:
        for key, data in objects:
            assert data == key.encode()
            with store.lock:
                answered_at_decode[key] = list(store.done)
            store.release.set()
        return list(answered_at_decode)

    monkeypatch.setattr(engine, "decode_and_run", decode)
    assert engine.start("data", keys).wait()() == keys
    assert keys[-1] not in answered_at_decode[keys[0]]  # decoded before the last read ended
    if threads == 1:
        assert store.done == keys  # one thread reads them in order


def test_a_failed_read_fails_its_batch_and_drops_the_reads_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = [f"images/{n:04d}.jpg" for n in range(16)]

    class _Failing(_Recording):
        def get_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
            if Key == keys[1]:
                from botocore.exceptions import ClientError

                raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "gone"}}, "GetObject")
            return super().get_object(Bucket=Bucket, Key=Key)

    store = _Failing(hold=keys[2])  # holds the pool's one thread until released
    engine = _one_get_thread(monkeypatch, store)
    with pytest.raises(NoSuchKey, match="gone"):
        engine.start("data", keys).wait()()
    store.release.set()
    engine.reads.shutdown(wait=True)
    assert store.keys == [keys[0], keys[2]]  # the reads queued behind the failure never ran


def _jpeg(shade: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (40, 30), (shade, 255 - shade, shade // 2)).save(out, "JPEG", quality=95)
    return out.getvalue()


def _recording_run(engine: Engine, store: _Recording, monkeypatch: pytest.MonkeyPatch) -> list:
    """Record each run of the blocks: its samples and the reads answered by then; a run
    releases the held read."""
    runs: list[tuple[int, list[str]]] = []

    def run(inputs: np.ndarray, start: int, stop: int) -> np.ndarray:
        assert (start, stop) == (0, 3)
        with store.lock:
            runs.append((len(inputs), list(store.done)))
        store.release.set()  # the held read goes on once the blocks have run on some
        return inputs.reshape(len(inputs), -1).mean(axis=1, keepdims=True).astype(np.float32)

    monkeypatch.setattr(engine, "run", run)
    return runs


def test_the_blocks_run_while_later_reads_are_on_the_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the blocks ran once, on the whole request, after its last read.
    keys = [f"images/{n:04d}.jpg" for n in range(3 * RUN_EVERY + 1)]
    bodies = {key: _jpeg(20 * n) for n, key in enumerate(keys)}
    store = _Recording(hold=keys[-1], bodies=bodies)
    spec = Spec(endpoints=(), registry_bucket="models", manifest=manifest(), freeze=3, split=None)
    engine = Engine(spec, s3=store)
    runs = _recording_run(engine, store, monkeypatch)
    batch = engine.start("data", keys).wait()()
    assert len(runs) >= 2 and sum(size for size, _ in runs) == len(keys)
    assert all(size >= RUN_EVERY for size, _ in runs[:-1])
    assert keys[-1] not in runs[0][1]  # the first blocks ran before the last read ended
    assert batch.objects == keys
    preprocess = spec.manifest.preprocess
    expected = [decode_object(bodies[key], preprocess, key=key)[0].array.mean() for key in keys]
    np.testing.assert_allclose(batch.features[:, 0], expected, rtol=1e-6)  # rows in key order
    assert batch.nbytes == sum(map(len, bodies.values()))


def test_objects_read_before_their_turn_run_together(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs of RUN_EVERY samples whatever the link cost ResNet18's blocks 0.6-1.3 ms a
    # sample more than one run on the request (a DataLoader of 2 workers on loopback).
    keys = [f"images/{n:04d}.jpg" for n in range(3 * RUN_EVERY + 1)]
    bodies = {key: _jpeg(20 * n) for n, key in enumerate(keys)}
    store = _Recording(bodies=bodies)
    spec = Spec(endpoints=(), registry_bucket="models", manifest=manifest(), freeze=3, split=None)
    engine = Engine(spec, s3=store)
    runs = _recording_run(engine, store, monkeypatch)
    reads = engine.start("data", keys)
    deadline = time.monotonic() + WAIT
    while len(store.done) < len(keys) and time.monotonic() < deadline:
        time.sleep(0.001)  # every read answered before the compute starts
    assert len(store.done) == len(keys)
    batch = reads.wait()()
    assert [size for size, _ in runs] == [len(keys)]
    assert batch.objects == keys


def test_the_blocks_run_on_what_is_decoded_whenever_the_next_object_is_awaited() -> None:
    # decode_and_run with a scripted answer to "has the next object arrived?".
    keys = [f"images/{n:04d}.jpg" for n in range(7)]
    objects = [(key, _jpeg(30 * n)) for n, key in enumerate(keys)]
    spec = Spec(endpoints=(), registry_bucket="models", manifest=manifest(), freeze=3, split=None)
    engine = Engine(spec, s3=None)
    sizes: list[int] = []

    def run(inputs: np.ndarray, start: int, stop: int) -> np.ndarray:
        sizes.append(len(inputs))
        return inputs.reshape(len(inputs), -1)[:, :1].astype(np.float32)

    engine.run = run  # type: ignore[method-assign]
    awaited = {2, 6}  # the objects still on the link when the one before them is decoded
    following = 0

    def handed_out() -> Any:
        nonlocal following
        for index, item in enumerate(objects):
            following = index + 1
            yield item

    batch = engine.decode_and_run("data", handed_out(), lambda: following not in awaited)
    # 0-1 decoded, 2 awaited: run 2; 3 and 4 here when 2 and 3 are decoded: wait; 5
    # decoded, 6 awaited: run 4 (2-5); then the rest, 1.
    assert RUN_EVERY == 2 and sizes == [2, 4, 1]
    assert batch.objects == keys
