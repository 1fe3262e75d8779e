"""Gateway memory is bounded by settings, not by input.

A 1 MB tar of 1x1 PNGs decodes to hundreds of MB of model inputs; before the limits, a
1000-member tar took the gateway from 225 MB to 4.6 GB, and 5000 members to a MemoryError.
Each case runs against its own ``hapi serve`` process with default settings, so the
resident set measured (``VmRSS`` before, ``VmHWM`` after) is the gateway's alone.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hapi.gateway import GatewaySettings
from tests.support import RunningGateway, signed_headers, store_gateway

from ._pushdown_support import (
    MIB,
    batch_body,
    error_of,
    png_shard,
    put_many,
    signed_get,
    stats,
    tiny_png,
)

pytestmark = pytest.mark.slow  # minutes of real work: `make test-slow`


BUCKET = "adversarial-memory"
GOAL = 512 * MIB  # the bound with default settings (issue 12)
BATCH_KEYS = 4096


@pytest.fixture(scope="module")
def gateway(
    store: Any, registered: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    with store_gateway(store, tmp_path_factory.mktemp("gateway-memory")) as running:
        yield running


@pytest.fixture(scope="module")
def bucket(backend_s3: Any) -> str:
    backend_s3.create_bucket(Bucket=BUCKET)
    objects = {f"k/{i:05d}.png": tiny_png(i) for i in range(BATCH_KEYS)}
    objects["shard-1000.tar"] = png_shard(1000)
    objects["shard-5000.tar"] = png_shard(5000)
    objects["warm.png"] = tiny_png()
    put_many(backend_s3, BUCKET, objects)
    return BUCKET


def _safetensors_head(first: bytes) -> dict[str, Any]:
    (size,) = struct.unpack("<Q", first[:8])
    head: dict[str, Any] = json.loads(first[8 : 8 + size])
    return head


def _measure(
    gateway: RunningGateway, request: httpx.Request
) -> tuple[int, int, int, dict[str, Any]]:
    """Send ``request``, reading the body as it comes; returns (status, rss before,
    peak rise, safetensors header or error) for the gateway process."""
    before = gateway.rss_bytes()
    gateway.reset_peak_rss()
    received = bytearray()
    total = 0
    with httpx.Client(timeout=600) as client:
        reply = client.send(request, stream=True)
        for chunk in reply.iter_bytes():
            total += len(chunk)
            if len(received) < 1 << 20:
                received += chunk
        reply.close()
    rise = gateway.peak_rss_bytes() - before
    if reply.status_code == 200:
        head = _safetensors_head(bytes(received))
        assert total == int(reply.headers["content-length"])
    else:
        head = {"error": error_of(httpx.Response(reply.status_code, content=bytes(received)))}
    return reply.status_code, before, rise, head


def _get(gateway: RunningGateway, path: str) -> httpx.Request:
    url = gateway.endpoint_url + path
    headers = signed_headers(gateway, "GET", path)
    return httpx.Request("GET", url, headers=headers)


def _post(gateway: RunningGateway, path: str, body: bytes) -> httpx.Request:
    url = gateway.endpoint_url + path
    headers = signed_headers(gateway, "POST", path, body=body)
    return httpx.Request("POST", url, headers=headers, content=body)


def _warm(gateway: RunningGateway, split: int) -> None:
    reply = signed_get(gateway, f"/{BUCKET}/warm.png?hapi-model=r18&hapi-split={split}")
    assert reply.status_code == 200, reply.text


def _report(name: str, before: int, rise: int) -> None:
    print(f"\n{name}: RSS before {before / MIB:.0f} MiB, peak rise {rise / MIB:.0f} MiB")


def test_a_1000_member_tar_at_a_mid_split_stays_within_the_bound(gateway, bucket):
    _warm(gateway, 6)
    status, before, rise, head = _measure(
        gateway, _get(gateway, f"/{bucket}/shard-1000.tar?hapi-model=r18&hapi-split=6")
    )
    _report("1000-member tar, split 6", before, rise)
    assert status == 200, head
    assert head["features"]["shape"] == [1000, 256, 14, 14]
    assert rise < GOAL


def test_a_5000_member_tar_is_refused_before_decoding(gateway, bucket):
    _warm(gateway, 6)
    decoded = stats(gateway)["requests"]["samples_decoded"]
    status, before, rise, head = _measure(
        gateway, _get(gateway, f"/{bucket}/shard-5000.tar?hapi-model=r18&hapi-split=6")
    )
    _report("5000-member tar, split 6", before, rise)
    assert status == 400, head
    code, message, _ = head["error"]
    cap = GatewaySettings.__dataclass_fields__["max_request_samples"].default
    assert (
        code == "InvalidRequest" and str(cap) in message and "HAPI_MAX_REQUEST_SAMPLES" in message
    )
    assert stats(gateway)["requests"]["samples_decoded"] == decoded  # refused undecoded
    assert rise < GOAL


def test_a_4096_key_batch_stays_within_the_bound(gateway, bucket):
    _warm(gateway, 1)
    keys = [f"k/{i:05d}.png" for i in range(BATCH_KEYS)]
    body = batch_body(keys, model="r18", split=1, dtype="float16")
    status, before, rise, head = _measure(gateway, _post(gateway, f"/{bucket}?hapi-batch", body))
    _report(f"{BATCH_KEYS}-key batch, split 1, float16", before, rise)
    assert status == 200, head
    assert head["features"]["shape"][0] == BATCH_KEYS
    assert json.loads(head["__metadata__"]["keys"]) == keys
    assert rise < GOAL


def test_keys_over_the_batch_cap_are_refused(gateway, bucket):
    cap = GatewaySettings.__dataclass_fields__["max_batch_keys"].default
    body = batch_body([f"k/{i:05d}.png" for i in range(cap + 1)], model="r18", split=1)
    status, _before, _rise, head = _measure(gateway, _post(gateway, f"/{bucket}?hapi-batch", body))
    assert status == 400, head
    assert head["error"][0] == "InvalidRequest" and str(cap) in head["error"][1]


SMALL_BUDGET = 32 * MIB


@pytest.fixture(scope="module")
def small_budget_gateway(
    store: Any, registered: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    with store_gateway(
        store,
        tmp_path_factory.mktemp("gateway-small-budget"),
        env={"HAPI_MAX_DECODED_BYTES": str(SMALL_BUDGET)},
    ) as running:
        yield running


def test_the_bound_follows_the_configured_budget(small_budget_gateway, bucket, backend_s3):
    gateway = small_budget_gateway
    _warm(gateway, 6)
    shard = backend_s3.head_object(Bucket=bucket, Key="shard-1000.tar")["ContentLength"]
    status, before, rise, head = _measure(
        gateway, _get(gateway, f"/{bucket}/shard-1000.tar?hapi-model=r18&hapi-split=6")
    )
    _report("1000-member tar, split 6, 32 MiB decoded-bytes budget", before, rise)
    assert status == 200, head
    assert head["features"]["shape"][0] == 1000
    assert rise < SMALL_BUDGET + shard + 100 * MIB
