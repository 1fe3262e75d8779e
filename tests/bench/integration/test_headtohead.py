"""The head-to-head's loaders, for real: s3torchconnector (from the store and through the
gateway) and hapi's FeatureDataset deliver the same samples in the same order per seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hapi import models
from hapi_bench.headtohead._loaders import (
    Endpoint,
    FrozenBlocks,
    LoaderSettings,
    credentials_file,
    flat,
    hapi_loader,
    s3torch_loader,
)
from hapi_bench.headtohead._same import Trace, check, compare
from hapi_bench.testbed._data import generate

SAMPLES = 24


def test_s3torchconnector_and_hapi_deliver_the_same_samples_in_the_same_order(
    store: Any,
    backend_s3: Any,
    gateway: Any,
    registered: dict[str, Any],
    unique_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for sample in generate(SAMPLES, models.sample_images(), seed=1):
        backend_s3.put_object(Bucket=unique_bucket, Key=sample.key, Body=sample.data)
    keys = tuple(
        sorted(o["Key"] for o in backend_s3.list_objects_v2(Bucket=unique_bucket)["Contents"])
    )
    manifest = registered["r18"]
    settings = LoaderSettings(
        bucket=unique_bucket, keys=keys, batch_size=4, workers=2, prefetch_factor=2, seed=5
    )
    profiles = {
        "store": (store.credentials.access_key_id, store.credentials.secret_access_key),
        "gateway": (gateway.access_key_id, gateway.secret_access_key),
    }
    monkeypatch.setenv(
        "AWS_SHARED_CREDENTIALS_FILE", str(credentials_file(tmp_path / "credentials", profiles))
    )
    blocks = FrozenBlocks(models.Registry(backend_s3), manifest)
    options = {
        "aws_access_key_id": gateway.access_key_id,
        "aws_secret_access_key": gateway.secret_access_key,
        "region_name": "us-east-1",
    }
    loaders = {
        "s3torch": s3torch_loader(
            "s3torch", Endpoint(url=store.endpoint_url, profile="store"), settings, manifest, blocks
        ),
        "s3torch-gateway": s3torch_loader(
            "s3torch-gateway",
            Endpoint(url=gateway.endpoint_url, profile="gateway"),
            settings,
            manifest,
            blocks,
        ),
        "hapi": hapi_loader("hapi", gateway.endpoint_url, options, settings, manifest, None),
    }
    traces: dict[str, dict[int, Trace]] = {name: {} for name in loaders}
    try:
        for epoch in (1, 2):
            for name, loader in loaders.items():
                loader.set_epoch(epoch)
                trace = traces[name][epoch] = Trace()
                for features, labels in loader:
                    trace.add(flat(features).numpy(), labels.numpy())
    finally:
        for loader in loaders.values():
            loader.close()

    assert len(traces["s3torch"][1].labels) == SAMPLES
    assert check(traces, "s3torch") is None
    # The epochs are shuffled differently, and the check sees it.
    assert compare(traces["s3torch"][1], traces["hapi"][2]) is not None
