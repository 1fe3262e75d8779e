"""A store's placement lookup: SeaweedFS's filer and master, cached, and its spec strings."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from hapi.store import SeaweedPlacement, parse_placement

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
    with caplog.at_level(logging.WARNING, logger="hapi.store"):
        assert placement.locate("data", "a.jpg") == ()
        placement.retry_s = 0  # ask again at once: still one warning
        assert placement.locate("data", "b.jpg") == ()
    assert len(caplog.records) == 1


def test_a_failed_lookup_is_not_retried_before_retry_s() -> None:
    fake = FakeSeaweed([_entry("a.jpg", (1, 100))], {1: ["10.0.0.11:8100"]})
    down = [True]

    def handler(request: httpx.Request) -> httpx.Response:
        if down[0]:
            fake.requests.append(str(request.url))
            raise httpx.ConnectTimeout("timed out", request=request)
        return fake(request)

    clock = [0.0]
    placement = SeaweedPlacement(
        filer_url=FILER,
        master_url=MASTER,
        retry_s=5,
        clock=lambda: clock[0],
        transport=httpx.MockTransport(handler),
    )
    assert placement.locate("data", "a.jpg") == ()
    assert placement.locate("data", "a.jpg") == ()  # within retry_s: the store is not asked
    assert len(fake.requests) == 1
    down[0], clock[0] = False, 5.0
    assert placement.locate("data", "a.jpg") == ("10.0.0.11",)


def test_a_closed_lookup_opens_a_new_client_when_used_again() -> None:
    fake = FakeSeaweed([_entry("a.jpg", (1, 100))], {1: ["10.0.0.11:8100"]})
    placement = _placement(fake)
    placement.close()  # never used: nothing to close
    assert placement.locate("data", "a.jpg") == ("10.0.0.11",)
    placement.close()
    placement.forget("data", "a.jpg")
    assert placement.locate("data", "a.jpg") == ("10.0.0.11",)  # a new client, asked again
    assert len([url for url in fake.requests if "filer" in url]) == 2


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
