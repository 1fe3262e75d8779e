"""Decoding in worker processes, off the gateway's interpreter lock.

Pillow releases the interpreter lock while it decodes and resizes, but not while it parses
headers, runs its Python-level load loop, reads EXIF or converts to numpy: two decoding
threads ran at 0.75x the rate of two processes (docs/results.md). So with
``decode_processes`` set, each decoding thread hands its sample to a worker process and
waits for it (the lock released while it waits):

- a thread hands over a chunk of a window's samples at once (one message each way, not
  one a sample); the worker decodes them into a shared-memory slot its parent owns (one
  per worker, grown when a chunk's inputs need more), and the thread copies the slot into
  the window's rows; no
  segment is ever created by a worker, so a worker's death leaks nothing, and the parent
  unlinks every slot on close;
- a worker that dies (killed, out of memory) fails only the samples it held, with
  :class:`DecodeWorkerLost`; its replacement starts before the next sample is handed out.

Features are the same bits as decoding in a thread: the worker runs the same code
(:meth:`hapi.models.PendingSample.decode`).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from hapi.models import PendingSample, Preset, UndecodableObject

log = logging.getLogger(__name__)

_SPAWN = multiprocessing.get_context("spawn")  # the gateway has threads: never fork it
_START_TIMEOUT_S = 120.0  # a spawned worker imports numpy and Pillow first
_STOP_TIMEOUT_S = 5.0
_FIRST_SLOT_BYTES = 3 * 256 * 256 * 4  # float32 CHW at 256 px; grown on demand


class DecodeWorkerLost(RuntimeError):
    """The worker process decoding a sample died before it answered."""

    def __init__(self, keys: str, exitcode: int | None) -> None:
        how = "was killed" if exitcode is not None and exitcode < 0 else "exited"
        super().__init__(
            f"the decode worker for {keys} {how} (exit code {exitcode}) before it answered"
        )
        self.keys = keys


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    slot: SharedMemory
    ready: bool = False  # its first message (sent once its imports are done) was read

    def alive(self) -> bool:
        return self.process.is_alive()


class DecodeProcesses:
    """``count`` worker processes that decode and preprocess images for pushdown.

    Thread-safe: any number of threads may call :meth:`decode`; each call takes an idle
    worker (waiting for one while all are busy).

    Args:
        count: Worker processes (at least 1).
        initializer: Run by each worker as it starts (picklable: workers are spawned).
    """

    def __init__(self, count: int, *, initializer: Callable[[], object] | None = None) -> None:
        if count < 1:
            raise ValueError("decode processes must be at least 1")
        self.count = count
        self._initializer = initializer
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._closed = False
        for _ in range(count):
            self._idle.put(self._start(_FIRST_SLOT_BYTES))

    def __enter__(self) -> DecodeProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids (for operators and tests)."""
        return [w.process.pid for w in self._all if w.process.pid is not None and w.alive()]

    def decode(
        self,
        samples: Sequence[PendingSample],
        preset: Preset,
        *,
        max_pixels: int,
        out: np.ndarray,
    ) -> list[float]:
        """Decode ``samples`` into the rows of ``out`` (C-contiguous float32, one row a
        sample) in one worker, sent and answered as one message.

        Returns:
            The worker's CPU seconds for each sample.

        Raises:
            UndecodableObject: An image is corrupt, too large, or not an image (the
                samples after it are not decoded).
            DecodeWorkerLost: The worker died first (it is replaced).
        """
        worker = self._idle.get()
        try:
            if not worker.alive():  # it died idle: no sample of anyone's was lost
                worker = self._replace(worker)
            if worker.slot.size < out.nbytes:
                self._grow(worker, out.nbytes)
            reply = self._ask(worker, samples, preset, max_pixels, out.shape)
            if reply[0] == "ok":  # copied before the slot can take another job
                np.copyto(out, np.ndarray(out.shape, np.float32, buffer=worker.slot.buf))
        except DecodeWorkerLost:
            worker = self._replace(worker)
            raise
        finally:
            self._idle.put(worker)
        if reply[0] == "undecodable":
            raise UndecodableObject(reply[1], reply[2])
        seconds: list[float] = reply[1]
        return seconds

    def close(self) -> None:
        """Stop every worker and unlink every slot."""
        if self._closed:
            return
        self._closed = True
        for worker in self._all:
            _stop(worker)
        self._all.clear()

    def _ask(
        self,
        worker: _Worker,
        samples: Sequence[PendingSample],
        preset: Preset,
        max_pixels: int,
        shape: tuple[int, ...],
    ) -> tuple[Any, ...]:
        images = [(bytes(s.image), s.member or s.key, s.view) for s in samples]
        try:
            if not worker.ready:  # its first message says its imports are done
                worker.conn.recv()
                worker.ready = True
            worker.conn.send((worker.slot.name, shape, images, preset, max_pixels))
            reply: tuple[Any, ...] = worker.conn.recv()
        except (EOFError, OSError) as exc:
            worker.process.join(_STOP_TIMEOUT_S)
            keys = ", ".join(key for _, key, _ in images)
            raise DecodeWorkerLost(keys, worker.process.exitcode) from exc
        return reply

    def _start(self, slot_bytes: int) -> _Worker:
        slot = SharedMemory(create=True, size=slot_bytes)
        ours, theirs = _SPAWN.Pipe()
        process = _SPAWN.Process(
            target=_serve,
            args=(theirs, self._initializer),
            name="hapi-decode-worker",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            _unlink(slot)
            raise
        theirs.close()
        worker = _Worker(process, ours, slot)
        self._all.append(worker)
        return worker

    def _replace(self, worker: _Worker) -> _Worker:
        """A new worker in place of ``worker``, which ended; once closed, none."""
        if worker in self._all:
            self._all.remove(worker)
        _stop(worker)
        if self._closed:  # stopping: the pool is going away, nothing is restarted
            return worker
        log.warning(
            "decode worker %s ended (exit code %s); starting another",
            worker.process.pid,
            worker.process.exitcode,
        )
        return self._start(worker.slot.size)

    def _grow(self, worker: _Worker, size: int) -> None:
        """Give ``worker`` a slot of ``size`` bytes (it attaches the new one at its next
        job, by name)."""
        slot = SharedMemory(create=True, size=size)
        _unlink(worker.slot)
        worker.slot = slot


def _stop(worker: _Worker) -> None:
    try:
        worker.conn.close()  # the worker's recv ends: it returns
        worker.process.join(_STOP_TIMEOUT_S)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(_STOP_TIMEOUT_S)
    finally:
        _unlink(worker.slot)


def _unlink(slot: SharedMemory) -> None:
    slot.close()
    with contextlib.suppress(FileNotFoundError):  # already gone is what we want
        slot.unlink()


def _serve(conn: Connection, initializer: Callable[[], object] | None) -> None:
    """A worker's loop: decode each job into its slot until the parent closes the pipe."""
    slot: SharedMemory | None = None
    if initializer is not None:
        initializer()
    try:
        conn.send(("ready",))
        while True:
            name, shape, images, preset, max_pixels = conn.recv()
            if slot is None or slot.name != name:  # the first job, or the parent grew it
                if slot is not None:
                    slot.close()
                slot = _attach(name)
            conn.send(_decode_all(slot, shape, images, preset, max_pixels))
    except (EOFError, OSError):  # the parent closed the pipe, or went away
        pass
    finally:
        if slot is not None:
            slot.close()


def _decode_all(
    slot: SharedMemory,
    shape: tuple[int, ...],
    images: list[tuple[bytes, str, Any]],
    preset: Preset,
    max_pixels: int,
) -> tuple[Any, ...]:
    out = np.ndarray(shape, np.float32, buffer=slot.buf)
    seconds = []
    try:
        for index, (image, key, view) in enumerate(images):
            started = time.thread_time()
            sample = PendingSample(key, image, view=view)
            sample.decode(preset, max_pixels=max_pixels, out=out[index])
            seconds.append(time.thread_time() - started)
    except UndecodableObject as exc:
        return ("undecodable", exc.key, exc.reason)
    finally:
        del out  # no export of the slot's buffer may outlive the job
    return ("ok", seconds)


def _attach(name: str) -> SharedMemory:
    """Attach the parent's segment. A spawned worker shares its parent's resource tracker,
    so the segment stays registered once, to the parent, which unlinks it (and the tracker
    unlinks what is left if the gateway itself is killed)."""
    return SharedMemory(name=name)
