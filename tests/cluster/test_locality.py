"""On the wire: an epoch of pushdown over objects spread across the nodes moves (almost) no
object bytes across node links when each request reaches the gateway beside its object, and
a share (N-1)/N of them when requests are spread over the gateways regardless (today). The
gateways' /metrics agree: no remote fetch with locality, most fetches remote without."""

from __future__ import annotations

import pytest

from hapi_bench.cluster._cluster import Epoch, Objects
from tests.cluster.conftest import NODES, fetched, report, since

pytestmark = pytest.mark.cluster


def _line(epoch: Epoch, total: int) -> str:
    share = 100 * epoch.object_bytes / total
    return (
        f"{epoch.object_bytes} of {total} object bytes crossed node links ({share:.2f}%), "
        f"{epoch.samples} pushdown samples, {NODES} nodes"
    )


def test_with_locality_object_bytes_stay_on_their_nodes(loaded: Objects) -> None:
    total = sum(loaded.sizes.values())
    before = fetched(loaded.testbed, loaded.testbed.roles)
    epoch = loaded.epoch(locality=True)
    counted = since(before, fetched(loaded.testbed, loaded.testbed.roles))
    assert epoch.counts() == {number: 1 for number in range(len(loaded.keys))}
    assert epoch.object_bytes < 0.02 * total, epoch.links
    assert counted["remote"] == 0 and counted["unknown"] == 0, counted
    assert counted["local"] >= len(loaded.keys), counted
    report("locality.txt", "locality: " + _line(epoch, total))


def test_without_locality_most_object_bytes_cross_node_links(loaded: Objects) -> None:
    total = sum(loaded.sizes.values())
    before = fetched(loaded.testbed, loaded.testbed.roles)
    epoch = loaded.epoch(locality=False)
    counted = since(before, fetched(loaded.testbed, loaded.testbed.roles))
    assert epoch.counts() == {number: 1 for number in range(len(loaded.keys))}
    expected = (NODES - 1) / NODES  # a request's objects are on its gateway's node 1 in N
    assert epoch.object_bytes > 0.6 * expected * total, epoch.links
    assert counted["remote"] > 0.6 * expected * len(loaded.keys), counted
    report("1-without-locality.txt", "without locality: " + _line(epoch, total))
