"""Pushdown's bulk work scheduled below the gateway's request handling.

A node busy with pushdown still answers everything else: the event loop's requests
(pass-through, cache hits, the control plane) and the store beside it run at the gateway's
own priority, and the threads that decode and run blocks (and the threads they start,
onnxruntime's among them, and the decode worker processes) run ``compute_niceness`` nice
steps below it. The scheduler is work-conserving, so an idle node gives pushdown the whole
core; a busy one serves the cheap requests first (docs/operations.md). Linux schedules each
thread by its own nice value, and a new thread or process starts at its creator's.
"""

from __future__ import annotations

import os
import sys
import threading

MAX_NICENESS = 19  # the kernel's lowest priority


def applies() -> bool:
    """Whether a thread's nice value can be set apart from its process's (Linux)."""
    return sys.platform.startswith("linux")


def bulk_niceness(steps: int) -> int:
    """The nice value of bulk work: ``steps`` below the calling thread's, at most 19."""
    return min(MAX_NICENESS, _niceness() + steps)


def lower_this_thread(target: int) -> None:
    """Run the calling thread at nice value ``target``, or leave it where it is when it
    already runs at that or below (a thread's priority is only ever lowered here: an
    unprivileged process cannot raise it again)."""
    if applies() and _niceness() < target:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), target)


def _niceness() -> int:
    """The calling thread's nice value (its process's where threads have none apart)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id() if applies() else 0)
