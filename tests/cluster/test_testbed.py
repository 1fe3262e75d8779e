"""The testbed itself: its safety net, its nodes, and a teardown that leaves nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hapi_bench.cluster._cluster import Testbed, TestbedSpec
from hapi_bench.cluster._cluster_net import Network
from hapi_bench.testbed._netns import namespaces, run

pytestmark = pytest.mark.cluster


def test_a_testbed_blackholes_its_range_and_leaves_nothing_behind(tmp_path: Path) -> None:
    testbed = Testbed(TestbedSpec(nodes=1, workdir=tmp_path))
    subnet = str(testbed.net.subnet)
    with testbed:
        assert f"blackhole {subnet}" in run("ip", "-4", "route", "show", "type", "blackhole")
        for role in ("ctl", "cli", "n1"):
            routes = run("ip", "netns", "exec", testbed.net.namespace(role), "ip", "route")
            assert "default" not in routes  # a node reaches its bridge and nothing else
        assert testbed.net.leftovers()
    assert testbed.net.leftovers() == []
    assert not [ns for ns in namespaces() if ns.startswith(testbed.net.namespace(""))]
    assert subnet not in run("ip", "-4", "route", "show", "table", "all")
    assert testbed.cluster.pids == {}


def _http_server(prefix: tuple[str, ...], address: str, root: Path) -> subprocess.Popen[bytes]:
    """``python -m http.server`` on ``address``:8000 serving ``root``, run under ``prefix``
    (a namespace's, or none), once it accepts connections."""
    server = subprocess.Popen(
        [*prefix, sys.executable, "-m", "http.server", "8000", "--bind", address,
         "--directory", str(root), "--protocol", "HTTP/1.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    probe = f"import socket; socket.create_connection(({address!r}, 8000), timeout=1)"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tried = subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True)
        if tried.returncode == 0:
            return server
        time.sleep(0.1)
    server.kill()
    raise AssertionError(f"the HTTP server on {address} did not start")


# Three GETs of /object, each after 0.3 s idle (the buckets fill): the fastest one's seconds.
_TIMED_GETS = """
import http.client, sys, time
connection = http.client.HTTPConnection(sys.argv[1], 8000, timeout=30)
took = []
for _ in range(3):
    time.sleep(0.3)
    started = time.perf_counter()
    connection.request("GET", "/object")
    assert len(connection.getresponse().read()) == int(sys.argv[2])
    took.append(time.perf_counter() - started)
print(min(took))
"""


def _fastest_get(
    server_side: tuple[str, ...], address: str, client_side: tuple[str, ...], root: Path
) -> float:
    """The fastest of :data:`_TIMED_GETS` from a client under ``client_side`` (a
    namespace's prefix, or none) of ``root/object`` served on ``address`` under
    ``server_side``."""
    server = _http_server(server_side, address, root)
    try:
        size = str((root / "object").stat().st_size)
        timed = [*client_side, sys.executable, "-c", _TIMED_GETS, address, size]
        return float(subprocess.run(timed, capture_output=True, text=True, check=True).stdout)
    finally:
        server.terminate()
        server.wait(10)


def test_a_node_s_link_lets_out_no_more_than_one_gso_packet_at_once_either_way(
    tmp_path: Path,
) -> None:
    # As the two-tier testbed's link (tests/bench/integration/test_link.py): at 100 Mbit/s
    # a 20 ms bucket is 250 kB, which a response after an idle moment crossed at the veth's
    # speed (1.1 ms towards the node before). A link passes nothing faster than its rate,
    # but for one 64 KiB packet.
    rate, size, burst = 100e6, 240_000, 64 * 1024
    (tmp_path / "object").write_bytes(os.urandom(size))
    net = Network(["n1"], {})
    node = net.prefix("n1")
    try:
        net.create()
        net.shape("n1", rate)
        took = {
            "to the node": _fastest_get((), net.host_address, node, tmp_path),
            "from the node": _fastest_get(node, net.address("n1"), (), tmp_path),
        }
    finally:
        net.destroy()
    least_s = (size - burst) * 8 / (rate * 1.02)
    crossed = ", ".join(f"{s * 1e3:.1f} ms {way}" for way, s in took.items())
    assert all(s >= least_s for s in took.values()), f"{size} B crossed in {crossed}"
