"""The head-to-head's loaders, for real: s3torchconnector (from the store and through the
gateway) and hapi's FeatureDataset deliver the same samples in the same order per seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hapi import models
from hapi.sdk import GatewayAuth, fetch_gateway_profile
from hapi_bench.headtohead import _second_job
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
from tests.support import store_gateway

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


@pytest.mark.slow  # 35 s: `make test-slow`
def test_the_second_job_shows_a_planner_a_busy_storage_side(
    store: Any,
    backend_s3: Any,
    registered: dict[str, Any],
    unique_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The loaded cells' neighbour sends its next batch when its last is answered, so the
    # gateway's queue reads empty between its requests. A job planning beside it must
    # still see the storage side busy (the busy share of the last seconds): with queues
    # alone, the view showed an idle storage side and hapi pushed down into a full core.
    from botocore.credentials import Credentials as BotoCredentials

    for sample in generate(16, models.sample_images(), seed=2):
        backend_s3.put_object(Bucket=unique_bucket, Key=sample.key, Body=sample.data)
    keys = tuple(o["Key"] for o in backend_s3.list_objects_v2(Bucket=unique_bucket)["Contents"])
    manifest = registered["r18"]
    monkeypatch.setattr(_second_job, "SETTLE_S", 3.0)
    # As in the loaded cells, the neighbour's gateway has no feature cache: every batch
    # it sends is computed.
    with store_gateway(store, tmp_path, env={"HAPI_CACHE_ENABLED": "false"}) as uncached:
        job = _second_job.SecondJob(
            endpoint=uncached.endpoint_url,
            access_key_id=uncached.access_key_id,
            secret_access_key=uncached.secret_access_key,
            bucket=unique_bucket,
            keys=keys,
            model=manifest.name,
            split=manifest.freeze,
        )
        auth = GatewayAuth(BotoCredentials(uncached.access_key_id, uncached.secret_access_key))
        with _second_job.second_job(job, cpu=0):
            view = fetch_gateway_profile(uncached.endpoint_url, manifest.ref, auth=auth)
        # A quiet cell that follows plans with the job gone from the view: before the
        # block waited for the gateway's busy window, every quiet cell after a loaded one
        # priced the ended job's share (x1.5-1.8).
        after = fetch_gateway_profile(uncached.endpoint_url, manifest.ref, auth=auth)
    assert view.busy_tenants >= 1
    assert view.storage_load > 1.05
    assert "busy on the storage side" in view.origin()
    assert after.busy_tenants == 0 and after.storage_load == 1.0, after.origin()


@pytest.mark.slow  # 20 s: `make test-slow`
def test_a_second_job_that_cannot_start_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # A job whose gateway is not there never answers: the runner stops with the reason
    # rather than measure a loaded cell without its load.
    job = _second_job.SecondJob(
        endpoint="http://127.0.0.1:9",
        access_key_id="k",
        secret_access_key="s",
        bucket="b",
        keys=("a.jpg",),
        model="r18",
        split=1,
    )
    monkeypatch.setattr(_second_job, "START_TIMEOUT_S", 20.0)
    with (
        pytest.raises(RuntimeError, match="second job had no answer"),
        _second_job.second_job(job, cpu=0),
    ):
        pass
