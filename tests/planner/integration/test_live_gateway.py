"""``hapi plan --bandwidth auto`` against a real gateway that has served real traffic: it
probes, remembers the figure, and the next plan starts from it."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from click.testing import CliRunner

from hapi.models import Manifest, sample_images
from hapi.protocol import ModelProfile
from hapi.sdk._plan_cli import plan
from tests.support import RunningGateway, control_get, signed_headers, store_gateway

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gateway(
    store: Any, planned_model: tuple[str, Manifest], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    with store_gateway(
        store,
        tmp_path_factory.mktemp("plan-gateway"),
        extra_args=(
            *("--registry-bucket", planned_model[0], "--memory-budget", "1GiB"),
            *("--intra-op-threads", "1"),  # blocks on the calling thread: CPU-time figures
        ),
    ) as running:
        yield running


def _pushdown(gateway: RunningGateway, bucket: str, key: str, split: int) -> None:
    path = f"/{bucket}/{key}?hapi-model=r18&hapi-split={split}"
    headers = signed_headers(gateway, "GET", path)
    reply = httpx.get(gateway.endpoint_url + path, headers=headers, timeout=60)
    assert reply.status_code == 200, reply.text


def test_auto_probes_and_takes_the_gateways_view(
    gateway: RunningGateway,
    planned_model: tuple[str, Manifest],
    backend_s3: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket, manifest = planned_model
    for index, image in enumerate(sample_images()[:4]):  # four objects: four batches
        photo = io.BytesIO()
        image.save(photo, "JPEG", quality=90)
        backend_s3.put_object(Bucket=bucket, Key=f"photo{index}.jpg", Body=photo.getvalue())
        _pushdown(gateway, bucket, f"photo{index}.jpg", 3)
    served = ModelProfile.model_validate_json(control_get(gateway, "/_hapi/models/r18").content)
    storage = served.storage
    ran = storage.blocks[:3]  # blocks [0, 3) ran on real traffic, timed alone
    # The session's first three batches were profiled per node (not counted as serving
    # time): the fourth run's time is divided among its blocks as onnxruntime measured.
    assert [(b.block, b.source, b.device, b.split_by) for b in ran] == [
        (i, "measured", "cpu", "measured") for i in range(3)
    ]
    assert all(b.samples == 1 and b.ms > 0 and b.age_s is not None for b in ran)
    assert all(b.source == "manifest" for b in storage.blocks[3:])
    assert storage.decode is not None and storage.decode.source == "measured"
    assert storage.decode.samples == 4
    assert storage.load.source == "measured" and 0 < storage.load.available <= 1

    env = {
        "AWS_ENDPOINT_URL": gateway.endpoint_url,  # the manifest is read through the gateway
        "AWS_ENDPOINT_URL_S3": None,
        "AWS_ACCESS_KEY_ID": gateway.access_key_id,
        "AWS_SECRET_ACCESS_KEY": gateway.secret_access_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_PROFILE": None,
    }
    # boto3's default session keeps the credentials it first found (the store's, from
    # other tests in this process); a real `hapi plan` is a fresh process.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    arguments = ["--model", "r18", "--bandwidth", "auto", "--json", "--bucket", bucket]
    done = CliRunner().invoke(plan, arguments, env=env)
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert data["bandwidth_bps"] > 10e6 and data["bandwidth_source"] == "measured"  # loopback
    profile = data["profile"]
    factor = sum(b.ms for b in ran) / sum(block.cpu_ms for block in manifest.blocks[:3])
    expected = [b.ms for b in ran] + [block.cpu_ms * factor for block in manifest.blocks[3:4]]
    assert profile["storage_ms"] == pytest.approx(expected, rel=1e-3)
    assert profile["storage_decode_ms"] == pytest.approx(storage.decode.ms, rel=1e-3)
    assert profile["storage_origin"].startswith("Storage side: blocks 0-2 measured on cpu")
    assert profile["client_ms"] == [block.cpu_ms for block in manifest.blocks[:4]]
    assert 0 < profile["storage_memory_bytes"] <= 1024**3

    table = CliRunner().invoke(plan, arguments[:-3] + arguments[-2:], env=env)
    assert table.exit_code == 0, table.output
    assert "(remembered, measured 0 min ago)" in table.stdout and "chosen: split " in table.stdout
    assert "Storage side: blocks 0-2 measured on cpu" in table.stdout
