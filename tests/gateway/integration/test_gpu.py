"""The gateway on a GPU (onnxruntime's CUDA provider): what it serves and what it measures.

Skipped on machines without a usable CUDA GPU (CI has none); run where one is lent.
Features on the GPU equal torch's to the suite's usual tolerance through the other
pushdown tests, which run on the GPU there too (the gateway's device is ``auto``).
"""

from __future__ import annotations

import io
import statistics
import tarfile
import time
from typing import Any

import httpx
import numpy as np
import pytest

from hapi import models
from hapi.models import RuntimeSettings, create_session, cuda_usable
from hapi.protocol import ModelProfile
from tests.support import RunningGateway, control_get, signed_headers

pytestmark = pytest.mark.skipif(not cuda_usable(), reason="needs a CUDA GPU")

BATCH = 32


def _shard(count: int) -> bytes:
    photos = models.sample_images()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for index in range(count):
            jpeg = io.BytesIO()
            photos[index % len(photos)].convert("RGB").save(jpeg, "JPEG", quality=90)
            info = tarfile.TarInfo(f"s/{index:03d}.jpg")
            info.size = jpeg.tell()
            jpeg.seek(0)
            tar.addfile(info, jpeg)
    return buf.getvalue()


def _alone_shares(
    registry: models.Registry, manifest: models.Manifest, split: int, size: int
) -> list[float]:
    """Each block's share of blocks ``[0, split)`` on a batch of ``size``, every block
    timed alone on the GPU."""
    photos = models.sample_images()
    activation = models.preprocess_batch(
        [photos[i % len(photos)] for i in range(size)], manifest.preprocess
    )
    times = []
    for index in range(split):
        session = create_session(
            registry.load_blocks(manifest, index, index + 1), RuntimeSettings(device="cuda")
        )
        for _ in range(3):
            session.run(None, {"input": activation})
        runs = []
        for _ in range(10):
            started = time.perf_counter()
            out = session.run(None, {"input": activation})[0]
            runs.append(time.perf_counter() - started)
        times.append(statistics.median(runs))
        activation = out
    return [t / sum(times) for t in times]


def test_block_figures_on_the_gpu_divide_a_batch_as_the_blocks_take_it(
    gateway: RunningGateway, registered: dict[str, Any], backend_s3: Any, unique_bucket: str
) -> None:
    # onnxruntime's per-node profile times a CUDA kernel's launch, not its work: dividing
    # a batch's time by it put ResNet18's fourth and sixth blocks at a quarter each.
    manifest = registered["r18"]
    split = manifest.freeze
    backend_s3.put_object(Bucket=unique_bucket, Key="shard.tar", Body=_shard(BATCH))
    path = f"/{unique_bucket}/shard.tar?hapi-model=r18&hapi-split={split}"
    for _ in range(10):  # per batch size: the chain's warm-up and two timed, then served
        reply = httpx.get(
            gateway.endpoint_url + path, headers=signed_headers(gateway, "GET", path), timeout=60
        )
        assert reply.status_code == 200, reply.text
    served = ModelProfile.model_validate_json(control_get(gateway, "/_hapi/models/r18").content)
    ran = served.storage.blocks[:split]
    assert [(b.source, b.device, b.clock) for b in ran] == [("measured", "cuda", "wall")] * split
    learned: dict[int, list[float]] = {}
    counted: dict[int, int] = {}
    for figure in served.storage.batches:
        if figure.block < split and figure.split_by == "measured":
            learned.setdefault(figure.batch, [0.0] * split)[figure.block] = figure.ms
            counted[figure.batch] = figure.samples
    assert learned, [b.model_dump() for b in served.storage.batches]
    bucket = max(counted, key=lambda b: counted[b])  # the batch size served most
    shares = [ms / sum(learned[bucket]) for ms in learned[bucket]]
    alone = _alone_shares(models.Registry(backend_s3), manifest, split, bucket)
    gaps = [abs(s - a) for s, a in zip(shares, alone, strict=True)]
    assert max(gaps) < 0.1, (bucket, np.round(shares, 3).tolist(), np.round(alone, 3).tolist())


def test_the_memory_budget_is_the_devices(gateway: RunningGateway) -> None:
    budget = control_get(gateway, "/_hapi/stats").json()["memory_budget"]
    assert budget["source"] == "90% of free GPU memory at start-up"
    assert budget["total_bytes"] > 2 * 1024**3  # more than the CPU default of 2 GiB
