"""Who runs on a state directory: one ``hapi up`` at a time, and what a killed one left.

``hapi up`` holds an exclusive ``flock`` on ``STATE/hapi.lock`` while it runs and keeps
``STATE/hapi.json`` (its pid, the gateway's URL, the store's weed pid) beside it. The kernel
releases the lock however the holder ends, so a held lock means a live ``hapi up``; a
``hapi.json`` found with the lock free is what a killed one left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Self

_LOCK = "hapi.lock"
_RECORD = "hapi.json"
_STOP_WAIT_S = 10.0


@dataclass(frozen=True)
class RunRecord:
    """What a running ``hapi up`` writes about itself."""

    pid: int
    url: str
    store_url: str
    weed_pid: int | None = None


class AlreadyRunning(Exception):
    """Another ``hapi up`` holds the state directory."""

    def __init__(self, record: RunRecord | None) -> None:
        self.record = record
        where = f" (pid {record.pid}, {record.url})" if record else ""
        how = f"kill {record.pid}" if record else "stop it"
        super().__init__(
            f"hapi is already running{where}; nothing was changed. "
            f"Use that one, or stop it first (Ctrl-C in its terminal, or {how})."
        )


class RunLock:
    """The state directory's lock, held for the life of one ``hapi up``."""

    def __init__(self, state_dir: Path, fd: int) -> None:
        self.state_dir = state_dir
        self._fd = fd

    @classmethod
    def acquire(cls, state_dir: Path) -> Self:
        """Take the lock, or raise :class:`AlreadyRunning` naming the holder."""
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(state_dir / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(read_record(state_dir)) from None
        return cls(state_dir, fd)

    def write(self, record: RunRecord) -> None:
        """Publish ``record`` for a second ``hapi up`` to report."""
        path = self.state_dir / _RECORD
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(record)) + "\n", encoding="utf-8")
        tmp.replace(path)

    def release(self) -> None:
        """Remove the record and drop the lock (a clean stop leaves nothing stale)."""
        (self.state_dir / _RECORD).unlink(missing_ok=True)
        os.close(self._fd)


def read_record(state_dir: Path) -> RunRecord | None:
    """The record a ``hapi up`` left in ``state_dir``, or None."""
    try:
        data = json.loads((state_dir / _RECORD).read_text(encoding="utf-8"))
        return RunRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def clean_stale(state_dir: Path, store_dir: Path) -> str | None:
    """Clean up after a ``hapi up`` that was killed; call with the lock held.

    Stops the weed it started if that still runs on ``store_dir`` (an older hapi, or a kill
    that the parent-death signal could not cover), and removes the record.

    Returns:
        One line saying what was found and done, or None when nothing was stale.
    """
    record = read_record(state_dir)
    (state_dir / _RECORD).unlink(missing_ok=True)
    if record is None:
        return None
    stopped = ""
    if record.weed_pid is not None and _is_weed_on(record.weed_pid, store_dir):
        _stop(record.weed_pid)
        stopped = f"; stopped its store (weed pid {record.weed_pid})"
    return f"cleaned up after a hapi up that did not stop cleanly (pid {record.pid}){stopped}"


def _is_weed_on(pid: int, store_dir: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and argv[0].endswith(b"weed") and f"-dir={store_dir}".encode() in argv


def _stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_WAIT_S
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
