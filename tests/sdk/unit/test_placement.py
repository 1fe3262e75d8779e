"""Placement lookups, matching them to endpoints, and a batch answered in parts."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import numpy as np
import pytest

from hapi.sdk._client import Features
from hapi.sdk._endpoints import EndpointPool, failover
from hapi.sdk._parts import merge, rows_of
from hapi.sdk._placement import Locality, SeaweedPlacement, parse_placement, resolve_placement

FILER, MASTER = "http://filer:8888", "http://master:9333"


def _entry(name: str, *chunks: tuple[int, int]) -> dict[str, Any]:
    return {
        "FullPath": f"/buckets/data/{name}",
        "chunks": [{"file_id": f"{v},01ab", "size": size} for v, size in chunks],
    }


class FakeSeaweed:
    """A filer directory and the master's volume locations, counting requests."""

    def __init__(self, entries: list[dict[str, Any]], volumes: dict[int, list[str]]) -> None:
        self.entries = entries
        self.volumes = volumes
        self.requests: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(str(request.url))
        if request.url.host == "master":
            volume = int(request.url.params["volumeId"])
            if volume not in self.volumes:
                return httpx.Response(404, json={"error": "not found"})
            hosts = self.volumes[volume]
            return httpx.Response(200, json={"locations": [{"url": h} for h in hosts]})
        last = request.url.params.get("lastFileName", "")
        names = [e["FullPath"].rsplit("/", 1)[1] for e in self.entries]
        start = names.index(last) + 1 if last else 0
        page = self.entries[start : start + 2]  # two a page: paging is exercised
        more = start + 2 < len(self.entries)
        body = {
            "Entries": page,
            "LastFileName": page[-1]["FullPath"].rsplit("/", 1)[1] if page else "",
            "ShouldDisplayLoadMore": more,
        }
        return httpx.Response(200, content=json.dumps(body))


def _placement(fake: FakeSeaweed, clock: list[float] | None = None) -> SeaweedPlacement:
    now = clock or [0.0]
    return SeaweedPlacement(
        filer_url=FILER,
        master_url=MASTER,
        ttl_s=60,
        clock=lambda: now[0],
        transport=httpx.MockTransport(fake),
    )


def test_an_object_is_placed_on_the_host_holding_most_of_its_bytes() -> None:
    fake = FakeSeaweed(
        [_entry("a.jpg", (1, 100)), _entry("b.jpg", (1, 10), (2, 90)), _entry("c.jpg", (2, 5))],
        {1: ["10.0.0.11:8100"], 2: ["10.0.0.12:8101", "10.0.0.13:8102"]},
    )
    placement = _placement(fake)
    assert placement.locate("data", "a.jpg") == ("10.0.0.11",)
    assert placement.locate("data", "b.jpg") == ("10.0.0.12", "10.0.0.13", "10.0.0.11")
    assert placement.locate("data", "c.jpg") == ("10.0.0.12", "10.0.0.13")
    listings = [url for url in fake.requests if "filer" in url]
    assert len(listings) == 2  # one directory, two pages, for all three objects


def test_a_volume_servers_public_address_comes_before_its_own() -> None:
    fake = FakeSeaweed([_entry("a.jpg", (1, 100))], {})

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "master":
            location = {"url": "10.244.1.7:8080", "publicUrl": "192.168.0.21:8080"}
            return httpx.Response(200, json={"locations": [location]})
        return fake(request)

    placement = SeaweedPlacement(
        filer_url=FILER, master_url=MASTER, transport=httpx.MockTransport(handler)
    )
    assert placement.locate("data", "a.jpg") == ("192.168.0.21", "10.244.1.7")


def test_answers_are_cached_and_refreshed_after_the_ttl() -> None:
    fake = FakeSeaweed([_entry("a.jpg", (1, 100))], {1: ["10.0.0.11:8100"]})
    clock = [0.0]
    placement = _placement(fake, clock)
    placement.locate("data", "a.jpg")
    placement.locate("data", "a.jpg")
    assert len(fake.requests) == 2  # one listing, one volume lookup
    fake.volumes[1] = ["10.0.0.12:8101"]  # the volume moved
    clock[0] = 61.0
    assert placement.locate("data", "a.jpg") == ("10.0.0.12",)


def test_an_unreachable_store_places_nothing_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    placement = SeaweedPlacement(
        filer_url=FILER, master_url=MASTER, transport=httpx.MockTransport(refuse)
    )
    with caplog.at_level(logging.WARNING, logger="hapi.sdk"):
        assert placement.locate("data", "a.jpg") == ()
        assert placement.locate("data", "b.jpg") == ()
    assert len(caplog.records) == 1


def test_an_object_missing_from_its_listing_is_asked_for_alone() -> None:
    fake = FakeSeaweed([], {3: ["10.0.0.13:8102"]})

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("metadata") == "true":
            return httpx.Response(200, json={"chunks": [{"file_id": "3,77", "size": 9}]})
        return fake(request)

    placement = SeaweedPlacement(
        filer_url=FILER, master_url=MASTER, transport=httpx.MockTransport(handler)
    )
    assert placement.locate("data", "new/x.jpg") == ("10.0.0.13",)


@pytest.mark.parametrize("spec", ["", "none", "  "])
def test_no_placement(spec: str) -> None:
    assert parse_placement(spec) is None


def test_a_spec_names_a_known_placement_with_its_options() -> None:
    placement = parse_placement(f"seaweedfs:filer={FILER},master={MASTER},ttl=5")
    assert isinstance(placement, SeaweedPlacement)
    assert (placement.filer_url, placement.master_url, placement.ttl_s) == (FILER, MASTER, 5.0)
    with pytest.raises(ValueError, match="known ones are: seaweedfs, none"):
        parse_placement("ceph:x=1")
    with pytest.raises(ValueError, match="needs master=URL"):
        parse_placement(f"seaweedfs:filer={FILER}")
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_placement("seaweedfs:filer")


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
