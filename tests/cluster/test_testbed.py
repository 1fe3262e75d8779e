"""The testbed itself: its safety net, its nodes, and a teardown that leaves nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hapi_bench.cluster._cluster import Testbed, TestbedSpec
from hapi_bench.cluster._cluster_net import Network
from hapi_bench.testbed._netns import namespaces, run
from tests.bench.links import burst_floor_s, fastest_idle_get, serving

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


def test_a_node_s_link_lets_out_no_more_than_one_gso_packet_at_once_either_way(
    tmp_path: Path,
) -> None:
    # As the two-tier testbed's link (tests/bench/integration/test_link.py): at 100 Mbit/s
    # a 20 ms bucket is 250 kB, which a response after an idle moment crossed at the veth's
    # speed (1.1 ms towards the node before). A link passes nothing faster than its rate,
    # but for one 64 KiB packet.
    rate, size = 100e6, 240_000
    (tmp_path / "object").write_bytes(os.urandom(size))
    net = Network(["n1"], {})
    node = net.prefix("n1")
    try:
        net.create()
        net.shape("n1", rate)
        with serving((), net.host_address, tmp_path):  # to the node: the bridge's end
            took = {"to the node": fastest_idle_get(node, net.host_address, size)}
        with serving(node, net.address("n1"), tmp_path):  # from the node: its own end
            took["from the node"] = fastest_idle_get((), net.address("n1"), size)
    finally:
        net.destroy()
    crossed = ", ".join(f"{s * 1e3:.1f} ms {way}" for way, s in took.items())
    assert all(s >= burst_floor_s(size, rate) for s in took.values()), (
        f"{size} B crossed in {crossed}"
    )
