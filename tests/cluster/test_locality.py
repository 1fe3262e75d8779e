"""On the wire: an epoch of pushdown over objects spread across the nodes moves (almost) no
object bytes across node links when each request reaches the gateway beside its object, and
a share (N-1)/N of them when requests are spread over the gateways regardless (today)."""

from __future__ import annotations

import pytest

from hapi_bench._cluster import Epoch, Objects
from tests.cluster.conftest import NODES, report

pytestmark = pytest.mark.cluster


def _line(epoch: Epoch, total: int) -> str:
    share = 100 * epoch.object_bytes / total
    return (
        f"{epoch.object_bytes} of {total} object bytes crossed node links ({share:.2f}%), "
        f"{epoch.samples} pushdown samples, {NODES} nodes"
    )


def test_with_locality_object_bytes_stay_on_their_nodes(loaded: Objects) -> None:
    total = sum(loaded.sizes.values())
    epoch = loaded.epoch(locality=True)
    assert epoch.counts() == {number: 1 for number in range(len(loaded.keys))}
    assert epoch.object_bytes < 0.02 * total, epoch.links
    report("locality.txt", "locality: " + _line(epoch, total))


def test_without_locality_most_object_bytes_cross_node_links(loaded: Objects) -> None:
    total = sum(loaded.sizes.values())
    epoch = loaded.epoch(locality=False)
    assert epoch.counts() == {number: 1 for number in range(len(loaded.keys))}
    expected = (NODES - 1) / NODES  # a request's objects are on its gateway's node 1 in N
    assert epoch.object_bytes > 0.6 * expected * total, epoch.links
    report("1-without-locality.txt", "without locality: " + _line(epoch, total))
