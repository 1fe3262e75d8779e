"""What the tests of the testbeds' shaped links share: a file server in a namespace, a
timed reader, and the floor a link shaped as a link sets on a burst.

Both testbeds (the two-tier ``Link`` and the cluster's ``Network``) are reachable from the
root namespace, so a server is probed from here whichever namespace it runs in.
"""

from __future__ import annotations

import contextlib
import http.client
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

PORT = 8000
PEAK_PACKET = 64 * 1024  # the one GSO packet a shaped link may let out at once
PEAK_OVER_RATE = 1.02  # and the rest no faster than this over its rate


@contextlib.contextmanager
def serving(prefix: Sequence[str], address: str, root: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m http.server`` on ``address``:8000 serving ``root``, run under ``prefix``
    (a namespace's ``ip netns exec ...``, or none), from when it accepts connections until
    the block ends."""
    server = subprocess.Popen(
        [*prefix, sys.executable, "-m", "http.server", str(PORT), "--bind", address,
         "--directory", str(root), "--protocol", "HTTP/1.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_until_accepting(server, address)
        yield server
    finally:
        server.terminate()
        server.wait(10)


def _wait_until_accepting(server: subprocess.Popen[bytes], address: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            http.client.HTTPConnection(address, PORT, timeout=1).connect()
            return
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise AssertionError(f"the HTTP server on {address} did not start")


# Three GETs of /object, each after 0.3 s idle (the buckets fill): the fastest one's seconds.
_TIMED_GETS = """
import http.client, sys, time
connection = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=30)
took = []
for _ in range(3):
    time.sleep(0.3)
    started = time.perf_counter()
    connection.request("GET", "/object")
    assert len(connection.getresponse().read()) == int(sys.argv[3])
    took.append(time.perf_counter() - started)
print(min(took))
"""


def fastest_idle_get(prefix: Sequence[str], address: str, size: int) -> float:
    """Seconds of the fastest of three GETs of ``/object`` (``size`` bytes) from
    ``address``, each after an idle moment, by a client run under ``prefix``."""
    timed = [*prefix, sys.executable, "-c", _TIMED_GETS, address, str(PORT), str(size)]
    return float(subprocess.run(timed, capture_output=True, text=True, check=True).stdout)


def burst_floor_s(size: int, rate_bps: float) -> float:
    """The least time ``size`` bytes after an idle moment may take on a link shaped to
    ``rate_bps``: one GSO packet at once, the rest no faster than the peak rate. Stated
    here as the requirement, not imported from the shaper, so a change of the shaper's
    constants must change the tests too."""
    return (size - PEAK_PACKET) * 8 / (rate_bps * PEAK_OVER_RATE)
