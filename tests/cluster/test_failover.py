"""A node's gateway killed mid-epoch: the epoch finishes through the other nodes with every
sample exactly once, and the objects of the dead node's gateway cross links to get there,
which the surviving gateways count as remote fetches."""

from __future__ import annotations

from typing import Any

import pytest

from hapi_bench.cluster._cluster import Objects
from tests.cluster.conftest import fetched, report, since

pytestmark = pytest.mark.cluster


def test_an_epoch_outlives_a_gateway_killed_mid_epoch(loaded: Objects) -> None:
    testbed = loaded.testbed
    survivors = [role for role in testbed.roles if role != "n2"]
    before = fetched(testbed, survivors)
    killed: list[int] = []

    def kill_once(event: dict[str, Any]) -> None:
        if not killed and event["event"] == "progress":
            killed.append(event["samples"])
            testbed.kill_gateway("n2")

    try:
        epoch = loaded.epoch(locality=True, request_size=4, during=kill_once)
        counted = since(before, fetched(testbed, survivors))
    finally:
        testbed.start_gateway("n2")
        testbed._wait_gateway("n2")
    assert killed, "the epoch ended before the kill"
    assert epoch.counts() == {number: 1 for number in range(len(loaded.keys))}
    remaining = [k for k in loaded.keys if loaded.node_of(k) == "n2"]
    crossed = epoch.object_bytes
    assert 0 < crossed <= sum(loaded.sizes[k] for k in remaining) * 1.1, epoch.links
    assert epoch.links["n2"].objects == crossed  # only the dead gateway's node lent its objects
    # The survivors fetched the dead gateway's objects from n2, and counted them as remote.
    assert 0 < counted["remote"] <= len(remaining), counted
    assert counted["unknown"] == 0, counted
    report(
        "2-failover.txt",
        f"failover: gateway n2 killed after {killed[0]} samples; {epoch.samples} "
        f"samples, each once; {crossed} object bytes crossed node links to get there, "
        f"{counted['remote']:.0f} remote fetches counted by the other gateways",
    )
