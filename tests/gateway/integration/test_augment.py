"""Augmented views through the real gateway and store: torchvision's features at every
split, the same views from any gateway, refusals before any fetch, and views in the
feature cache (never mixed, K views then hits, the MAC over the view)."""

from __future__ import annotations

import io
import json
import re
import urllib.parse
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data as samples

from hapi.models import testing
from hapi.protocol import ViewParams
from hapi.protocol import decode_features as decode
from tests.models.unit.test_augment import torchvision_input
from tests.support import (
    RunningGateway,
    cache_writes_settled,
    encode_image,
    signed_headers,
    store_gateway,
    wait_for,
)

POLICY = (
    "crop(scale=0.08:1,ratio=0.75:1.3333);flip(p=0.5);"
    "jitter(brightness=0.4,contrast=0.4,saturation=0.4,hue=0.1)"
)
CACHE_BUCKET = "hapi-cache"


def _get(gateway, bucket: str, key: str, **params: object) -> httpx.Response:
    query = urllib.parse.urlencode({f"hapi-{k}": str(v) for k, v in params.items()})
    path = f"/{bucket}/{key}?{query}"
    headers = signed_headers(gateway, "GET", path, body=b"")
    return httpx.get(gateway.endpoint_url + path, headers=headers, timeout=120)


def _features(reply: httpx.Response) -> np.ndarray:
    assert reply.status_code == 200, reply.text
    return decode(reply.content)[0]["features"]


def _view(reply: httpx.Response) -> ViewParams:
    return ViewParams.from_dict(json.loads(reply.headers["x-hapi-view"]))


@pytest.fixture(scope="module")
def photos(backend_s3) -> tuple[str, dict[str, bytes]]:
    bucket = "augment-data"
    backend_s3.create_bucket(Bucket=bucket)
    blobs = {
        "cat.jpg": encode_image(samples.chelsea(), "JPEG"),
        "astronaut.png": encode_image(samples.astronaut(), "PNG"),
    }
    for key, blob in blobs.items():
        backend_s3.put_object(Bucket=bucket, Key=key, Body=blob)
    return bucket, blobs


@pytest.fixture(scope="module")
def second_gateway(store, tmp_path_factory) -> Iterator[RunningGateway]:
    """Another gateway process on the same store, started after the first."""
    with store_gateway(store, tmp_path_factory.mktemp("second-gateway")) as running:
        yield running


def _torch(family: str, inputs: np.ndarray, split: int) -> np.ndarray:
    x = torch.from_numpy(inputs[None])
    with torch.no_grad():
        for block in testing.build(family).blocks[:split]:
            x = block(x)
    return x.numpy()


@pytest.mark.parametrize(("name", "family"), [("r18", "resnet18"), ("enl0", "efficientnet_lite0")])
def test_every_split_equals_torchvision_with_the_reported_parameters(
    gateway, registered, photos, name, family
):
    bucket, blobs = photos
    manifest = registered[name]
    image = Image.open(io.BytesIO(blobs["astronaut.png"])).convert("RGB")
    boxes = set()
    for split in range(manifest.freeze + 1):
        reply = _get(
            gateway, bucket, "astronaut.png", model=name, split=split, augment=POLICY, epoch=split
        )
        got, view = _features(reply), _view(reply)
        assert view.view == split and view.box is not None
        boxes.add(view.box)
        want = _torch(family, torchvision_input(image, view, manifest.preprocess), split)
        if split == 0:  # the input itself: torchvision's pixels, bit for bit
            np.testing.assert_array_equal(got, want)
        tolerance = 1e-4 * max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() <= tolerance, (name, split)
        assert reply.headers["x-hapi-cache"] == "bypass"  # views=0: a fresh view, not cached
    assert len(boxes) == manifest.freeze + 1  # each epoch drew its own view


def test_two_gateways_draw_the_same_views_and_epochs_differ(
    gateway, second_gateway, registered, photos
):
    bucket, _ = photos
    asked = {"model": "r18", "split": 3, "augment": POLICY, "seed": 42}
    first = _get(gateway, bucket, "cat.jpg", **asked, epoch=1)
    again = _get(second_gateway, bucket, "cat.jpg", **asked, epoch=1)
    assert first.headers["x-hapi-view"] == again.headers["x-hapi-view"]
    np.testing.assert_array_equal(_features(first), _features(again))
    other = _get(second_gateway, bucket, "cat.jpg", **asked, epoch=2)
    assert _view(other).box != _view(first).box
    assert not np.array_equal(_features(other), _features(first))
    reseeded = _get(gateway, bucket, "cat.jpg", **{**asked, "seed": 43}, epoch=1)
    assert _view(reseeded) != _view(first)


def test_a_batch_and_the_json_summary_report_each_samples_view(gateway, registered, photos):
    bucket, _ = photos
    body = json.dumps(
        {
            "keys": ["cat.jpg", "astronaut.png"],
            "model": "r18",
            "split": 2,
            "augment": {"crop": {"scale": [0.5, 1]}, "flip": 0.5},
            "seed": 9,
        }
    ).encode()
    path = f"/{bucket}?hapi-batch"
    headers = signed_headers(gateway, "POST", path, body=body)
    reply = httpx.post(gateway.endpoint_url + path, content=body, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    views = json.loads(decode(reply.content)[1]["views"])
    assert len(views) == 2 and "x-hapi-view" not in reply.headers
    single = _get(
        gateway,
        bucket,
        "astronaut.png",
        model="r18",
        split=2,
        seed=9,
        format="json",
        augment="crop(scale=0.5:1);flip(p=0.5)",
    )
    assert single.status_code == 200, single.text
    assert single.json()["views"] == [views[1]]  # the same view, asked alone or in a batch
    assert json.loads(single.headers["x-hapi-view"]) == views[1]


def _fetches(gateway) -> float:
    headers = signed_headers(gateway, "GET", "/metrics", body=b"")
    text = httpx.get(f"{gateway.endpoint_url}/metrics", headers=headers, timeout=30).text
    found = re.findall(r'^hapi_pushdown_object_fetches_total\{placement="\w+"\} (\S+)$', text, re.M)
    return sum(float(value) for value in found)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"augment": "rotate(degrees=10)"}, "rotate"),
        ({"augment": "jitter(hue=0.9)"}, "jitter.hue"),
        ({"augment": "crop(scale=0:2)"}, "crop.scale"),
        ({"augment": "flip(p=0.5)", "views": -1}, "x-hapi-views"),
        ({"augment": "flip(p=0.5)", "views": 5000}, "x-hapi-views"),
        ({"seed": 3}, "x-hapi-seed"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_before_any_fetch(
    gateway, registered, photos, params, named
):
    bucket, _ = photos
    fetched = _fetches(gateway)
    # The object does not even exist: a 400 rather than a 404 shows nothing was fetched.
    reply = _get(gateway, bucket, "no-such-object.jpg", model="r18", split=2, **params)
    assert reply.status_code == 400, reply.text
    assert "<Code>InvalidArgument</Code>" in reply.text and named in reply.text
    assert _fetches(gateway) == fetched


# -- views in the feature cache ------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_write_pending(request: pytest.FixtureRequest) -> None:
    """Each test that reads the cache bucket starts with no entry of an earlier test still
    to land (the gateway writes entries once it has served no request for a moment)."""
    if "gateway" in request.fixturenames:
        cache_writes_settled(request.getfixturevalue("gateway"))


def _entries(backend_s3) -> set[str]:
    try:
        pages = backend_s3.get_paginator("list_objects_v2").paginate(Bucket=CACHE_BUCKET)
        return {o["Key"] for p in pages for o in p.get("Contents", [])}
    except backend_s3.exceptions.NoSuchBucket:
        return set()


def _new_entry(backend_s3, before: set[str]) -> str:
    found: list[str] = []

    def written() -> bool:
        found[:] = sorted(_entries(backend_s3) - before)
        return len(found) == 1

    wait_for(written, "one new cache pack")
    return found[0]


@pytest.fixture
def fresh(backend_s3, unique_bucket) -> str:
    backend_s3.put_object(
        Bucket=unique_bucket, Key="cat.jpg", Body=encode_image(samples.chelsea(), "JPEG")
    )
    return unique_bucket


def test_k_views_are_cached_apart_then_every_epoch_hits(gateway, registered, backend_s3, fresh):
    asked = {"model": "r18", "split": 4, "augment": POLICY, "seed": 5, "views": 2}
    computed, entries = {}, {}
    for epoch in (0, 1):
        before = _entries(backend_s3)
        reply = _get(gateway, fresh, "cat.jpg", **asked, epoch=epoch)
        assert reply.headers["x-hapi-cache"] == "miss"
        computed[epoch] = (_features(reply), reply.headers["x-hapi-view"])
        entries[epoch] = _new_entry(backend_s3, before)  # one entry per view
    assert entries[0] != entries[1]
    assert not np.array_equal(computed[0][0], computed[1][0])
    for epoch in (2, 3, 4, 5):  # epoch e reads view e mod 2, from the cache
        reply = _get(gateway, fresh, "cat.jpg", **asked, epoch=epoch)
        assert reply.headers["x-hapi-cache"] == "hit", epoch
        features, view = computed[epoch % 2]
        np.testing.assert_array_equal(_features(reply), features)
        assert reply.headers["x-hapi-view"] == view  # a hit reports the view it holds
    plain = _get(gateway, fresh, "cat.jpg", model="r18", split=4)
    assert plain.headers["x-hapi-cache"] == "miss"  # the preset's features are not a view
    assert "x-hapi-view" not in plain.headers


def test_no_views_cached_means_no_entry_written(gateway, registered, backend_s3, fresh):
    before = _entries(backend_s3)
    for epoch in (0, 0, 1):
        reply = _get(gateway, fresh, "cat.jpg", model="r18", split=4, augment=POLICY, epoch=epoch)
        assert reply.headers["x-hapi-cache"] == "bypass"
    assert _entries(backend_s3) == before


def test_the_mac_covers_the_view_index(gateway, second_gateway, registered, backend_s3, fresh):
    asked = {"model": "r18", "split": 5, "augment": POLICY, "seed": 6, "views": 2}
    before = _entries(backend_s3)
    view0 = _get(gateway, fresh, "cat.jpg", **asked, epoch=0)
    entry0 = _new_entry(backend_s3, before)
    before = _entries(backend_s3)
    view1 = _get(gateway, fresh, "cat.jpg", **asked, epoch=1)
    entry1 = _new_entry(backend_s3, before)
    # View 0's pack, MAC header and all, copied over view 1's: a valid pack of the wrong
    # view (each view a context of its own), which the MAC (over the pack's path, so its
    # view) must refuse, read by the other gateway (the first holds its own packs in
    # memory, and never reads them back).
    assert entry0.rsplit("/", 1)[0] != entry1.rsplit("/", 1)[0]  # a prefix a view
    stored = backend_s3.get_object(Bucket=CACHE_BUCKET, Key=entry0)
    body = stored["Body"].read()
    backend_s3.put_object(Bucket=CACHE_BUCKET, Key=entry1, Body=body, Metadata=stored["Metadata"])
    wait_for(
        lambda: backend_s3.get_object(Bucket=CACHE_BUCKET, Key=entry1)["Body"].read() == body,
        "the store to serve the copied pack",
    )
    again = _get(second_gateway, fresh, "cat.jpg", **asked, epoch=1)
    assert again.headers["x-hapi-cache"] == "miss"
    np.testing.assert_array_equal(_features(again), _features(view1))
    assert not np.array_equal(_features(again), _features(view0))
    assert "cache pack without a valid MAC was ignored" in second_gateway.log()
    # the first gateway: its own copy in memory, or the forgery refused; view 1 either way
    held = _get(gateway, fresh, "cat.jpg", **asked, epoch=1)
    np.testing.assert_array_equal(_features(held), _features(view1))


def test_materialize_precomputes_k_views_then_every_epoch_hits(gateway, registered, fresh):
    from tests.gateway.integration.test_cache import _hapi

    args = ("--model", "r18", "--split", "6", "--augment", POLICY, "--seed", "8", "--views", "3")
    done = _hapi(gateway, "materialize", f"s3://{fresh}/", *args)
    assert done.returncode == 0, done.stderr
    asked = {"model": "r18", "split": 6, "augment": POLICY, "seed": 8, "views": 3}
    wait_for(
        lambda: all(
            _get(gateway, fresh, "cat.jpg", **asked, epoch=e).headers["x-hapi-cache"] == "hit"
            for e in range(3)
        ),
        "the three views",
    )
    fetched = _fetches(gateway)
    boxes = set()
    for epoch in range(6):  # two passes over the three views, from the cache
        reply = _get(gateway, fresh, "cat.jpg", **asked, epoch=epoch)
        assert reply.headers["x-hapi-cache"] == "hit"
        boxes.add(tuple(_view(reply).box or ()))
    assert len(boxes) == 3 and _fetches(gateway) == fetched
    bad = _hapi(
        gateway,
        "materialize",
        f"s3://{fresh}/",
        "--model",
        "r18",
        "--split",
        "6",
        "--augment",
        POLICY,
    )
    assert bad.returncode == 2 and "--views" in bad.stderr
