"""A cold feature cache asks the store for what no cache asks, through the real gateway
and store, counted where the store receives them (a recorder between the two).

A lookup is a HEAD of the object as the caller, then the entry's place in the index of its
context's packs (listed from the store at most once in ``INDEX_TTL_S`` while lookups miss):
on a cold epoch, a store request an object beside its own GET, for nothing. Once a
context (bucket, blocks, dtype, view) has missed ``COLD_AFTER`` times in a row, only one
object in ``cache_cold_probe`` is looked up."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from skimage import data as samples

from hapi.gateway import GatewaySettings
from hapi.gateway.pushdown._cache import COLD_AFTER, INDEX_TTL_S
from hapi.protocol import decode_features as decode
from tests.gateway.recorder import Recorded, Recorder, recording
from tests.support import (
    RunningGateway,
    cache_writes_settled,
    control_get,
    encode_image,
    gateway_process,
    signed_headers,
)

OBJECTS = 48
PER_REQUEST = 8
SPLIT = 4
PROBE = GatewaySettings.cache_cold_probe  # the default


@pytest.fixture(scope="module")
def recorder(store: Any) -> Iterator[Recorder]:
    with recording(store.endpoint_url) as running:
        yield running


@pytest.fixture(scope="module")
def watched(store: Any, recorder: Recorder, tmp_path_factory) -> Iterator[RunningGateway]:
    """A gateway of its own whose store requests the recorder sees."""
    with gateway_process(
        backend_url=recorder.url,
        backend_key=store.credentials.access_key_id,
        backend_secret=store.credentials.secret_access_key,
        log_dir=tmp_path_factory.mktemp("watched"),
    ) as running:
        yield running


@pytest.fixture
def objects(backend_s3, unique_bucket) -> tuple[str, list[str]]:
    photo = samples.chelsea()
    keys = []
    for index in range(OBJECTS):
        key = f"cold/{index:02d}.jpg"
        crop = photo[index % 7 : 200 + index % 7, index : 240 + index]
        backend_s3.put_object(Bucket=unique_bucket, Key=key, Body=encode_image(crop, "JPEG"))
        keys.append(key)
    return unique_bucket, keys


def _batch(gateway: RunningGateway, bucket: str, keys: list[str], **spec: object) -> httpx.Response:
    body = json.dumps({"keys": keys, "model": "r18", "split": SPLIT, **spec}).encode()
    path = f"/{bucket}?hapi-batch"
    headers = signed_headers(gateway, "POST", path, body=body)
    reply = httpx.post(gateway.endpoint_url + path, content=body, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply


def _get(gateway: RunningGateway, bucket: str, key: str) -> httpx.Response:
    path = f"/{bucket}/{key}?hapi-model=r18&hapi-split={SPLIT}"
    headers = signed_headers(gateway, "GET", path, body=b"")
    reply = httpx.get(gateway.endpoint_url + path, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply


def _epoch(gateway: RunningGateway, bucket: str, keys: list[str], **spec: object) -> tuple:
    """Requests of ``PER_REQUEST`` keys, one after another: (features, cache answers)."""
    features, answers = [], []
    for start in range(0, len(keys), PER_REQUEST):
        reply = _batch(gateway, bucket, keys[start : start + PER_REQUEST], **spec)
        features.append(decode(reply.content)[0]["features"])
        answers.append(reply.headers["x-hapi-cache"])
    return np.concatenate(features), answers


def _of(seen: list[Recorded], method: str, bucket: str) -> int:
    return sum(r.method == method and r.path.startswith(f"/{bucket}/") for r in seen)


def _listings(seen: list[Recorded]) -> int:
    """The cache's listings of a context's packs."""
    return sum(r.method == "GET" and "prefix=packs" in r.query for r in seen)


def _pack_reads(seen: list[Recorded]) -> int:
    return sum(r.method == "GET" and "/packs/" in r.path for r in seen)


def test_a_cold_epoch_sends_the_store_what_an_epoch_without_the_cache_sends(
    watched, recorder, registered, objects
):
    bucket, keys = objects
    mark = recorder.mark()
    plain, _ = _epoch(watched, bucket, keys, cache="bypass")
    without = recorder.since(mark)
    assert _of(without, "GET", bucket) == OBJECTS and _of(without, "HEAD", bucket) == 0

    mark, skipped, started = recorder.mark(), _skipped(watched), time.monotonic()
    cold, answers = _epoch(watched, bucket, keys)
    seen, took = recorder.since(mark), time.monotonic() - started
    # what the gateway counts as skipped is what the store was not asked
    assert _skipped(watched) - skipped == OBJECTS - _of(seen, "HEAD", bucket)
    assert set(answers) == {"miss"}
    assert cold.tobytes() == plain.tobytes()
    # The first COLD_AFTER objects are looked up (a HEAD each), then one in PROBE: before,
    # every object was. A miss reads no entry: the context's packs are listed (none of
    # them hold these objects) at most once in INDEX_TTL_S.
    looked_up = COLD_AFTER + math.ceil((OBJECTS - COLD_AFTER) / PROBE)
    assert _of(seen, "HEAD", bucket) <= looked_up
    assert 1 <= _listings(seen) <= 1 + took / INDEX_TTL_S, (_listings(seen), took)
    assert _pack_reads(seen) == 0
    assert _of(seen, "GET", bucket) == OBJECTS  # every object fetched once, as without

    # The epoch that follows at once is answered from the cache from its first request:
    # this gateway computed those objects, so it looks every one of them up.
    mark = recorder.mark()
    warm, answers = _epoch(watched, bucket, keys)
    seen = recorder.since(mark)
    assert set(answers) == {"hit"}, answers
    assert warm.tobytes() == plain.tobytes()
    assert _of(seen, "GET", bucket) == 0  # no image fetched
    cache_writes_settled(watched)


def test_a_cold_gateway_finds_the_entries_another_gateway_wrote_within_a_probe(
    watched, gateway, registered, objects
):
    bucket, keys = objects
    first, rest = keys[: COLD_AFTER + 4], keys[COLD_AFTER + 4 :]
    assert all(_get(watched, bucket, key).headers["x-hapi-cache"] == "miss" for key in first)
    # the other gateway computes the rest, and writes their entries
    _epoch(gateway, bucket, rest)
    cache_writes_settled(gateway)
    time.sleep(INDEX_TTL_S)  # the watched gateway's listing of the context is stale now
    answers = [_get(watched, bucket, key).headers["x-hapi-cache"] for key in rest]
    assert "hit" in answers, answers
    computed_again = answers.index("hit")
    assert computed_again < PROBE, answers  # a probe found them ...
    assert set(answers[computed_again:]) == {"hit"}, answers  # ... and the context is warm
    cache_writes_settled(watched)


def test_looking_every_object_up_is_a_setting(store, recorder, registered, objects, tmp_path):
    bucket, keys = objects
    with gateway_process(
        backend_url=recorder.url,
        backend_key=store.credentials.access_key_id,
        backend_secret=store.credentials.secret_access_key,
        log_dir=tmp_path,
        env={"HAPI_CACHE_COLD_PROBE": "1"},
    ) as every:
        mark = recorder.mark()
        _epoch(every, bucket, keys)
        seen = recorder.since(mark)
        assert _of(seen, "HEAD", bucket) == OBJECTS  # every object looked up
        cache_writes_settled(every)


def _skipped(gateway: RunningGateway) -> float:
    """The gateway's count of lookups a cold context skipped (r18)."""
    text = control_get(gateway, "/metrics").text
    found = re.search(
        r'^hapi_cache_lookups_total\{model="r18",result="skipped"\} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0
