"""hapi.sdk against the real gateway and the real store: the same features at every
split and without pushdown, DataLoader workers, DDP sharding, fallback, typed errors."""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import re
import secrets
import tarfile
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hapi import planner, sdk
from hapi.models import Registry
from tests.sdk.support import picture
from tests.support import empty_bucket

CLASSES = ("circle", "square", "stripes")
PER_CLASS = 4


def _shard(members: list[tuple[str, bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for stem, jpeg, label in members:
            for name, payload in ((f"{stem}.jpg", jpeg), (f"{stem}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def data(backend_s3: Any) -> Iterator[dict[str, Any]]:
    """A bucket with class folders, a label manifest, a corrupt object and two shards."""
    bucket = f"sdk-{secrets.token_hex(5)}"
    backend_s3.create_bucket(Bucket=bucket)
    keys, members = [], []
    for label, kind in enumerate(CLASSES):
        for i in range(PER_CLASS):
            key, jpeg = f"train/{kind}/{i:03d}.jpg", picture(kind, 10 * label + i)
            backend_s3.put_object(Bucket=bucket, Key=key, Body=jpeg)
            keys.append(key)
            members.append((f"{kind}-{i:03d}", jpeg, label))
    rows = "key,label\n" + "".join(f"{key},{n}\n" for n, key in enumerate(keys))
    backend_s3.put_object(Bucket=bucket, Key="labels.csv", Body=rows.encode())
    backend_s3.put_object(Bucket=bucket, Key="broken/bad.jpg", Body=b"\xff\xd8 not a jpeg")
    backend_s3.put_object(Bucket=bucket, Key="broken/good.jpg", Body=picture("circle", 99))
    for n in range(2):
        shard = _shard(members[n * 6 : n * 6 + 6])
        backend_s3.put_object(Bucket=bucket, Key=f"shards/shard-{n:03d}.tar", Body=shard)
    yield {"bucket": bucket, "keys": keys}
    empty_bucket(backend_s3, bucket)
    backend_s3.delete_bucket(Bucket=bucket)


def _credentials(endpoint: Any) -> dict[str, Any]:
    key = getattr(endpoint, "access_key_id", None) or endpoint.credentials.access_key_id
    secret = getattr(endpoint, "secret_access_key", None) or endpoint.credentials.secret_access_key
    return {"aws_access_key_id": key, "aws_secret_access_key": secret, "region_name": "us-east-1"}


def _through(endpoint: Any, **options: Any) -> dict[str, Any]:
    """Dataset arguments for the gateway (or the plain store)."""
    return {
        "endpoint_url": endpoint.endpoint_url,
        "client_options": _credentials(endpoint),
        **options,
    }


def _all(dataset: Any) -> tuple[np.ndarray, list[int]]:
    if isinstance(dataset, sdk.IterableFeatureDataset):
        items = list(dataset)
    else:
        items = dataset.__getitems__(list(range(len(dataset))))
    return np.stack([f.numpy() for f, _ in items]), [label for _, label in items]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    # 1e-4 absolute, scaled for activations above 1 in magnitude (as test_pushdown does).
    assert got.shape == want.shape
    tolerance = 1e-4 * max(1.0, float(np.abs(want).max()))
    assert float(np.abs(got - want).max()) <= tolerance


def _ran(split: int | None) -> tuple[str, int | None]:
    """The mode and split stats report when the split chosen ran: no pushdown computes
    here by choice, and any split must have been pushed down (not fallen back from)."""
    return ("local", None) if split is None else ("pushdown", split)


def _local(data: dict[str, Any], gateway: Any, model: str, **options: Any) -> sdk.FeatureDataset:
    return sdk.FeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/", model=model, **_through(gateway, split=None, **options)
    )


# -- the client --------------------------------------------------------------------------


def test_client_is_a_boto3_client_that_signs_the_hapi_headers(gateway, registered, data):
    s3 = sdk.client(gateway.endpoint_url, **_credentials(gateway))
    bucket, key = data["bucket"], data["keys"][0]
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] > 0  # ordinary S3
    sent: list[Any] = []
    s3.meta.events.register("before-send.s3.GetObject", lambda request, **_: sent.append(request))
    reply = s3.get_features(bucket, key, model="r18", split=3)
    signed = sent[0].headers["Authorization"].decode().split("SignedHeaders=")[1].split(",")[0]
    assert {"x-hapi-model", "x-hapi-split", "x-hapi-dtype"} <= set(signed.split(";"))
    assert reply.keys == (key,) and reply.split == 3 and reply.model == registered["r18"].ref
    assert reply.features.shape == (1, *registered["r18"].blocks[2].output_shape)
    # What crossed the wire: after a ReLU, fewer bytes than the features (zeros encoding).
    assert 0 < reply.nbytes < reply.features.nbytes and "infer" in reply.server_timing


def test_batch_stacks_in_order_and_reports_failures_by_key(gateway, registered, data):
    s3 = sdk.client(gateway.endpoint_url, **_credentials(gateway))
    bucket, keys = data["bucket"], data["keys"]
    asked = [keys[3], "broken/bad.jpg", keys[0], "missing.jpg"]
    reply = s3.get_features_batch(bucket, asked, model="r18", split=2, dtype="float16")
    assert reply.keys == (keys[3], keys[0]) and reply.dtype == "float16"
    assert isinstance(reply.errors["broken/bad.jpg"], sdk.UnprocessableObject)
    assert isinstance(reply.errors["missing.jpg"], sdk.NoSuchKey)
    with pytest.raises(sdk.UnprocessableObject, match=re.escape("broken/bad.jpg")):
        reply.raise_for_errors()
    one = s3.get_features(bucket, keys[0], model="r18", split=2).features
    assert np.abs(reply.features[1] - one[0]).max() <= 1e-2 * np.abs(one).max()


def test_get_features_asks_for_augmented_views_in_any_spelling(gateway, registered, data):
    from hapi.models import decode_object
    from hapi.protocol import Augmentation, AugmentPolicy

    s3 = sdk.client(gateway.endpoint_url, **_credentials(gateway))
    bucket, keys = data["bucket"], data["keys"]
    spec = "crop(scale=0.3:1);flip(p=0.5);jitter(brightness=0.3)"
    spelled = [
        spec,
        AugmentPolicy.parse(spec),
        {"crop": {"scale": [0.3, 1]}, "flip": 0.5, "jitter": {"brightness": 0.3}},
    ]
    replies = [
        s3.get_features(bucket, keys[0], model="r18", split=0, augment=a, seed=4, epoch=2)
        for a in spelled
    ]
    for reply in replies[1:]:
        np.testing.assert_array_equal(reply.features, replies[0].features)
        assert reply.views == replies[0].views
    assert replies[0].views is not None and replies[0].views[0]["view"] == 2
    # The SDK's local path (decode_object, as the fallback uses it) draws the same view.
    raw = s3.get_object(Bucket=bucket, Key=keys[0])["Body"].read()
    augment = Augmentation(policy=AugmentPolicy.parse(spec), seed=4, epoch=2, bucket=bucket)
    [local] = decode_object(raw, registered["r18"].preprocess, key=keys[0], augment=augment)
    np.testing.assert_array_equal(replies[0].features[0], local.array)
    batch = s3.get_features_batch(
        bucket, [keys[1], keys[0]], model="r18", split=0, augment=spec, seed=4, epoch=2
    )
    assert batch.views is not None and batch.views[1] == replies[0].views[0]
    np.testing.assert_array_equal(batch.features[1], replies[0].features[0])
    assert s3.get_features(bucket, keys[0], model="r18", split=0).views is None
    with pytest.raises(ValueError, match=r"jitter\.hue"):
        s3.get_features(bucket, keys[0], model="r18", split=0, augment="jitter(hue=2)")


def test_datasets_draw_a_fresh_view_each_epoch_on_either_side_of_the_network(
    gateway, registered, data
):
    augment = "crop(scale=0.3:1);flip(p=0.5);jitter(contrast=0.3)"

    def train(split: int | None) -> sdk.FeatureDataset:
        return sdk.FeatureDataset.from_prefix(
            f"s3://{data['bucket']}/train/",
            model="r18",
            **_through(gateway, split=split, augment=augment, seed=2),
        )

    pushed, local = train(3), train(None)
    epochs = []
    for epoch in (0, 1):
        pushed.set_epoch(epoch)
        local.set_epoch(epoch)
        got = _all(pushed)[0]
        _close(got, _all(local)[0])  # the gateway's views are the local path's
        epochs.append(got)
    assert not np.allclose(epochs[0], epochs[1])  # each epoch a fresh view
    pushed.set_epoch(0)
    np.testing.assert_array_equal(_all(pushed)[0], epochs[0])  # and the same one again
    evaluation = sdk.FeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/", model="r18", **_through(gateway, split=3)
    )
    assert evaluation.augment is None and pushed.augment is not None
    assert not np.allclose(_all(evaluation)[0], epochs[0])  # the preset's centre crop


def test_endpoint_comes_from_argument_then_s3_variable_then_generic(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://generic.example:1")
    assert sdk.client(region_name="us-east-1").meta.endpoint_url == "http://generic.example:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3.example:2")
    assert sdk.client(region_name="us-east-1").meta.endpoint_url == "http://s3.example:2"
    given = sdk.client("http://given.example:3", region_name="us-east-1")
    assert given.meta.endpoint_url == "http://given.example:3"


def test_client_errors_are_typed_and_name_the_key(gateway, registered, data):
    s3 = sdk.client(gateway.endpoint_url, **_credentials(gateway))
    bucket = data["bucket"]
    with pytest.raises(
        sdk.NoSuchModel, match=re.escape(f"s3://{bucket}/train/circle/000.jpg")
    ) as caught:
        s3.get_features(bucket, "train/circle/000.jpg", model="no-such-model", split=1)
    assert caught.value.status == 404 and caught.value.request_id
    with pytest.raises(sdk.UnprocessableObject, match=re.escape("broken/bad.jpg")):
        s3.get_features(bucket, "broken/bad.jpg", model="r18", split=1)
    with pytest.raises(sdk.InvalidArgument, match="split"):
        s3.get_features(bucket, "train/circle/000.jpg", model="r18", split=9)


# -- same features at every split --------------------------------------------------------


@pytest.mark.parametrize(("model", "splits"), [("r18", (0, 1, 4, 6)), ("enl0", (0, 7, 19))])
def test_features_at_split_k_equal_raw_objects_computed_here(
    gateway, registered, data, model, splits
):
    local = _local(data, gateway, model)
    want, want_labels = _all(local)
    assert local.split is None and not local.pushdown
    assert want.shape[1:] == tuple(registered[model].blocks[local.freeze - 1].output_shape)
    for split in splits:
        dataset = sdk.FeatureDataset.from_prefix(
            f"s3://{data['bucket']}/train/", model=model, **_through(gateway, split=split)
        )
        got, labels = _all(dataset)
        _close(got, want)
        assert labels == want_labels == [n // PER_CLASS for n in range(len(CLASSES) * PER_CLASS)]
        assert dataset.pushdown and dataset.classes == CLASSES
        assert (dataset.stats.mode, dataset.stats.split) == ("pushdown", split)


def test_the_encoding_changes_the_bytes_on_the_wire_not_the_features(gateway, registered, data):
    prefix = f"s3://{data['bucket']}/train/"
    made = {
        encoding: sdk.FeatureDataset.from_prefix(
            prefix, model="r18", **_through(gateway, split=3, encoding=encoding)
        )
        for encoding in ("zeros", "dense")
    }
    got = {encoding: _all(dataset) for encoding, dataset in made.items()}
    np.testing.assert_array_equal(got["zeros"][0], got["dense"][0])
    assert got["zeros"][1] == got["dense"][1]
    received = {encoding: d.stats.bytes_received for encoding, d in made.items()}
    assert 0 < received["zeros"] < 0.9 * received["dense"], received
    with pytest.raises(ValueError, match="encoding must be one of dense, zeros"):
        sdk.FeatureDataset.from_prefix(prefix, model="r18", **_through(gateway, encoding="lz4"))


def test_same_loss_trajectory_at_two_splits(gateway, registered, data):
    def losses(split: int) -> list[float]:
        dataset = sdk.IterableFeatureDataset.from_prefix(
            f"s3://{data['bucket']}/train/",
            model="r18",
            **_through(gateway, split=split, shuffle=True, seed=7, request_size=5),
        )
        torch.manual_seed(0)
        head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256 * 14 * 14, 3))
        optimizer = torch.optim.SGD(head.parameters(), lr=1e-3)
        trajectory = []
        for epoch in range(2):
            dataset.set_epoch(epoch)
            for features, labels in DataLoader(dataset, batch_size=4):
                loss = torch.nn.functional.cross_entropy(head(features), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                trajectory.append(loss.item())
        assert [(stats.mode, stats.split) for stats in dataset.history] == [("pushdown", split)] * 2
        return trajectory

    first, second = losses(2), losses(6)
    assert len(first) == 6
    np.testing.assert_allclose(first, second, rtol=1e-4, atol=1e-5)


def test_shards_give_every_member_with_its_cls_label(gateway, registered, data):
    uri = f"s3://{data['bucket']}/shards/"
    pushed = sdk.FeatureDataset.from_shards(uri, model="enl0", **_through(gateway, split=5))
    local = sdk.IterableFeatureDataset.from_shards(
        uri, model="enl0", **_through(gateway, split=None)
    )
    assert isinstance(pushed, sdk.IterableFeatureDataset)
    got, labels = _all(pushed)
    assert pushed.stats is not None and pushed.stats.mode == "pushdown"
    want, want_labels = _all(local)
    _close(got, want)
    assert labels == want_labels == [n // PER_CLASS for n in range(12)]
    flat, _ = _all(_local(data, gateway, "enl0"))
    _close(got, flat)  # a shard member gives what the same image alone gives


# -- processes --------------------------------------------------------------------------


# Not "fork": this process has run onnxruntime already (here and in earlier tests), and
# onnxruntime is not fork-safe once it has run (a forked worker can hang; README says so).
@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_dataloader_with_two_workers(gateway, registered, data, start):
    dataset = sdk.FeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/", model="r18", **_through(gateway, split=4, request_size=3)
    )
    want, want_labels = _all(dataset)
    assert dataset.stats.mode == "pushdown"  # here; each worker keeps its own stats
    loaded = DataLoader(dataset, batch_size=5, num_workers=2, multiprocessing_context=start)
    batches = list(loaded)
    got = torch.cat([features for features, _ in batches]).numpy()
    _close(got, want)
    assert torch.cat([labels for _, labels in batches]).tolist() == want_labels
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy._runtime is None and len(copy) == len(dataset)
    _close(copy[2][0].numpy()[None], want[2:3])


def test_rank_then_worker_sharding_reads_each_sample_once(gateway, registered, data):
    seen: Counter[int] = Counter()
    lengths = []
    for rank in range(2):
        dataset = sdk.IterableFeatureDataset.from_prefix(
            f"s3://{data['bucket']}/train/",
            model="enl0",
            labels=f"manifest:s3://{data['bucket']}/labels.csv",
            **_through(gateway, split=7, shuffle=True, seed=3, rank=rank, world_size=2),
        )
        dataset.set_epoch(5)
        lengths.append(len(dataset))
        for _, labels in DataLoader(dataset, batch_size=2, num_workers=2):
            seen.update(labels.tolist())
    assert lengths == [6, 6]
    assert seen == Counter(range(len(CLASSES) * PER_CLASS))  # every sample exactly once


# -- fallback ---------------------------------------------------------------------------


def test_plain_store_falls_back_to_local_compute_with_one_warning(store, gateway, registered, data):
    want, _ = _all(_local(data, gateway, "enl0"))
    dataset = sdk.IterableFeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/",
        model="enl0",
        **_through(store, split=4, request_size=4, prefetch=2),
    )
    with pytest.warns(sdk.FallbackWarning, match="does not serve hapi pushdown") as caught:
        got, _ = _all(dataset)
        again, _ = _all(dataset)
    assert len([w for w in caught if w.category is sdk.FallbackWarning]) == 1
    _close(got, want)
    _close(again, want)
    assert not dataset.pushdown and dataset.stats is not None and dataset.stats.mode == "local"
    assert dataset.stats.bytes_received == dataset.raw_bytes


def test_gateway_without_the_model_falls_back(gateway, registered, backend_s3, data):
    private = f"sdk-models-{secrets.token_hex(4)}"
    backend_s3.create_bucket(Bucket=private)
    manifest = dataclasses.replace(registered["r18"], name="r18-private", version=1)
    for digest in manifest.hashes:
        source = {"Bucket": "hapi-models", "Key": f"blocks/sha256/{digest}.onnx"}
        backend_s3.copy_object(CopySource=source, Bucket=private, Key=source["Key"])
    backend_s3.put_object(Bucket=private, Key="models/r18-private/1.json", Body=manifest.to_json())
    backend_s3.put_object(Bucket=private, Key="models/r18-private/latest", Body=b"1")
    try:
        want, _ = _all(_local(data, gateway, "r18"))
        dataset = sdk.FeatureDataset.from_prefix(
            f"s3://{data['bucket']}/train/",
            model="r18-private",
            **_through(gateway, split=3, registry_bucket=private),
        )
        with pytest.warns(sdk.FallbackWarning, match=re.escape("has no model r18-private@1")):
            got, _ = _all(dataset)
        _close(got, want)
    finally:
        empty_bucket(backend_s3, private)
        backend_s3.delete_bucket(Bucket=private)


def _signing_from_the_environment(monkeypatch: pytest.MonkeyPatch, key: str, secret: str) -> None:
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)


def _built_then_rotated(
    monkeypatch: pytest.MonkeyPatch, endpoint: Any, uri: str, wrong: str, **options: Any
) -> sdk.IterableFeatureDataset:
    """A dataset built with the endpoint's key, as a DataLoader worker or a DDP rank gets it
    after the key changed: its copy signs with the key the environment holds then."""
    given = _credentials(endpoint)
    key, secret = given["aws_access_key_id"], given["aws_secret_access_key"]
    _signing_from_the_environment(monkeypatch, key, secret)
    dataset = sdk.IterableFeatureDataset.from_prefix(
        uri,
        endpoint_url=endpoint.endpoint_url,
        client_options={"region_name": "us-east-1"},
        **options,
    )
    if wrong == "secret":
        secret = secrets.token_hex(20)
    else:
        key = "UNKNOWN" + secrets.token_hex(6).upper()
    _signing_from_the_environment(monkeypatch, key, secret)
    copy: sdk.IterableFeatureDataset = pickle.loads(pickle.dumps(dataset))
    return copy


@pytest.mark.parametrize(
    ("wrong", "code"), [("secret", "SignatureDoesNotMatch"), ("key", "InvalidAccessKeyId")]
)
def test_a_refusal_from_the_gateway_is_raised_at_its_batch_and_pushdown_stays_on(
    gateway, registered, data, monkeypatch, wrong, code
):
    dataset = _built_then_rotated(
        monkeypatch,
        gateway,
        f"s3://{data['bucket']}/train/",
        wrong,
        model="enl0",
        split=7,
        request_size=4,
        prefetch=1,
    )
    items = iter(dataset)
    with pytest.raises(sdk.AccessDenied) as refused:
        next(items)  # the first batch's request was refused
    error = refused.value
    assert (error.code, error.status, error.bucket) == (code, 403, data["bucket"])
    assert error.request_id  # the gateway's: it was the gateway that refused
    assert dataset.pushdown and dataset.stats is not None and dataset.stats.samples == 0
    with pytest.raises(sdk.AccessDenied):
        list(dataset)  # the next epoch asks the gateway again: nothing was computed here


def test_a_plain_store_refusing_the_key_is_raised_at_the_batch(
    store, registered, data, monkeypatch
):
    # The store is plain (it answers the batch request 405): that is the fallback, and
    # the raw reads then meet the store's refusal, which is raised, typed.
    dataset = _built_then_rotated(
        monkeypatch,
        store,
        f"s3://{data['bucket']}/train/",
        "secret",
        model="r18",
        split=2,
        request_size=4,
        prefetch=1,
    )
    with (
        pytest.warns(sdk.FallbackWarning, match="does not serve hapi pushdown"),
        pytest.raises(sdk.AccessDenied, match="SignatureDoesNotMatch") as refused,
    ):
        next(iter(dataset))
    assert refused.value.status == 403 and refused.value.bucket == data["bucket"]
    assert not dataset.pushdown


# -- errors -----------------------------------------------------------------------------


def test_unknown_model_is_a_clear_error(gateway, registered, data):
    with pytest.raises(sdk.NoSuchModel, match="no-such-model"):
        sdk.FeatureDataset.from_prefix(
            f"s3://{data['bucket']}/train/", model="no-such-model", **_through(gateway)
        )


@pytest.mark.parametrize("split", [3, None])
def test_corrupt_object_surfaces_in_the_training_loop_naming_the_key(
    gateway, registered, data, split
):
    dataset = sdk.IterableFeatureDataset.from_prefix(
        f"s3://{data['bucket']}/broken/",
        model="r18",
        labels=None,
        **_through(gateway, split=split, request_size=1, prefetch=2),
    )
    with pytest.raises(
        sdk.UnprocessableObject, match=re.escape(f"s3://{data['bucket']}/broken/bad.jpg")
    ):
        for _features, label in DataLoader(dataset, batch_size=1):
            assert label.item() == -1


def test_bad_arguments_are_value_errors(gateway, registered, data):
    uri = f"s3://{data['bucket']}/train/"
    with pytest.raises(ValueError, match=r"0\.\.6"):
        sdk.FeatureDataset.from_prefix(uri, model="r18", **_through(gateway, split=7))
    with pytest.raises(ValueError, match="known: folder"):
        sdk.FeatureDataset.from_prefix(uri, model="r18", **_through(gateway, labels="colour"))
    with pytest.raises(sdk.LabelError, match="no label"):
        sdk.FeatureDataset.from_prefix(
            f"s3://{data['bucket']}/broken/",
            model="r18",
            **_through(gateway, labels=f"manifest:s3://{data['bucket']}/labels.csv"),
        )


# -- split="auto" and stats -------------------------------------------------------------


def test_auto_split_is_explained_and_gives_the_same_features(gateway, registered, data):
    dataset = sdk.IterableFeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/", model="enl0", **_through(gateway, progress=True)
    )
    choice = dataset.split_choice
    got, _ = _all(dataset)
    assert choice.split is None or 0 <= choice.split <= dataset.freeze
    # The planner read the gateway's view (signed with the client's credentials) and,
    # with no bandwidth known and none probed, starts at the split sending the fewest
    # bytes; the epoch's own responses measured the link for it.
    assert choice.policy == "fewest-bytes" and choice.basis is not None, choice.reason
    assert "once its own responses have measured the link" in choice.reason
    assert dataset.split_choice.bandwidth_source == "measured"
    assert dataset.split_choice.plan is not None
    want, _ = _all(_local(data, gateway, "enl0"))
    _close(got, want)
    stats = dataset.stats
    assert stats is not None and (stats.mode, stats.split) == _ran(choice.split)
    assert stats.samples == len(got) and stats.requests == 1
    assert stats.bytes_received > 0 and stats.wait_seconds >= 0 and stats.samples_per_s > 0
    assert str(stats).startswith("epoch 0: 12 samples")


def test_pushdown_receives_fewer_bytes_than_the_objects(gateway, registered, data):
    dataset = sdk.FeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/",
        model="enl0",
        **_through(gateway, split=19, dtype="float16"),
    )
    _all(dataset)
    stats = dataset.stats
    assert stats.mode == "pushdown" and stats.split == 19 and stats.samples == 12
    assert dataset.raw_bytes is not None and stats.bytes_received < dataset.raw_bytes


def test_registry_reads_go_through_the_gateway(gateway, registered):
    s3 = sdk.client(gateway.endpoint_url, **_credentials(gateway))
    assert Registry(s3).get_manifest("enl0").ref == registered["enl0"].ref
    key = f"models/enl0/{registered['enl0'].version}.json"
    assert json.loads(s3.get_object(Bucket="hapi-models", Key=key)["Body"].read())["name"] == "enl0"


def test_auto_split_on_one_box_never_receives_more_than_the_raw_objects(gateway, registered, data):
    # The gateway runs on this machine: the plan must know the tiers share its cores and
    # must not buy a "speedup" with more bytes than the objects themselves.
    dataset = sdk.FeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/",
        model="enl0",
        **_through(gateway, split="auto", bandwidth="100mbit"),
    )
    _all(dataset)
    choice = dataset.split_choice
    assert choice.bandwidth_source == "hint"
    assert choice.plan is not None and choice.plan.profile.shared_compute
    assert "same machine" in choice.reason
    # Nothing ran here to count the features' zeros: the manifest's count prices them.
    assert registered["enl0"].zeros is not None
    assert choice.plan.profile.zeros == registered["enl0"].zeros
    stats = dataset.stats
    assert (stats.mode, stats.split) == _ran(choice.split)
    assert dataset.raw_bytes is not None and stats.bytes_received <= dataset.raw_bytes


def test_named_objects_are_planned_at_their_own_size_not_a_default(
    gateway, registered, data, backend_s3
):
    # from_objects lists nothing, so no sizes come with the keys: the planner must price
    # raw reads at what the objects weigh (a HEAD of a few), not at its 110 KB default,
    # which made pushdown look better than it is for small images.
    keys = data["keys"]
    dataset = sdk.FeatureDataset.from_objects(
        [f"s3://{data['bucket']}/{key}" for key in keys],
        model="enl0",
        labels="folder",
        **_through(gateway, split="auto", bandwidth="10mbit"),
    )
    assert dataset.raw_bytes is None  # nothing was listed
    sizes = [backend_s3.head_object(Bucket=data["bucket"], Key=k)["ContentLength"] for k in keys]
    sampled = sizes[:: max(1, len(keys) // 8)][:8]
    plan = dataset.split_choice.plan
    assert plan is not None
    assert plan.profile.raw_bytes == pytest.approx(sum(sampled) / len(sampled))
    assert plan.profile.raw_bytes < 0.5 * 110_000  # the test's pictures are small


def test_auto_split_times_the_client_here(gateway, registered, data, monkeypatch):
    # On one machine only a request's CPU is timed here (the gateway's figures price the
    # blocks); across machines the blocks and decoding are timed on a dataset object,
    # replacing the exporting machine's figures from the manifest.
    shared = sdk.FeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/", model="r18", **_through(gateway, split="auto")
    )
    assert shared.split_choice.basis is not None
    assert shared.split_choice.basis.profile.client_request_ms > 0

    monkeypatch.setattr("hapi.sdk.planning._split.same_host", lambda endpoint: False)
    remote = sdk.FeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/", model="r18", **_through(gateway, split="auto")
    )
    basis = remote.split_choice.basis
    manifest = registered["r18"]
    assert basis is not None and not basis.profile.shared_compute
    assert len(basis.profile.client_ms) == manifest.freeze
    assert all(ms > 0 for ms in basis.profile.client_ms)
    assert basis.profile.client_ms != tuple(b.cpu_ms for b in manifest.blocks[: manifest.freeze])
    assert basis.profile.client_decode_ms != planner.DEFAULT_DECODE_MS
    assert "client figures from the manifest" not in remote.split_choice.reason


def test_auto_split_says_when_the_client_could_not_be_timed(gateway, registered, data, monkeypatch):
    monkeypatch.setattr("hapi.sdk.planning._split.same_host", lambda endpoint: False)
    dataset = sdk.FeatureDataset.from_prefix(
        f"s3://{data['bucket']}/broken/",
        model="r18",
        **_through(gateway, split="auto", bandwidth="100mbit"),
    )
    reason = dataset.split_choice.reason
    assert dataset.split_choice.policy == "planner"
    assert (
        f"client figures from the manifest: cannot time s3://{data['bucket']}/broken/bad.jpg"
        in reason
    )


def test_a_near_tie_is_timed_in_the_first_epochs_and_the_features_do_not_change(
    gateway, registered, data, monkeypatch
):
    # Every candidate within 1000% counts as a near tie here, so the real plan on this
    # gateway has a rival: the trial must run it for one epoch, come back to the pick for
    # one, then keep the faster, and the training loop must see the same features.
    monkeypatch.setattr("hapi.planner._plan.NEAR_TIE", 10.0)
    dataset = sdk.IterableFeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/",
        model="enl0",
        **_through(gateway, split="auto", bandwidth="100mbit"),
    )
    choice = dataset.split_choice
    assert choice.trial is not None, choice.reason
    pick, rival = choice.split, choice.trial.rival.split
    assert pick != rival and "too close for the profile to call" in choice.reason

    epochs = [_all(dataset) for _ in range(4)]

    assert [(stats.mode, stats.split) for stats in dataset.history] == [
        _ran(split) for split in (pick, rival, pick, dataset.split)
    ]
    assert dataset.split in (pick, rival)
    assert dataset.split_choice.policy == "trial"
    assert dataset.split_choice.reason.startswith("trial over after epoch 2: Kept split")
    for features, labels in epochs[1:]:
        _close(features, epochs[0][0])
        assert labels == epochs[0][1]
    # The map-style form has no epochs of its own to time a tie in: the pick stands.
    indexed = sdk.FeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/",
        model="enl0",
        **_through(gateway, split="auto", bandwidth="100mbit"),
    )
    assert indexed.split_choice.trial is None
    assert "too close for the profile to call" not in indexed.split_choice.reason


# -- the client-side feature cache ------------------------------------------------------


def test_local_cache_makes_the_second_epoch_cross_no_network(gateway, registered, data, tmp_path):
    dataset = sdk.IterableFeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/",
        model="enl0",
        **_through(gateway, split=19, dtype="float16", local_cache=tmp_path / "features"),
    )
    first, labels = _all(dataset)
    cold = dataset.stats
    assert cold.mode == "pushdown" and cold.bytes_received > 0 and cold.local_samples == 0
    assert cold.requests > 0
    second, again = _all(dataset)
    warm = dataset.stats
    assert warm.bytes_received == 0 and warm.requests == 0
    assert warm.local_hit_ratio == 1.0 and "100% from the local cache" in str(warm)
    assert first.tobytes() == second.tobytes() and labels == again
    plain = sdk.IterableFeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/",
        model="enl0",
        **_through(gateway, split=19, dtype="float16"),
    )
    assert _all(plain)[0].tobytes() == first.tobytes()


def test_an_unreadable_local_cache_entry_is_fetched_again(gateway, registered, data, tmp_path):
    cache = tmp_path / "features"
    options = _through(gateway, split=None, local_cache=cache)
    dataset = sdk.IterableFeatureDataset.from_prefix(
        f"s3://{data['bucket']}/train/", model="enl0", **options
    )
    first, labels = _all(dataset)
    entries = sorted(cache.rglob("*.safetensors"))
    assert len(entries) == len(labels)
    entries[0].write_bytes(entries[0].read_bytes()[:20])  # a torn write from elsewhere
    second, again = _all(dataset)
    stats = dataset.stats
    assert stats.samples - stats.local_samples == 1 and stats.bytes_received > 0
    assert second.tobytes() == first.tobytes() and again == labels
    _all(dataset)  # the entry was written again
    assert dataset.stats.local_samples == dataset.stats.samples


def test_local_cache_misses_an_overwritten_object(gateway, registered, data, backend_s3, tmp_path):
    bucket, cache = data["bucket"], tmp_path / "features"
    options = _through(gateway, split=19, dtype="float16", local_cache=cache)
    key = next(
        k
        for k in sdk.FeatureDataset.from_prefix(
            f"s3://{bucket}/train/", model="enl0", **options
        ).keys
    )
    warm = sdk.FeatureDataset.from_prefix(f"s3://{bucket}/train/", model="enl0", **options)
    _all(warm)
    original = backend_s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    try:
        backend_s3.put_object(Bucket=bucket, Key=key, Body=original + b"\0")  # a new ETag
        relisted = sdk.FeatureDataset.from_prefix(f"s3://{bucket}/train/", model="enl0", **options)
        relisted.reset_stats()
        _all(relisted)
        stats = relisted.stats
        assert stats.samples - stats.local_samples == 1  # only the overwritten object
    finally:
        backend_s3.put_object(Bucket=bucket, Key=key, Body=original)
