"""Pushdown's bulk work below the request handling: each thread's nice value as the kernel
reports it (``/proc/self/task/<tid>/stat``), for the steps asked, the threads those start,
the cap, and the settings that refuse what the kernel cannot do."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hapi.gateway import GatewaySettings
from hapi.gateway.pushdown._priority import applies, bulk_niceness, lower_this_thread
from hapi.protocol import Credentials

pytestmark = pytest.mark.skipif(not applies(), reason="per-thread nice values are Linux's")


def _nice(tid: int) -> int:
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])  # field 19, after the command's name


def _in_thread(target: int | None, *, child: bool = False) -> tuple[int, int | None]:
    """The nice values of a thread that lowered itself to ``target`` (None: did not), and
    of a thread that thread started (when ``child``)."""
    seen: list[int | None] = [None, None]

    def grandchild() -> None:
        seen[1] = _nice(threading.get_native_id())

    def run() -> None:
        if target is not None:
            lower_this_thread(target)
        seen[0] = _nice(threading.get_native_id())
        if child:
            inner = threading.Thread(target=grandchild)
            inner.start()
            inner.join()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen[0] is not None
    return seen[0], seen[1]


def test_a_thread_lowered_runs_steps_below_its_creator_and_its_own_threads_with_it() -> None:
    here = _nice(threading.get_native_id())
    for steps in (1, 3, 10):
        if here + steps > 19:
            continue
        lowered, started = _in_thread(bulk_niceness(steps), child=True)
        assert (lowered, started) == (here + steps, here + steps), steps
    assert _nice(threading.get_native_id()) == here  # the caller's own priority untouched


def test_no_steps_leave_a_thread_at_the_requests_priority() -> None:
    here = _nice(threading.get_native_id())
    assert _in_thread(bulk_niceness(0)) == (here, None)
    assert _in_thread(None) == (here, None)


def test_the_nice_value_stops_at_the_kernels_lowest_priority() -> None:
    assert bulk_niceness(40) == 19
    assert _in_thread(bulk_niceness(40))[0] == 19


def test_a_thread_already_lower_is_never_raised() -> None:
    here = _nice(threading.get_native_id())
    low, higher = min(19, here + 5), min(19, here + 2)
    seen: list[int] = []

    def run() -> None:
        lower_this_thread(low)
        lower_this_thread(higher)  # a second, higher target: no effect
        seen.append(_nice(threading.get_native_id()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [low]


@pytest.mark.parametrize("steps", [-1, 20, 100])
def test_settings_refuse_steps_the_kernel_has_not(steps: int) -> None:
    with pytest.raises(ValueError, match="compute_niceness"):
        _settings(compute_niceness=steps)


def test_settings_default_to_ten_steps_below() -> None:
    assert _settings().compute_niceness == 10


def test_decoding_goes_five_steps_further_unless_that_passes_the_lowest() -> None:
    assert _settings().decode_niceness == 5
    assert _settings(compute_niceness=19, decode_niceness=0).decode_niceness == 0
    for compute, decode in ((15, 5), (0, 20), (10, -1)):
        with pytest.raises(ValueError, match="decode_niceness must be 0"):
            _settings(compute_niceness=compute, decode_niceness=decode)


def _settings(**changes: object) -> GatewaySettings:
    return GatewaySettings(
        backend_url="http://127.0.0.1:1",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        allow_anonymous=True,
    ).with_changes(**changes)
