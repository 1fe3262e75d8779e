"""Placement against the real multi-node SeaweedFS: where the store put an object (its own
view: the entry's chunks and the master's topology) is where the SDK's lookup says it is."""

from __future__ import annotations

import pytest

from hapi.store import SeaweedPlacement
from hapi_bench.cluster._cluster import Objects

pytestmark = pytest.mark.cluster


def test_an_object_pinned_to_node_2_is_reported_on_node_2(loaded: Objects) -> None:
    cluster = loaded.testbed.cluster
    key = next(key for key in loaded.keys if loaded.node_of(key) == "n2")
    assert cluster.holders(loaded.bucket, key) == {"n2": loaded.sizes[key]}  # the store's view
    lookup = SeaweedPlacement(filer_url=cluster.filer_url, master_url=cluster.master_url)
    assert lookup.locate(loaded.bucket, key) == (cluster.node("n2").host,)


def test_every_object_is_where_it_was_pinned_and_where_the_lookup_says(loaded: Objects) -> None:
    cluster = loaded.testbed.cluster
    lookup = SeaweedPlacement(filer_url=cluster.filer_url, master_url=cluster.master_url)
    for key in loaded.keys:
        node = loaded.node_of(key)
        assert set(cluster.holders(loaded.bucket, key)) == {node}, key
        assert lookup.locate(loaded.bucket, key) == (cluster.node(node).host,), key


def test_a_write_outside_the_pinned_prefixes_is_placed_wherever_the_store_chose(
    loaded: Objects,
) -> None:
    cluster = loaded.testbed.cluster
    s3 = cluster.s3_client("n1")
    s3.put_object(Bucket=loaded.bucket, Key="elsewhere/x.bin", Body=b"x" * 5000)
    held = cluster.holders(loaded.bucket, "elsewhere/x.bin")
    lookup = SeaweedPlacement(filer_url=cluster.filer_url, master_url=cluster.master_url)
    assert len(held) == 1
    assert lookup.locate(loaded.bucket, "elsewhere/x.bin") == (cluster.node(*held).host,)
