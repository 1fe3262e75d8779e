"""The testbed itself: its safety net, its nodes, and a teardown that leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from hapi_bench.cluster._cluster import Testbed, TestbedSpec
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
