"""The feature cache through the real gateway and store: hits, misses, control, sharing,
invalidation, degradation, and materialization that fetches no image afterwards."""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from skimage import data as samples

from hapi import models
from hapi.gateway._store import StoreClient
from hapi.gateway.pushdown._cache import PACK_BYTES
from hapi.protocol import (
    PACK_HEAD,
    ZEROS_ENTRY,
    Credentials,
    encode_pack,
    expand_entry,
    pack_index_length,
    parse_pack_index,
)
from hapi.protocol import decode_features as decode
from tests.support import (
    HAPI,
    cache_writes_settled,
    control_get,
    encode_image,
    signed_headers,
    store_gateway,
    wait_for,
)

CACHE_BUCKET = "hapi-cache"


def _get(gateway, bucket: str, key: str, *, cache: str | None = None, **params: object):
    query = "&".join(f"hapi-{k}={v}" for k, v in params.items())
    path = f"/{bucket}/{key}?{query}"
    extra = {"x-hapi-cache": cache} if cache else {}
    headers = signed_headers(gateway, "GET", path, body=b"", headers=extra)
    return httpx.get(gateway.endpoint_url + path, headers=headers, timeout=120)


def _hits(gateway, bucket: str, key: str, **params: object) -> bool:
    """Whether a GET of features is answered from the cache."""
    return _get(gateway, bucket, key, **params).headers["x-hapi-cache"] == "hit"


def _warm(gateway, bucket: str, key: str, **params: object) -> None:
    """Compute ``key``'s features once, then wait until the cache answers them."""
    _get(gateway, bucket, key, **params)
    wait_for(lambda: _hits(gateway, bucket, key, **params), f"a hit on {key}")


def _batch(gateway, bucket: str, keys: list[str], **spec: object) -> httpx.Response:
    body = json.dumps({"keys": keys, **spec}).encode()
    path = f"/{bucket}?hapi-batch"
    headers = signed_headers(gateway, "POST", path, body=body)
    return httpx.post(gateway.endpoint_url + path, content=body, headers=headers, timeout=120)


def _entries(backend_s3) -> dict[str, object]:
    try:
        pages = backend_s3.get_paginator("list_objects_v2").paginate(Bucket=CACHE_BUCKET)
        return {o["Key"]: o["LastModified"] for p in pages for o in p.get("Contents", [])}
    except backend_s3.exceptions.NoSuchBucket:
        return {}


def _members(backend_s3, before: set[str]) -> set[str]:
    """The entry paths the packs written since ``before`` hold."""
    paths: set[str] = set()
    for key in set(_entries(backend_s3)) - before:
        head = backend_s3.get_object(Bucket=CACHE_BUCKET, Key=key)["Body"].read()
        paths |= set(parse_pack_index(head[PACK_HEAD : PACK_HEAD + pack_index_length(head)]))
    return paths


def _settled(gateway) -> None:
    cache_writes_settled(gateway)


@pytest.fixture(autouse=True)
def _no_write_pending(gateway) -> None:
    """Each test starts with no cache write of an earlier test still to land, so what it
    counts in the cache bucket is its own."""
    _settled(gateway)


def _metrics(gateway) -> str:
    url = f"{gateway.endpoint_url}/metrics"
    headers = signed_headers(gateway, "GET", "/metrics", body=b"")
    return httpx.get(url, headers=headers, timeout=30).text


def _fetches(gateway) -> float:
    text = _metrics(gateway)
    found = re.findall(r'^hapi_pushdown_object_fetches_total\{placement="\w+"\} (\S+)$', text, re.M)
    assert found, "the gateway exposes no object-fetch counter"
    return sum(float(value) for value in found)  # local, remote and unknown


@pytest.fixture
def photos(backend_s3, unique_bucket):
    blobs = {
        "cat.jpg": encode_image(samples.chelsea(), "JPEG"),
        "coffee.jpg": encode_image(samples.coffee(), "JPEG"),
        "rocket.jpg": encode_image(samples.rocket(), "JPEG"),
    }
    for key, blob in blobs.items():
        backend_s3.put_object(Bucket=unique_bucket, Key=key, Body=blob)
    return unique_bucket, blobs


def test_a_miss_is_written_and_the_next_read_hits_bit_for_bit(
    gateway, registered, backend_s3, photos
):
    bucket, _ = photos
    before = set(_entries(backend_s3))
    cold = _get(gateway, bucket, "cat.jpg", model="r18", split=4)
    assert cold.status_code == 200, cold.text
    assert cold.headers["x-hapi-cache"] == "miss"
    wait_for(lambda: len(set(_entries(backend_s3)) - before) == 1, "the entry to be written")
    (pack,) = set(_entries(backend_s3)) - before
    held = re.search(r"^hapi_cache_memory_bytes (\S+)$", _metrics(gateway), re.M)
    size = backend_s3.head_object(Bucket=CACHE_BUCKET, Key=pack)["ContentLength"]
    assert held is not None and float(held.group(1)) >= size  # the pack written is held
    fetched = _fetches(gateway)
    warm = _get(gateway, bucket, "cat.jpg", model="r18", split=4)
    assert warm.headers["x-hapi-cache"] == "hit"
    assert _fetches(gateway) == fetched  # a hit fetches no image
    assert "cache;dur=" in warm.headers["server-timing"]
    cold_t, cold_meta = decode(cold.content)
    warm_t, warm_meta = decode(warm.content)
    assert cold_t["features"].tobytes() == warm_t["features"].tobytes()
    assert cold_meta["keys"] == warm_meta["keys"] and warm_meta["model"] == "r18"


@pytest.mark.parametrize(("split", "compact"), [(4, True), (0, False)])
def test_an_entry_is_kept_without_its_zero_words_where_that_is_smaller(
    gateway, registered, backend_s3, photos, split, compact
):
    # After a ReLU (split 4) about half the values are zero and the entry is kept
    # compacted; the decoded input (split 0) has next to none and is kept as it is.
    bucket, _ = photos
    before = set(_entries(backend_s3))
    cold = _get(gateway, bucket, "coffee.jpg", model="r18", split=split)
    assert cold.headers["x-hapi-cache"] == "miss"
    wait_for(lambda: len(set(_entries(backend_s3)) - before) == 1, "the entry to be written")
    (pack,) = set(_entries(backend_s3)) - before
    body = backend_s3.get_object(Bucket=CACHE_BUCKET, Key=pack)["Body"].read()
    (member,) = parse_pack_index(body[PACK_HEAD : PACK_HEAD + pack_index_length(body)]).values()
    stored = body[member.offset : member.offset + member.length]
    features = decode(cold.content)[0]["features"]
    assert stored.startswith(ZEROS_ENTRY) == compact
    if compact:
        zeros = float(np.mean(features == 0))
        assert len(stored) < (1.05 - zeros) * features.nbytes, (len(stored), zeros)
    entry, _ = decode(expand_entry(stored))
    np.testing.assert_array_equal(entry["features"], features)
    warm = _get(gateway, bucket, "coffee.jpg", model="r18", split=split)
    assert warm.headers["x-hapi-cache"] == "hit"
    assert warm.content == cold.content  # the hit answers the same bytes


def test_bypass_neither_reads_nor_writes(gateway, registered, backend_s3, photos):
    bucket, _ = photos
    before = set(_entries(backend_s3))
    reply = _get(gateway, bucket, "coffee.jpg", cache="bypass", model="r18", split=3)
    assert reply.status_code == 200 and reply.headers["x-hapi-cache"] == "bypass"
    time.sleep(1.0)  # a write, if any were queued, lands within this
    assert set(_entries(backend_s3)) == before


def test_refresh_recomputes_and_rewrites(gateway, registered, backend_s3, photos):
    bucket, _ = photos
    before = set(_entries(backend_s3))
    _get(gateway, bucket, "rocket.jpg", model="r18", split=2)
    wait_for(lambda: len(set(_entries(backend_s3)) - before) == 1, "the entry's pack")
    fetched = _fetches(gateway)
    reply = _get(gateway, bucket, "rocket.jpg", cache="refresh", model="r18", split=2)
    assert reply.headers["x-hapi-cache"] == "miss" and _fetches(gateway) == fetched + 1
    # written again, in a pack of its own (the first pack's copy waits for eviction)
    wait_for(lambda: len(set(_entries(backend_s3)) - before) == 2, "the entry to be rewritten")
    assert _hits(gateway, bucket, "rocket.jpg", model="r18", split=2)


def test_an_overwritten_object_misses(gateway, registered, backend_s3, photos):
    bucket, _ = photos
    _get(gateway, bucket, "cat.jpg", model="r18", split=5)
    wait_for(
        lambda: _hits(gateway, bucket, "cat.jpg", model="r18", split=5),
        "a hit",
    )
    backend_s3.put_object(
        Bucket=bucket, Key="cat.jpg", Body=encode_image(samples.astronaut(), "JPEG")
    )
    reply = _get(gateway, bucket, "cat.jpg", model="r18", split=5)
    assert reply.headers["x-hapi-cache"] == "miss"
    fresh = decode(_get(gateway, bucket, "cat.jpg", cache="bypass", model="r18", split=5).content)
    assert decode(reply.content)[0]["features"].tobytes() == fresh[0]["features"].tobytes()


def test_models_sharing_a_frozen_prefix_share_entries(gateway, registered, backend_s3, photos):
    bucket, _ = photos
    twin = models.Registry(backend_s3).register(
        "r18-twin", models.export_model("resnet18", freeze=6)
    )  # the same seeded weights: the same block hashes under another name
    assert [b.hash for b in twin.blocks] == [b.hash for b in registered["r18"].blocks]
    _get(gateway, bucket, "coffee.jpg", model="r18", split=6)
    wait_for(
        lambda: _hits(gateway, bucket, "coffee.jpg", model="r18-twin", split=6),
        "the twin to hit the first model's entry",
    )


def test_a_batch_mixes_hits_and_misses_in_key_order(gateway, registered, backend_s3, photos):
    bucket, _ = photos
    _warm(gateway, bucket, "coffee.jpg", model="r18", split=1)
    keys = ["rocket.jpg", "missing.jpg", "coffee.jpg", "cat.jpg"]
    mixed = _batch(gateway, bucket, keys, model="r18", split=1)
    plain = _batch(gateway, bucket, keys, model="r18", split=1, cache="bypass")
    assert mixed.status_code == plain.status_code == 200
    assert mixed.headers["x-hapi-cache"] == "miss"
    got, got_meta = decode(mixed.content)
    want, want_meta = decode(plain.content)
    assert json.loads(got_meta["keys"]) == ["rocket.jpg", "coffee.jpg", "cat.jpg"]
    assert got_meta["keys"] == want_meta["keys"] and got_meta["errors"] == want_meta["errors"]
    assert got["features"].tobytes() == want["features"].tobytes()


def test_a_deleted_cache_bucket_degrades_to_computing(gateway, registered, backend_s3, photos):
    bucket, _ = photos
    _get(gateway, bucket, "rocket.jpg", model="r18", split=3)
    _settled(gateway)  # every write queued so far (earlier tests' too) has landed
    for key in _entries(backend_s3):
        backend_s3.delete_object(Bucket=CACHE_BUCKET, Key=key)
    backend_s3.delete_bucket(Bucket=CACHE_BUCKET)
    # an object whose entry was never written: the lookup in the missing bucket misses
    reply = _get(gateway, bucket, "cat.jpg", model="r18", split=3)
    assert reply.status_code == 200 and reply.headers["x-hapi-cache"] == "miss"
    want = decode(_get(gateway, bucket, "cat.jpg", cache="bypass", model="r18", split=3).content)
    assert decode(reply.content)[0]["features"].tobytes() == want[0]["features"].tobytes()
    # the entry this gateway wrote: a hit from its memory (the store was seen holding its
    # pack less than INDEX_TTL_S ago) or, once the store shows it gone, computed again;
    # as computed either way
    held = _get(gateway, bucket, "rocket.jpg", model="r18", split=3)
    assert held.status_code == 200 and held.headers["x-hapi-cache"] in ("hit", "miss")
    want = decode(_get(gateway, bucket, "rocket.jpg", cache="bypass", model="r18", split=3).content)
    assert decode(held.content)[0]["features"].tobytes() == want[0]["features"].tobytes()


def test_an_unknown_cache_mode_is_invalid(gateway, registered, photos):
    bucket, _ = photos
    reply = _get(gateway, bucket, "cat.jpg", cache="sometimes", model="r18", split=2)
    assert reply.status_code == 400 and b"InvalidArgument" in reply.content


def _hapi(
    gateway, *args: str, endpoint: str | None = None, admin: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``hapi ARGS`` against the gateway with its client key (or its admin key)."""
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint or gateway.endpoint_url,
        "AWS_ACCESS_KEY_ID": gateway.admin_access_key_id if admin else gateway.access_key_id,
        "AWS_SECRET_ACCESS_KEY": (
            gateway.admin_secret_access_key if admin else gateway.secret_access_key
        ),
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return subprocess.run(
        [HAPI, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def test_materialize_then_training_reads_fetch_no_image(gateway, registered, backend_s3, photos):
    bucket, blobs = photos
    done = _hapi(gateway, "materialize", f"s3://{bucket}/", "--model", "r18", "--split", "6")
    assert done.returncode == 0, done.stderr
    assert f"{len(blobs)} objects, {len(blobs)} samples" in done.stdout
    # written in the background: wait until every object's next read is a hit
    wait_for(
        lambda: (
            _batch(gateway, bucket, sorted(blobs), model="r18", split=6).headers["x-hapi-cache"]
            == "hit"
        ),
        "every entry",
    )
    fetched = _fetches(gateway)
    for key in blobs:
        assert _get(gateway, bucket, key, model="r18", split=6).headers["x-hapi-cache"] == "hit"
    assert _fetches(gateway) == fetched
    again = _hapi(gateway, "materialize", f"s3://{bucket}/", "--model", "r18", "--split", "6")
    assert again.returncode == 0 and f"({len(blobs)} objects already cached" in again.stdout


def test_materialize_bad_input_is_one_line_and_exit_2(gateway):
    done = _hapi(gateway, "materialize", "data/prefix", "--model", "r18", "--split", "2")
    assert done.returncode == 2 and "expected s3://BUCKET/PREFIX" in done.stderr


@pytest.mark.slow  # 20 s of CLI runs: `make test-slow`
def test_cache_du_ls_prune_and_rm(gateway, registered, backend_s3, photos):
    bucket, _ = photos
    before = set(_entries(backend_s3))
    for split in (1, 2, 3):
        assert _get(gateway, bucket, "cat.jpg", model="r18", split=split).status_code == 200
    _settled(gateway)
    entries = _entries(backend_s3)
    assert len(set(entries) - before) == 3
    for command in (("du",), ("ls",), ("prune", "--max-size", "1B"), ("rm", "--all")):
        refused = _hapi(gateway, "cache", *command)  # the cache is the operators'
        assert refused.returncode != 0 and "reserved for admin keys" in refused.stderr
    assert _entries(backend_s3) == entries
    du = _hapi(gateway, "cache", "du", admin=True)
    assert du.returncode == 0 and du.stdout.startswith(f"{len(entries)} packs")
    listed = _hapi(gateway, "cache", "ls", "--limit", "1000", admin=True)
    assert all(key in listed.stdout for key in entries)
    dry = _hapi(gateway, "cache", "prune", "--max-size", "1B", "--dry-run", admin=True)
    assert dry.stdout.startswith(f"would delete {len(entries)} of {len(entries)}")
    assert _entries(backend_s3) == entries
    victim = min(entries, key=lambda k: (entries[k], k))  # least recently used
    sizes = {
        o["Key"]: o["Size"] for o in backend_s3.list_objects_v2(Bucket=CACHE_BUCKET)["Contents"]
    }
    keep = sum(sizes.values()) - sizes[victim]
    pruned = _hapi(gateway, "cache", "prune", "--max-size", f"{keep}B", admin=True)
    assert pruned.returncode == 0, pruned.stderr
    assert victim not in _entries(backend_s3) and len(_entries(backend_s3)) == len(entries) - 1
    bad = _hapi(gateway, "cache", "rm", "packs/zz/nope.pack", admin=True)
    assert bad.returncode == 2 and "no such pack" in bad.stderr
    wiped = _hapi(gateway, "cache", "rm", "--all", admin=True)
    assert wiped.returncode == 0 and _entries(backend_s3) == {}


def test_the_gateway_evicts_least_recently_used_entries_beyond_its_cap(
    store, registered, backend_s3, unique_bucket
):
    from hapi.gateway import ClientKey, GatewaySettings
    from hapi.gateway._app import new_upstream_client
    from hapi.gateway.pushdown._cache import FeatureCache, encode_entry
    from hapi.protocol import ObjectIdentity, cache_key, entry_path

    settings = GatewaySettings(
        backend_url=store.endpoint_url,
        backend_credentials=Credentials(
            store.credentials.access_key_id, store.credentials.secret_access_key
        ),
        clients={"k": ClientKey("s")},
        cache_bucket=unique_bucket,
        cache_max_bytes=1,  # set below; each entry is a few KB
    )
    entry = encode_entry(np.ones((1, 256), np.float32), "float32", None, ["x"], None)

    def path(name: str) -> str:
        identity = ObjectIdentity(bucket="b", key=name, etag=name, size=1)
        return entry_path(
            cache_key(
                identity,
                blocks=registered["r18"].hashes[:2],
                preprocess=registered["r18"].preprocess.to_dict(),
                dtype="float32",
            )
        )

    async def scenario() -> list[str]:
        async with new_upstream_client(settings) as client:
            pack, _ = encode_pack([(path("any"), entry)])  # what each drain writes
            capped = settings.with_changes(cache_max_bytes=2 * len(pack))
            cache = FeatureCache(capped, StoreClient.of(capped, lambda: client))
            async with cache.running():
                for name in ("old", "mid", "new"):
                    identity = ObjectIdentity(bucket="b", key=name, etag=name, size=1)
                    cache.store(identity, registered["r18"], 2, "float32", entry)
                    await cache.drain()
                    await asyncio.sleep(1.1)  # distinct LastModified seconds
                assert await cache.evict() == 1
        return [o["Key"] for o in backend_s3.list_objects_v2(Bucket=unique_bucket)["Contents"]]

    left = asyncio.run(scenario())
    assert len(left) == 2  # a pack each: the least recently used one went
    members = set()
    for key in left:
        head = backend_s3.get_object(Bucket=unique_bucket, Key=key)["Body"].read()
        members |= set(parse_pack_index(head[PACK_HEAD : PACK_HEAD + pack_index_length(head)]))
    assert members == {path("mid"), path("new")}


def test_an_anonymous_caller_gets_no_cached_features_of_a_private_object(
    gateway, store, registered, backend_s3, photos
):
    bucket, _ = photos
    _get(gateway, bucket, "cat.jpg", model="r18", split=4)  # signed: computed and cached
    wait_for(
        lambda: _hits(gateway, bucket, "cat.jpg", model="r18", split=4),
        "a hit",
    )
    url = f"{gateway.endpoint_url}/{bucket}/cat.jpg?hapi-model=r18&hapi-split=4"
    unsigned = httpx.get(url, timeout=60)  # the store refuses the same unsigned GET
    direct = httpx.get(f"{store.endpoint_url}/{bucket}/cat.jpg", timeout=60)
    assert direct.status_code == 403
    assert unsigned.status_code == 403 and b"AccessDenied" in unsigned.content


def test_a_window_of_cache_hits_submits_no_empty_batch(
    store, registered, backend_s3, photos, tmp_path
):
    """With windows of one sample, a batch of a hit then a miss has a window answered
    entirely by the cache: it must not reach the batcher as a batch of zero rows."""
    bucket, _ = photos
    with store_gateway(
        store,
        tmp_path,
        extra_args=("--max-decoded-bytes", "1MiB"),  # one r18 sample per window
    ) as small:
        _warm(small, bucket, "coffee.jpg", model="r18", split=1)
        mixed = _batch(small, bucket, ["coffee.jpg", "cat.jpg"], model="r18", split=1)
        plain = _batch(
            small, bucket, ["coffee.jpg", "cat.jpg"], model="r18", split=1, cache="bypass"
        )

        assert mixed.status_code == plain.status_code == 200, mixed.text
        assert mixed.headers["x-hapi-cache"] == "miss"
        assert (
            decode(mixed.content)[0]["features"].tobytes()
            == decode(plain.content)[0]["features"].tobytes()
        )
        tenants = control_get(small, "/_hapi/stats", timeout=30).json()["tenants"]
        sizes = [size for tenant in tenants for size in tenant["recent_batch_sizes"]]
        assert sizes and 0 not in sizes, sizes


def test_a_cold_requests_entries_are_written_once_no_request_is_being_served(
    gateway, registered, backend_s3, unique_bucket
):
    # A cold epoch used to pay for its entries while it ran: each PUT took the storage
    # core from the samples still to compute (+22-28% on the testbed's cold epochs). Now
    # the writes wait until no pushdown request is being served. The answer below is
    # read a quarter of the way and then held: the gateway is still serving it (its send
    # waits for the reader), and no entry of its first windows may be in the store yet.
    # The reader's receive buffer is fixed small: left to autotune (up to tcp_rmem's 32
    # MiB here), the kernel once took the whole answer while the test slept, the request
    # ended, and the entries were rightly written during the "hold".
    photo = samples.chelsea()
    keys = []
    for index in range(48):
        key = f"cold/{index:02d}.jpg"
        crop = photo[index % 6 : 250 + index % 6, index : 300 + index]
        backend_s3.put_object(Bucket=unique_bucket, Key=key, Body=encode_image(crop, "JPEG"))
        keys.append(key)
    _settled(gateway)
    before = set(_entries(backend_s3))
    body = json.dumps({"keys": keys, "model": "r18", "split": 5}).encode()
    path = f"/{unique_bucket}?hapi-batch"
    headers = signed_headers(gateway, "POST", path, body=body)
    host, port = gateway.endpoint_url.removeprefix("http://").split(":")
    connection = _SmallWindow(host, int(port))
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        assert response.status == 200
        features = 4 * int(np.prod([int(n) for n in response.headers["x-hapi-shape"].split(",")]))
        # what the kernel may hold of the rest, both ends, is far less than the rest
        held = 2 * _SmallWindow.RECEIVE + _tcp_wmem_max()
        assert features - features // 4 > 2 * held, (features, held)
        received = len(response.read(features // 4))
        time.sleep(1.0)  # the old writer needed milliseconds to land the first entries
        during = set(_entries(backend_s3)) - before
        rest = len(response.read())
    finally:
        connection.close()
    assert received + rest > features
    assert during == set(), f"{len(during)} packs written while the request was served"
    wait_for(lambda: len(_members(backend_s3, before)) == 48, "the 48 entries")
    # written together: in about as few PUTs as the pack's byte bound allows, not 48
    packs = len(set(_entries(backend_s3)) - before)
    assert 1 <= packs <= math.ceil(features / PACK_BYTES) + 1, (packs, features)


class _SmallWindow(http.client.HTTPConnection):
    """A connection whose receive buffer is fixed at :attr:`RECEIVE` bytes (set before
    connecting, so the kernel does not autotune it)."""

    RECEIVE = 64 * 1024

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.RECEIVE)
        self.sock.settimeout(120)
        self.sock.connect((self.host, self.port))


def _tcp_wmem_max() -> int:
    """The most a sending socket may buffer (``net.ipv4.tcp_wmem``'s maximum)."""
    return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
