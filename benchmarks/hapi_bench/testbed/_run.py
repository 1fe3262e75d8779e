"""One benchmark run, from an empty machine to results, and back to an empty machine.

Order: check the machine; create the link and start the storage tier on its core; upload
the dataset and register the models (link unshaped, so setup traffic does not count);
pin this process (the client tier) to its core; then per model, profile the client and
sweep every regime. The ``finally`` clauses stop the tier and delete the namespace on
success, failure and interruption alike.
"""

from __future__ import annotations

import dataclasses
import io
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hapi import sdk
from hapi.models import Manifest, Registry
from hapi_bench.core._host import cpu_model
from hapi_bench.reports._results import CellResult
from hapi_bench.testbed._client import BUCKET, ClientSettings, ModelClient
from hapi_bench.testbed._competitor import storage_competitor
from hapi_bench.testbed._config import REGIMES, BenchConfig
from hapi_bench.testbed._data import Sample, generate, upload
from hapi_bench.testbed._netns import SHAPING, Link
from hapi_bench.testbed._preflight import check_environment
from hapi_bench.testbed._sweep import Progress, measure_profile, sweep_cell
from hapi_bench.testbed._tier import StorageTier

DESCRIPTION = (
    "Storage tier (SeaweedFS + hapi gateway) in a network namespace pinned to one CPU core; "
    "client tier in the root namespace pinned to the other, training a linear head with SGD "
    "on the features; onnxruntime with one thread on each. The veth pair between them is "
    f"shaped with {SHAPING} (both directions). Each run is one epoch after warm-up. "
    "'compute/network' is the client's measured rate of decoding and running the frozen "
    "blocks over the rate at which the link delivers raw objects. Splits whose link time "
    "alone exceeds 1.5x the best epoch measured in the cell are recorded as that lower "
    "bound, not run (they can be neither the best nor within 5% of it)."
)


def pin_process(cpu: int, niceness: int = 0) -> None:
    """Pin every thread of this process (and so every later one) to ``cpu``, at
    ``niceness`` (Linux keeps both per thread; new threads inherit them)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
            if niceness:
                os.setpriority(os.PRIO_PROCESS, int(tid), niceness)
        except OSError:  # a thread that just ended
            continue


@contextmanager
def testbed(config: BenchConfig, storage_cpu: int) -> Iterator[tuple[Link, StorageTier]]:
    """The link and the storage tier, torn down however the block ends."""
    workdir = Path(tempfile.mkdtemp(prefix="hapi-bench-"))
    link = Link()
    try:
        link.create()
        log = config.out / "logs" / "storage-tier.log"
        tier = StorageTier(
            link,
            storage_cpu,
            workdir,
            log,
            config.storage_batch,
            config.niceness,
            uncached=config.epochs > 0,
            device=config.storage_device,
        )
        with tier:
            yield link, tier
    finally:
        link.destroy()
        shutil.rmtree(workdir, ignore_errors=True)


def _competition(
    config: BenchConfig, storage_cpu: int, phases: dict[str, float]
) -> AbstractContextManager[object]:
    """The storage competitor when the config asks for one; nothing otherwise."""
    if not config.storage_competitor:
        return nullcontext()
    return storage_competitor(storage_cpu, config.niceness, phases)


def _store_client(tier: StorageTier) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=tier.spec.store_url,
        region_name="us-east-1",
        aws_access_key_id=tier.spec.store_key,
        aws_secret_access_key=tier.spec.store_secret,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=16),
    )


def run_bench(config: BenchConfig, progress: Progress) -> tuple[list[CellResult], dict[str, Any]]:
    """Run the benchmark; returns the cells and the run's metadata.

    Raises:
        TestbedUnavailable: Not root, tools missing, one core, or no namespace possible.
        BenchError: A tier failed or a run came up short.
    """
    client_cpu, storage_cpu = check_environment()
    # torch before anything there is to tear down: a Ctrl-C while torch's C++ start-up
    # runs aborts the process (SIGABRT, seen once in the interrupt test) instead of
    # raising KeyboardInterrupt, and the namespaces would be left behind.
    import torch  # noqa: F401

    started = time.monotonic()
    phases: dict[str, float] = {"load_average_before": os.getloadavg()[0]}
    with testbed(config, storage_cpu) as (link, tier), _competition(config, storage_cpu, phases):
        phases["testbed_s"] = time.monotonic() - started
        cells = _run(config, link, tier, client_cpu, progress, phases)
        gateway = tier.gateway_stats()
    phases["total_s"] = time.monotonic() - started
    phases["load_average_after"] = os.getloadavg()[0]
    meta = _meta(config, client_cpu, storage_cpu, phases)
    meta["gateway_stats"] = gateway
    return cells, meta


def _run(
    config: BenchConfig,
    link: Link,
    tier: StorageTier,
    client_cpu: int,
    progress: Progress,
    phases: dict[str, float],
) -> list[CellResult]:
    mark = time.monotonic()
    samples, registry, manifests = _setup(config, tier, progress)
    phases["setup_s"] = time.monotonic() - mark
    pin_process(client_cpu, config.niceness)
    import torch

    torch.set_num_threads(1)
    cells = []
    for family, manifest in manifests.items():
        mark = time.monotonic()
        cells += _model_cells(config, link, tier, registry, manifest, samples, progress)
        phases[f"{family}_s"] = time.monotonic() - mark
    return cells


def _setup(
    config: BenchConfig, tier: StorageTier, progress: Progress
) -> tuple[list[Sample], Registry, dict[str, Manifest]]:
    """Upload the dataset, export and register the models (the link is unshaped)."""
    from hapi import models

    s3 = _store_client(tier)
    samples = generate(config.max_samples, models.sample_images(), seed=config.seed)
    sent = upload(s3, BUCKET, samples)
    progress.log(
        f"dataset: {len(samples)} JPEGs and their tar shards, {sent / 1e6:.1f} MB uploaded"
    )
    registry = models.Registry(s3)
    manifests = {}
    for family in config.models:
        exported = models.export_model(
            family, runtime=models.RuntimeSettings(device="cpu", intra_op_threads=1)
        )
        manifests[family] = registry.register(family, exported)
        progress.log(f"{family}: exported and registered ({manifests[family].ref})")
    return samples, registry, manifests


def _model_cells(
    config: BenchConfig,
    link: Link,
    tier: StorageTier,
    registry: Registry,
    manifest: Manifest,
    samples: list[Sample],
    progress: Progress,
) -> list[CellResult]:
    """Profile the client for one model, then sweep every regime."""
    from PIL import Image

    photos = [Image.open(io.BytesIO(s.data)).convert("RGB") for s in samples[:16]]
    sizes = [len(s.data) for s in samples]
    measured = measure_profile(registry, manifest, photos, sizes, config)
    progress.log(
        f"{manifest.name}: client {measured.client_rate:.1f} samples/s (decode + "
        f"{manifest.freeze} frozen blocks, one core); epoch of {measured.samples} samples, "
        f"batch {measured.batch_size}"
    )
    settings = ClientSettings(
        endpoint=tier.spec.gateway_url,
        access_key_id=tier.spec.client_key,
        secret_access_key=tier.spec.client_secret,
        keys=tuple(s.key for s in samples[: measured.samples]),
        batch_size=measured.batch_size,
    )
    client = ModelClient(settings, manifest, link, tier)
    try:
        with link.unshaped():  # CPU time of a GET: the link's rate does not enter it
            request_ms = sdk.measure_request_ms(client.s3(), BUCKET, settings.keys[0])
        profile = dataclasses.replace(measured.profile, client_request_ms=request_ms)
        measured = dataclasses.replace(measured, profile=profile)
        progress.log(f"{manifest.name}: a GET costs the client {request_ms:.1f} ms of CPU")
        gateway = tier.spec.gateway_url
        return [
            sweep_cell(client, gateway, measured, regime, config, progress)
            for regime in config.regimes
        ]
    finally:
        client.close()
        link.unshape()


def _meta(
    config: BenchConfig, client_cpu: int, storage_cpu: int, phases: dict[str, float]
) -> dict[str, Any]:
    config_dict = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}
    return {
        "description": DESCRIPTION,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "client_cpu": client_cpu,
            "storage_cpu": storage_cpu,
            "niceness": config.niceness,
            "storage_competitor": config.storage_competitor,
            "storage_device": config.storage_device,
        },
        "client": "hapi.sdk.IterableFeatureDataset (prefetch 4) + linear head",
        "regimes": {name: REGIMES[name] for name in config.regimes},
        "config": config_dict,
        "phases": phases,
    }
