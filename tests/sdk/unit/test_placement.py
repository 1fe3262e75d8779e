"""Placement lookups matched to endpoints, and a batch answered in parts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hapi.sdk import Features
from hapi.sdk.client._endpoints import EndpointPool, failover
from hapi.sdk.client._parts import merge, rows_of
from hapi.sdk.client._placement import Locality, resolve_placement
from hapi.store import SeaweedPlacement

FILER, MASTER = "http://filer:8888", "http://master:9333"


def test_the_argument_wins_over_the_environment() -> None:
    environ = {"HAPI_PLACEMENT": f"seaweedfs:filer={FILER},master={MASTER}"}
    assert isinstance(resolve_placement(None, environ), SeaweedPlacement)
    assert resolve_placement("none", environ) is None
    assert resolve_placement(None, {}) is None


class Fixed:
    def __init__(self, hosts: dict[str, tuple[str, ...]]) -> None:
        self.hosts = hosts

    def locate(self, bucket: str, key: str) -> tuple[str, ...]:
        return self.hosts.get(key, ())

    def forget(self, bucket: str, key: str) -> None:
        self.hosts.pop(key, None)


def test_keys_are_grouped_by_the_endpoint_beside_them_in_order() -> None:
    endpoints = ["http://10.0.0.11:8080", "http://10.0.0.12:8080"]
    hosts = {"a": ("10.0.0.12",), "b": ("10.0.0.9", "10.0.0.11"), "c": ("10.0.0.12",)}
    locality = Locality(Fixed(hosts), endpoints)
    assert locality.group("data", ["a", "b", "c", "d"]) == [
        (endpoints[1], ["a", "c"]),
        (endpoints[0], ["b"]),
        (None, ["d"]),
    ]


def test_a_preferred_endpoint_is_chosen_while_it_is_healthy() -> None:
    pool = EndpointPool(["http://a", "http://b", "http://c"])
    assert {pool.acquire("http://c") for _ in range(4)} == {"http://c"}
    pool.mark_down("http://c", "refused")
    assert pool.acquire("http://c") != "http://c"
    tried: list[str] = []

    def attempt(endpoint: str) -> str:
        tried.append(endpoint)
        return endpoint

    pool.mark_up("http://c")
    assert failover(pool, attempt, bucket="data", prefer="http://b") == "http://b"


def _reply(keys: list[str], rows: list[float], endpoint: str, **extra: Any) -> Features:
    features = np.array(rows, dtype=np.float32)[:, None]
    return Features(features=features, labels=None, keys=tuple(keys), endpoint=endpoint, **extra)


def test_parts_are_answered_in_the_order_of_the_batch() -> None:
    first = _reply(["b", "d#0", "d#1"], [2, 40, 41], "http://x", nbytes=10, cache="bypass")
    second = _reply(["a", "c"], [1, 3], "http://y", nbytes=5, cache="bypass")
    merged = merge(["a", "b", "c", "d"], [["b", "d"], ["a", "c"]], [first, second])
    assert merged.keys == ("a", "b", "c", "d#0", "d#1")
    assert merged.features[:, 0].tolist() == [1, 2, 3, 40, 41]
    assert (merged.nbytes, merged.endpoint, merged.labels) == (15, "http://x,http://y", None)
    assert not merged.features.flags.writeable


def test_merged_labels_and_errors_keep_their_objects() -> None:
    first = Features(
        features=np.zeros((1, 1), np.float32),
        labels=np.array([7]),
        keys=("b",),
        errors={"x": ValueError("gone")},  # type: ignore[dict-item]
        server_timing={"infer": 5.0},
    )
    second = _reply(["a"], [1], "http://y", server_timing={"infer": 9.0})
    merged = merge(["a", "b", "x"], [["b", "x"], ["a"]], [first, second])
    assert merged.labels is not None and merged.labels.tolist() == [-1, 7]
    assert list(merged.errors) == ["x"]
    assert merged.server_timing == {"infer": 9.0}


def test_rows_of_a_sample_nobody_asked_for_is_an_error() -> None:
    assert rows_of(["a", "ab"], ["a", "ab#1"]) == {"a": [0], "ab": [1]}
    with pytest.raises(Exception, match="unrequested sample"):
        rows_of(["a"], ["z"])
