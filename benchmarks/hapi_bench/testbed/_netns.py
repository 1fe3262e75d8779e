"""A bandwidth-limited link: a network namespace for the storage tier, a veth pair to it.

The client tier stays in the root namespace. Both ends of the veth get a ``tc tbf``
qdisc at the same rate (so requests and responses are shaped alike); the address pair is
a private ``/30`` in ``10.203.0.0/16`` picked from the process id, so runs side by side
do not collide. Names carry the process id (``hapi-bench-<pid>``), so a leftover is
traceable to the run that made it. :meth:`Link.destroy` is idempotent and is the only
teardown needed: it ends every process left in the namespace, then deletes the
namespace, which takes the veth pair with it.

Safety comes first: before anything else is made, a blackhole route for the pair's
``/30`` goes into the root namespace with the largest metric, so the veth's own route
wins while it exists and no packet for the storage address can leave by the default
route while the link is half built or after it is gone; it is removed last.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hapi_bench.core._errors import BenchError, TestbedUnavailable

PREFIX = "hapi-bench-"
BLACKHOLE_METRIC = "4294967295"  # the least preferred route: any real route wins
_SUBNET = ipaddress.IPv4Network("10.203.0.0/16")
# tbf's queue: 100 ms of traffic, and at slow rates enough for the loaders' four flows to
# start at once (their initial windows are ten frames each) and grow. With 100 ms alone,
# about 20 frames at 1.7 Mbit/s, 9-19% of the frames were dropped, a GET stalled in a
# retransmission timeout held its whole batch back, and the pipelines read 1.2-1.36
# efficiency in cells where the link should have been busy throughout.
_QUEUE_S = 0.1
_MIN_QUEUE = 256 * 1024
# Larger than a full-size frame (tbf drops a non-GSO packet larger than its bucket and
# segments GSO ones), small enough that a slow link cannot burst far beyond its rate.
# (Measured here: 10 ms buckets lost up to 40% of the rate at 20 Mbit/s; 20 ms and 16 KiB
# kept every rate from 1 to 80 Mbit/s within 5%.)
_MIN_BURST = 16 * 1024
# How fast the bucket may drain: a link passes nothing faster than its rate, but tbf lets a
# full bucket out at the veth's speed, and from 100 Mbit/s up the bucket (20 ms) outgrew a
# response: 80 KiB after an idle moment crossed "100 Mbit/s" in 0.6-0.9 ms, not 6.6, and
# the SDK's link estimate read 3.8 Gbit/s there (the head to head, 2026-12-04). A second
# bucket of one GSO packet (64 KiB) filled at just above the rate lets a burst out no
# larger than that: 2.1 ms, the bulk rate unchanged at 100 Mbit/s (95.2-95.9 Mbit/s with
# it and without) and 2.5% lower at 1 Gbit/s (806-821 against 832-842 Mbit/s on veth).
_PEAK_OVER_RATE = 1.02
_PEAK_BUCKET = 64 * 1024
SHAPING = f"tc tbf, in bursts of one {_PEAK_BUCKET // 1024} KiB packet at most"
"""How the link is shaped, as the benchmarks' reports say it."""


def tbf_burst(rate_bps: float) -> int:
    """Bucket size for ``rate_bps``: 20 ms of traffic, at least 16 KiB."""
    return max(_MIN_BURST, int(rate_bps / 8 / 50))


def tbf_limit(rate_bps: float) -> int:
    """Bytes tbf queues before it drops: 100 ms of traffic, at least 256 KiB."""
    return max(_MIN_QUEUE, int(rate_bps / 8 * _QUEUE_S))


def tbf(rate_bps: float) -> list[str]:
    """``tc``'s words for a ``tbf`` qdisc that passes ``rate_bps`` as a link would: its
    bucket (:func:`tbf_burst`) drained no faster than 2% over the rate beyond one 64 KiB
    GSO packet, so a response after an idle moment does not cross at the veth's speed,
    and its queue (:func:`tbf_limit`)."""
    return [
        "tbf",
        "rate",
        f"{int(rate_bps)}bit",
        "burst",
        str(tbf_burst(rate_bps)),
        "limit",
        str(tbf_limit(rate_bps)),
        "peakrate",
        f"{int(rate_bps * _PEAK_OVER_RATE)}bit",
        "mtu",
        str(_PEAK_BUCKET),
    ]


def run(*command: str, check: bool = True) -> str:
    """Run a command; its stdout, or :class:`BenchError` with its first error line."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"`{' '.join(command)}` failed: {exc}") from exc
    if check and done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise BenchError(
            f"`{' '.join(command)}` failed: {reason[0] if reason else done.returncode}"
        )
    return done.stdout


def pick_subnet(seed: int, taken: str) -> ipaddress.IPv4Network:
    """A free ``/30`` of ``10.203.0.0/16`` chosen from ``seed``: none of its addresses in
    use, and no route for it (a crashed run's blackhole, which the link's own could not
    replace); ``taken`` is ``ip addr`` and ``ip route`` output."""
    subnets = list(_SUBNET.subnets(new_prefix=30))
    for offset in range(len(subnets)):
        subnet = subnets[(seed + offset) % len(subnets)]
        hosts = [str(h) for h in subnet.hosts()]
        routed = re.search(rf"(?<![\d.]){re.escape(str(subnet))}(?!\d)", taken)
        if not routed and not any(f"inet {h}/" in taken for h in hosts):
            return subnet
    raise BenchError("no free /30 left in 10.203.0.0/16")


class Link:
    """The namespace, the veth pair and its shaping.

    Args:
        tag: Makes the names unique; the process id by default.
    """

    def __init__(self, tag: str | None = None) -> None:
        tag = tag or str(os.getpid())
        self.namespace = PREFIX + tag
        self.host_if = f"hb{tag}h"[:15]
        self.ns_if = f"hb{tag}n"[:15]
        taken = run("ip", "-o", "-4", "addr") + run("ip", "-4", "route", "show", "table", "all")
        self.subnet = pick_subnet(int(tag) if tag.isdigit() else hash(tag), taken)
        host, storage = list(self.subnet.hosts())
        self.host_ip, self.storage_ip = str(host), str(storage)
        self.rate_bps: float | None = None
        self._created = False
        self._blackhole = False

    def _ns(self, *command: str) -> str:
        return run("ip", "netns", "exec", self.namespace, *command)

    def create(self) -> None:
        """Make the namespace and the veth pair, address them and bring them up.

        Raises:
            TestbedUnavailable: The kernel refused (no CAP_NET_ADMIN / CAP_SYS_ADMIN).
        """
        self._created = True
        prefix = self.subnet.prefixlen
        try:
            run("ip", "route", "add", "blackhole", str(self.subnet), "metric", BLACKHOLE_METRIC)
            self._blackhole = True
            run("ip", "netns", "add", self.namespace)
            run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            run("ip", "link", "set", self.ns_if, "netns", self.namespace)
            run("ip", "addr", "add", f"{self.host_ip}/{prefix}", "dev", self.host_if)
            run("ip", "link", "set", self.host_if, "up")
            self._ns("ip", "addr", "add", f"{self.storage_ip}/{prefix}", "dev", self.ns_if)
            self._ns("ip", "link", "set", self.ns_if, "up")
            self._ns("ip", "link", "set", "lo", "up")
        except BenchError as exc:
            self.destroy()
            raise TestbedUnavailable(f"cannot create the testbed's network: {exc}") from exc

    def shape(self, rate_bps: float) -> None:
        """Limit both directions to ``rate_bps`` (``tc qdisc replace ... tbf``), bursts
        to one GSO packet."""
        args = ["root", *tbf(rate_bps)]
        run("tc", "qdisc", "replace", "dev", self.host_if, *args)
        self._ns("tc", "qdisc", "replace", "dev", self.ns_if, *args)
        self.rate_bps = rate_bps

    def unshape(self) -> None:
        """Remove the shaping (the veth then runs at memory speed)."""
        run("tc", "qdisc", "del", "dev", self.host_if, "root", check=False)
        run(
            "ip",
            "netns",
            "exec",
            self.namespace,
            "tc",
            "qdisc",
            "del",
            "dev",
            self.ns_if,
            "root",
            check=False,
        )
        self.rate_bps = None

    @contextlib.contextmanager
    def unshaped(self) -> Iterator[None]:
        """Lift the shaping for setup traffic (model blocks, warm-up), then restore it."""
        rate = self.rate_bps
        self.unshape()
        try:
            yield
        finally:
            if rate is not None:
                self.shape(rate)

    def queue_stats(self) -> tuple[int, int]:
        """Frames the storage tier's end has sent through its shaping queue, and frames
        the queue dropped (``tc -s qdisc``; counted since the last :meth:`shape`)."""
        out = self._ns("tc", "-s", "qdisc", "show", "dev", self.ns_if)
        found = re.search(r"Sent \d+ bytes (\d+) pkt \(dropped (\d+)", out)
        if found is None:
            raise BenchError(f"no queue statistics for {self.ns_if}: {out.strip()[:200]}")
        return int(found.group(1)), int(found.group(2))

    def retransmission_timeouts(self) -> int:
        """TCP retransmission timeouts in the storage tier's namespace since it was made
        (``TCPTimeouts`` of its own ``/proc/net/netstat``)."""
        lines = self._ns("cat", "/proc/net/netstat").splitlines()
        for names, values in zip(lines[::2], lines[1::2], strict=False):
            if names.startswith("TcpExt:"):
                return int(dict(zip(names.split(), values.split(), strict=True))["TCPTimeouts"])
        raise BenchError("no TcpExt counters in the namespace's /proc/net/netstat")

    def rx_bytes(self) -> int:
        """Bytes the client's end has received (what crossed from the storage tier)."""
        return int(Path(f"/sys/class/net/{self.host_if}/statistics/rx_bytes").read_text())

    def pids(self) -> list[int]:
        """Processes running in the namespace."""
        out = run("ip", "netns", "pids", self.namespace, check=False)
        return [int(pid) for pid in out.split()]

    def destroy(self, grace_s: float = 5.0) -> None:
        """End what runs in the namespace (SIGTERM, then SIGKILL), delete it and the veth,
        and the blackhole last, once both are gone.

        Safe to call twice and after a partial :meth:`create`.
        """
        if not self._created:
            return
        if self.namespace in namespaces():
            _end(self.pids, grace_s)
            run("ip", "netns", "del", self.namespace, check=False)
        run("ip", "link", "del", self.host_if, check=False)
        gone = (
            self.namespace not in namespaces()
            and not Path(f"/sys/class/net/{self.host_if}").exists()
        )
        if self._blackhole and gone:
            run("ip", "route", "del", "blackhole", str(self.subnet), check=False)
            self._blackhole = False
        self._created = self._blackhole  # something was left: a later call tries again


def namespaces() -> list[str]:
    """Names of the network namespaces (``ip netns list``)."""
    return [
        line.split()[0] for line in run("ip", "netns", "list", check=False).splitlines() if line
    ]


def _end(pids: Callable[[], list[int]], grace_s: float) -> None:
    """SIGTERM what ``pids()`` lists, wait up to ``grace_s``, then SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        alive = pids()
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = pids()
        if not alive:
            return
