"""The testbed's shaped link, for real: a namespace, a veth pair, ``tc tbf``, and HTTP.

The loaders keep four GETs in flight and consume their objects in order, a batch at a
time, so a flow that loses packets holds its whole batch back. With a queue of 100 ms at
1.7 Mbit/s (about 20 frames) four flows' initial windows overflowed it: 10-19% of the
frames were dropped, single GETs of 30 KB stalled for 1.8 s in retransmission timeouts
while the other flows moved nine objects, and VGG11's balanced cell read 1.22-1.36
pipeline efficiency where the link and the client were both idle half a second at a time.
A real link's buffer holds that much; the testbed's must too. About 10 s; needs root,
``ip`` and ``tc``.

What the test may assert follows from the link's arithmetic. Each flow has one response in
flight at a time, so the queue never holds more than every flow's whole response (about
130 KB here, under the 256 KiB limit): a frame dropped is the defect itself, and no frame
may be. Without drops a GET still waits: every round trip of its window behind at most that
queue (``drain_s``), and the queue's delay grows faster than the RTT the first packets
measured, so the storage side sees spurious retransmission timeouts (0-2 a run). Such a
timeout fires before the ACK it gave up on, so within ``drain_s``, and at worst (F-RTO
usually undoes it) restarts the window at one frame: the GET then needs the slow start's
round trips over again. Its bound is that; a GET that stalled on a loss is caught by the
drop count, which the old 100 ms queue (about 21 KB) broke in every run (four initial
windows are 60 KB: 64 and 157 frames dropped in two runs).
"""

from __future__ import annotations

import contextlib
import http.client
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hapi_bench.testbed._netns import Link, tbf_limit
from tests.bench.links import PORT, burst_floor_s, fastest_idle_get, serving

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc")),
    reason="needs root, ip and tc",
)

RATE_BPS = 1.7e6  # VGG11's balanced cell
OBJECT_BYTES = 31_000  # the testbed's mean JPEG
FLOWS = 4  # the loaders' GETs in flight
PER_FLOW = 10
FRAME_BYTES = 1514  # a full Ethernet frame on the veth
SEGMENT_BYTES = 1448  # its TCP payload (MSS with timestamps)
HEADER_BYTES = 300  # http.server's response headers, at most


def _get_all(host: str) -> list[float]:
    """``FLOWS`` keep-alive connections, ``PER_FLOW`` GETs each; every GET's seconds."""
    took: list[float] = []
    failures: list[BaseException] = []

    def flow() -> None:
        try:
            connection = http.client.HTTPConnection(host, PORT, timeout=60)
            for _ in range(PER_FLOW):
                started = time.perf_counter()
                connection.request("GET", "/object")
                body = connection.getresponse().read()
                took.append(time.perf_counter() - started)
                assert len(body) == OBJECT_BYTES
        except BaseException as exc:  # reported in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=flow) for _ in range(FLOWS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    return took


@contextlib.contextmanager
def _shaped(root: Path, tag: int, rate_bps: float, size: int) -> Iterator[Link]:
    """A link shaped to ``rate_bps`` with an HTTP server in its namespace serving
    ``/object`` of ``size`` random bytes; everything removed after."""
    (root / "object").write_bytes(os.urandom(size))
    link = Link(str(tag + os.getpid() % 10_000))
    try:
        link.create()
        link.shape(rate_bps)
        with serving(("ip", "netns", "exec", link.namespace), link.storage_ip, root):
            yield link
    finally:
        link.destroy()


def test_four_flows_of_objects_cross_the_shaped_link_without_losses(tmp_path: Path) -> None:
    with _shaped(tmp_path, 90_000, RATE_BPS, OBJECT_BYTES) as link:
        took = _get_all(link.storage_ip)
        sent, dropped = link.queue_stats()
        timeouts = link.retransmission_timeouts()

    assert len(took) == FLOWS * PER_FLOW
    assert sent > FLOWS * PER_FLOW * OBJECT_BYTES // 1514  # the responses went through it
    frames = math.ceil((OBJECT_BYTES + HEADER_BYTES) / SEGMENT_BYTES)
    in_flight = FLOWS * frames * FRAME_BYTES  # every flow's whole response
    assert in_flight < tbf_limit(RATE_BPS), "the queue must hold every response in flight"
    assert dropped == 0, f"the link dropped {dropped} of {sent + dropped} frames"
    # Loss-free, a GET's round trips each wait behind at most the queue; a spurious
    # timeout costs one more and the slow start from one frame again (see above).
    drain_s = in_flight * 8 / RATE_BPS
    slow_start = math.ceil(math.log2(frames + 1))  # round trips from a window of one frame
    bound_s = (slow_start + 2) * drain_s
    assert max(took) < bound_s, (
        f"a GET took {max(took):.2f} s (bound {bound_s:.2f} s: {slow_start + 2} round trips "
        f"of {drain_s:.2f} s; {timeouts} retransmission timeouts on the storage side)"
    )


def _route_to(address: str) -> str:
    """How the kernel routes ``address``; "unroutable" where it refuses (a blackhole)."""
    found = subprocess.run(
        ["ip", "-o", "route", "get", address], capture_output=True, text=True, check=False
    )
    return found.stdout if found.returncode == 0 else "unroutable"


def test_no_packet_for_the_storage_address_leaves_by_the_default_route() -> None:
    link = Link(str(80_000 + os.getpid() % 10_000))
    try:
        link.create()
        assert f"dev {link.host_if}" in _route_to(link.storage_ip)  # the veth's route wins
        subprocess.run(["ip", "link", "del", link.host_if], check=True)  # the veth is gone
        assert _route_to(link.storage_ip) == "unroutable"  # not by the default route
    finally:
        link.destroy()
    blackholes = subprocess.run(
        ["ip", "route", "show", "type", "blackhole"], capture_output=True, text=True, check=True
    ).stdout
    assert str(link.subnet) not in blackholes  # removed last, with nothing of the link left
    assert (
        link.namespace
        not in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout
    )


def test_a_link_starts_beside_a_route_a_crashed_run_left_on_its_subnet() -> None:
    tag = str(60_000 + os.getpid() % 10_000)
    stale = Link(tag).subnet  # where a link of this tag goes on a clean machine
    route = ["ip", "route", "add", "blackhole", str(stale), "metric", "4294967295"]
    subprocess.run(route, check=True)  # what a run killed before its teardown leaves
    try:
        link = Link(tag)
        try:
            link.create()  # refused before: its own blackhole for that /30 existed already
            assert link.subnet != stale
            assert f"dev {link.host_if}" in _route_to(link.storage_ip)
        finally:
            link.destroy()
    finally:
        subprocess.run(["ip", "route", "del", "blackhole", str(stale)], check=True)


def test_a_full_bucket_lets_out_no_more_than_one_gso_packet_at_the_veth_s_speed(
    tmp_path: Path,
) -> None:
    # At 100 Mbit/s tbf's bucket is 20 ms (250 kB): without a peak rate, a response of
    # 240 kB after an idle moment crossed at the veth's speed (about 2 ms) instead of the
    # link's. A link passes nothing faster than its rate; the shaper may let one 64 KiB
    # packet out at once, and the rest no faster than the peak rate (2% over the rate).
    rate, size = 100e6, 240_000
    with _shaped(tmp_path, 70_000, rate, size) as link:
        took = fastest_idle_get((), link.storage_ip, size)
    assert took >= burst_floor_s(size, rate), f"{size} B crossed in {took * 1e3:.1f} ms"
