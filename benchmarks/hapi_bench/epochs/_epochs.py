"""The cache scenario (``hapi bench --epochs N``): several epochs per cell, cold and warm.

The storage tier runs a second gateway with its feature cache off (same store, same
core), so the cache's cost on a cold epoch is measured against the same split without
it. Per cell (one model at one regime's bandwidth): shape the link; take the planner's
split (the first of ``--splits`` if given); build and warm every configuration's dataset
with the link lifted, then empty both caches; measure ``N`` baseline epochs, then
alternately an epoch without the cache and a cold epoch with it (``--repeats`` pairs, at
least 2, the order swapped every other pair; the first cold epoch goes on with ``N - 1``
warm ones), then ``N`` epochs with the client-side cache.
Each series starts from empty caches (every entry in the cache bucket deleted, the
``local_cache`` directory emptied), and each epoch with a cache ends once the gateway
has written its entries (``hapi_cache_writes_pending`` back to 0 on ``/metrics``).
Last, the sweep: ``J`` jobs one after another per configuration, each training its own
head for ``N`` epochs.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from botocore.exceptions import ClientError

from hapi.models import Manifest, Registry
from hapi.protocol import CACHE_PREFIXES, DEFAULT_CACHE_BUCKET, listed_entries
from hapi_bench.core._errors import BenchError
from hapi_bench.epochs._epochs_results import (
    BASELINE,
    CLIENT,
    GATEWAY,
    UNCACHED,
    CacheCell,
    EpochRun,
    SweepResult,
)
from hapi_bench.reports._results import RunResult
from hapi_bench.testbed._client import (
    BUCKET,
    PREFETCH,
    RUNTIME,
    ClientSettings,
    Head,
    ModelClient,
    Snapshot,
    _closing,
    run_result,
)
from hapi_bench.testbed._config import REGIMES, BenchConfig, bandwidth_for
from hapi_bench.testbed._netns import SHAPING, Link
from hapi_bench.testbed._preflight import check_environment
from hapi_bench.testbed._run import _meta, _setup, _store_client, pin_process, testbed
from hapi_bench.testbed._sweep import ModelProfile, Progress, measure_profile, plan_cell
from hapi_bench.testbed._tier import StorageTier

DESCRIPTION = (
    "Storage tier (SeaweedFS + the hapi gateway with its feature cache, and a second "
    "gateway without it) in a network namespace pinned to one CPU core; client tier in the "
    "root namespace pinned to the other, training a linear head with SGD on the features; "
    f"onnxruntime with one thread on each; the veth pair between them shaped with {SHAPING}. "
    "Per cell, several epochs of each configuration, the caches emptied before each cold "
    "epoch."
)
DRAIN_TIMEOUT_S = 120.0
SWEEP_CONFIGS = (UNCACHED, GATEWAY, CLIENT)
_DELETE_CHUNK = 1000


def pending_writes(metrics: str) -> float | None:
    """``hapi_cache_writes_pending`` from a Prometheus exposition (``None``: absent)."""
    for line in metrics.splitlines():
        if line.startswith("hapi_cache_writes_pending "):
            return float(line.split()[1])
    return None


class CacheClient:
    """The client tier of the cache scenario for one model: the baseline loader and one
    SDK dataset per configuration and split, built once and reused.

    Args:
        settings: The cached gateway, credentials, keys and batch size.
        manifest: The registered model.
        link: The link.
        tier: The storage tier (with its second, uncached gateway).
        local_dir: The client-side cache's directory.
    """

    def __init__(
        self,
        settings: ClientSettings,
        manifest: Manifest,
        link: Link,
        tier: StorageTier,
        local_dir: Path,
    ) -> None:
        self.settings, self.manifest, self.link, self.tier = settings, manifest, link, tier
        self.local_dir = local_dir
        self.baseline = ModelClient(settings, manifest, link, tier)
        self._store = _store_client(tier)
        self._datasets: dict[tuple[str, int], Any] = {}

    def _build(self, config: str, split: int) -> Any:
        from hapi import sdk

        endpoint = self.tier.spec.uncached_url if config == UNCACHED else self.settings.endpoint
        return sdk.IterableFeatureDataset.from_objects(
            [f"s3://{BUCKET}/{key}" for key in self.settings.keys],
            model=self.manifest.name,
            split=split,
            labels="folder",
            endpoint_url=endpoint,
            client_options=self.settings.options(),
            runtime=RUNTIME,
            request_size=self.settings.batch_size,
            prefetch=PREFETCH,
            local_cache=str(self.local_dir) if config == CLIENT else None,
        )

    def prepare(self, split: int) -> None:
        """With the link lifted: build each configuration's dataset (or read one batch of
        it again, so both gateways hold the split's session), then empty the caches."""
        with self.link.unshaped():
            for config in SWEEP_CONFIGS:
                dataset = self._datasets.get((config, split))
                if dataset is None:
                    dataset = self._datasets[(config, split)] = self._build(config, split)
                with _closing(iter(dataset)) as items:
                    next(items)
            self.baseline.warm(None, "raw")
        self.empty()

    def drain(self) -> float:
        """Wait until the gateway has written every queued entry; returns the seconds.

        Raises:
            BenchError: Writes still pending after ``DRAIN_TIMEOUT_S``.
        """
        started = time.perf_counter()
        url, auth = self.settings.endpoint + "/metrics", self.tier.spec.control_auth()
        while time.perf_counter() - started < DRAIN_TIMEOUT_S:
            with self.link.unshaped():
                pending = pending_writes(httpx.get(url, auth=auth, timeout=10).text)
            if not pending:
                return time.perf_counter() - started
            time.sleep(0.05)
        raise BenchError(f"the gateway's cache writes did not finish in {DRAIN_TIMEOUT_S:g} s")

    def empty(self) -> None:
        """Empty both caches: every entry of the cache bucket, the local directory."""
        self.drain()
        empty_cache_bucket(self._store)
        # Empty the directory, keep it: the dataset's local cache writes under it.
        for child in self.local_dir.iterdir():
            shutil.rmtree(child, ignore_errors=True)

    def baseline_epoch(self, epoch: int, progress: Progress) -> EpochRun:
        """One epoch of the raw-object baseline."""
        advance = progress.run(f"{self.manifest.name} {BASELINE} epoch {epoch}", len(self.keys))
        result = self.baseline.epoch(None, advance, "raw")
        progress.done(result)
        return EpochRun(
            config=BASELINE,
            epoch=epoch,
            epoch_s=result.epoch_s,
            samples=result.samples,
            link_bytes=result.link_bytes,
            storage_cpu_s=result.storage_cpu_s,
            client_cpu_s=result.client_cpu_s,
        )

    @property
    def keys(self) -> tuple[str, ...]:
        """The epoch's object keys."""
        return self.settings.keys

    def epoch(
        self,
        config: str,
        split: int,
        head: Head,
        advance: Callable[[int], None],
        *,
        epoch: int = 1,
        repeat: int = 1,
    ) -> tuple[EpochRun, RunResult]:
        """One SDK epoch of ``config`` training ``head``; with a cache, then the drain.

        Raises:
            BenchError: The epoch delivered fewer samples than there are objects.
        """
        dataset = self._datasets[(config, split)]
        before = Snapshot.take(self.link, self.tier)
        head_s = _train(dataset, head, self.settings.batch_size, advance)
        after = Snapshot.take(self.link, self.tier)
        stats = dataset.stats
        if stats is None or stats.samples != len(self.keys):
            got = 0 if stats is None else stats.samples
            raise BenchError(f"{self.manifest.name} {config}: {got} of {len(self.keys)} samples")
        result = run_result(
            split, stats, before, after, self.link.rate_bps, batch_size=self.settings.batch_size
        )
        drained = 0.0 if config == UNCACHED else self.drain()
        drain_cpu = Snapshot.take(self.link, self.tier).storage_cpu - after.storage_cpu
        run = EpochRun(
            config=config,
            epoch=epoch,
            repeat=repeat,
            epoch_s=result.epoch_s,
            samples=stats.samples,
            link_bytes=result.link_bytes,
            head_s=head_s,
            gateway_hit_ratio=stats.gateway_hit_ratio,
            local_hit_ratio=stats.local_hit_ratio,
            drain_s=drained,
            storage_cpu_s=result.storage_cpu_s,
            client_cpu_s=result.client_cpu_s,
            drain_cpu_s=drain_cpu if config != UNCACHED else 0.0,
        )
        return run, result

    def series(
        self, config: str, split: int, epochs: int, progress: Progress, repeat: int = 1
    ) -> list[EpochRun]:
        """``epochs`` epochs of one training run from empty caches (one head)."""
        self.empty()
        head, runs = Head(), []
        for epoch in range(1, epochs + 1):
            label = f"{self.manifest.name} {config} epoch {epoch}"
            advance = progress.run(label, len(self.keys))
            run, result = self.epoch(config, split, head, advance, epoch=epoch, repeat=repeat)
            progress.done(result)
            progress.log(
                f"    {config}, epoch {epoch}: head {run.head_s:.3f} s, gateway hits "
                f"{run.gateway_hit_ratio:.0%}, local hits {run.local_hit_ratio:.0%}, "
                f"drain {run.drain_s:.2f} s"
            )
            runs.append(run)
        return runs

    def sweep(self, split: int, jobs: int, epochs: int, progress: Progress) -> SweepResult:
        """``jobs`` training runs one after another per configuration, each with its own
        head (learning rate ``1e-3 * 2**job``), the caches emptied before the first; a
        job's time is its epochs' (the drains between them are not counted)."""
        job_s: dict[str, tuple[float, ...]] = {}
        for config in SWEEP_CONFIGS:
            self.empty()
            times = []
            for job in range(jobs):
                head, seconds = Head(lr=1e-3 * 2**job), 0.0
                for epoch in range(1, epochs + 1):
                    run, _ = self.epoch(config, split, head, lambda count: None, epoch=epoch)
                    seconds += run.epoch_s
                times.append(seconds)
                progress.log(f"  sweep, {config}: job {job + 1} of {jobs} in {times[-1]:.1f} s")
            job_s[config] = tuple(times)
        return SweepResult(jobs=jobs, epochs=epochs, job_s=job_s)

    def close(self) -> None:
        """Drop the datasets and the baseline loader."""
        self._datasets.clear()
        self.baseline.close()


def _train(dataset: Any, head: Head, batch_size: int, advance: Callable[[int], None]) -> float:
    """One pass training ``head``; returns the seconds its SGD steps took."""
    rows: list[Any] = []
    labels: list[int] = []
    head_s = 0.0

    def step() -> float:
        started = time.perf_counter()
        head.step(rows, labels)
        seconds = time.perf_counter() - started
        advance(len(rows))
        return seconds

    for features, label in dataset:
        rows.append(features)
        labels.append(label)
        if len(rows) == batch_size:
            head_s += step()
            rows, labels = [], []
    if rows:
        head_s += step()
    return head_s


def choose_split(config: BenchConfig, plan: Any) -> int:
    """The first of ``--splits``, else the planner's pick, else its best pushdown split."""
    if config.splits:
        return config.splits[0]
    if plan.split is not None:
        return int(plan.split)
    pushdown = [c for c in plan.candidates if c.split is not None and math.isfinite(c.epoch_s)]
    return int(min(pushdown, key=lambda c: c.epoch_s).split)


def cache_cell(
    client: CacheClient,
    measured: ModelProfile,
    regime: str,
    config: BenchConfig,
    progress: Progress,
) -> CacheCell:
    """The cache scenario of one model at one regime's bandwidth."""
    rate = bandwidth_for(REGIMES[regime], measured.client_rate, measured.raw_bytes)
    client.link.shape(rate)
    plan, _, _ = plan_cell(
        client.settings.endpoint, measured, rate, client.tier.spec.control_auth()
    )
    split = choose_split(config, plan)
    progress.log(f"{measured.manifest.name} {regime}: {rate / 1e6:.3g} Mbit/s, split {split}")
    client.prepare(split)
    epochs = config.epochs
    runs = [client.baseline_epoch(epoch, progress) for epoch in range(1, epochs + 1)]
    # The cold pairs: without the cache and cold with it, interleaved, the order swapped
    # every other pair so that drift on the host counts against both alike; the first
    # cold epoch goes on with the warm ones.
    for repeat in range(1, max(2, config.repeats) + 1):
        if repeat % 2 == 0:
            runs += client.series(GATEWAY, split, 1, progress, repeat)
        head = Head()
        advance = progress.run(f"{measured.manifest.name} {UNCACHED}", len(client.keys))
        uncached, result = client.epoch(UNCACHED, split, head, advance, repeat=repeat)
        progress.done(result)
        runs.append(uncached)
        if repeat % 2:
            runs += client.series(GATEWAY, split, epochs if repeat == 1 else 1, progress, repeat)
    runs += client.series(CLIENT, split, epochs, progress)
    sweep = None
    if config.sweep_jobs:
        sweep = client.sweep(split, config.sweep_jobs, epochs, progress)
    return CacheCell(
        model=measured.manifest.name,
        regime=regime,
        bandwidth_bps=rate,
        split=split,
        samples=measured.samples,
        batch_size=measured.batch_size,
        epochs=epochs,
        runs=tuple(runs),
        sweep=sweep,
    )


def run_epochs(config: BenchConfig, progress: Progress) -> tuple[list[CacheCell], dict[str, Any]]:
    """Run the cache scenario; returns the cells and the run's metadata.

    Raises:
        TestbedUnavailable: Not root, tools missing, one core, or no namespace possible.
        BenchError: A tier failed or a run came up short.
    """
    client_cpu, storage_cpu = check_environment()
    started = time.monotonic()
    phases: dict[str, float] = {"load_average_before": os.getloadavg()[0]}
    cells: list[CacheCell] = []
    with testbed(config, storage_cpu) as (link, tier), _local_dir() as local:
        samples, registry, manifests = _setup(config, tier, progress)
        phases["setup_s"] = time.monotonic() - started
        pin_process(client_cpu, config.niceness)
        import torch

        torch.set_num_threads(1)
        for family, manifest in manifests.items():
            mark = time.monotonic()
            cells += _model_cells(config, link, tier, registry, manifest, samples, local, progress)
            phases[f"{family}_s"] = time.monotonic() - mark
    phases["total_s"] = time.monotonic() - started
    phases["load_average_after"] = os.getloadavg()[0]
    meta = _meta(config, client_cpu, storage_cpu, phases)
    meta["description"] = DESCRIPTION
    return cells, meta


@contextlib.contextmanager
def _local_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hapi-bench-local-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _model_cells(
    config: BenchConfig,
    link: Link,
    tier: StorageTier,
    registry: Registry,
    manifest: Manifest,
    samples: list[Any],
    local: Path,
    progress: Progress,
) -> list[CacheCell]:
    import io

    from PIL import Image

    photos = [Image.open(io.BytesIO(s.data)).convert("RGB") for s in samples[:16]]
    measured = measure_profile(registry, manifest, photos, [len(s.data) for s in samples], config)
    progress.log(
        f"{manifest.name}: client {measured.client_rate:.1f} samples/s; epoch of "
        f"{measured.samples} samples, batch {measured.batch_size}"
    )
    settings = ClientSettings(
        endpoint=tier.spec.gateway_url,
        access_key_id=tier.spec.client_key,
        secret_access_key=tier.spec.client_secret,
        keys=tuple(s.key for s in samples[: measured.samples]),
        batch_size=measured.batch_size,
    )
    client = CacheClient(settings, manifest, link, tier, local)
    try:
        return [cache_cell(client, measured, regime, config, progress) for regime in config.regimes]
    finally:
        client.close()
        link.unshape()


GATEWAY_MEMORY_S = 2.5
"""How long a gateway may serve its copy in memory of a pack deleted behind it (2 s,
docs/cache.md), with a margin."""


def empty_cache_bucket(store: Any) -> None:
    """Delete every pack (and entry of its own) of the feature cache bucket (``store``:
    boto3 at the store), then wait out :data:`GATEWAY_MEMORY_S`, so that a gateway's copy
    in memory of a pack it wrote is no longer served unseen: the next epoch is cold."""
    paginator = store.get_paginator("list_objects_v2")
    try:
        keys = [
            entry.key
            for prefix in CACHE_PREFIXES
            for page in paginator.paginate(Bucket=DEFAULT_CACHE_BUCKET, Prefix=prefix)
            for entry in listed_entries(page.get("Contents", []))
        ]
    except ClientError as exc:  # no bucket yet: nothing was cached
        if exc.response.get("Error", {}).get("Code") != "NoSuchBucket":
            raise
        keys = []
    for start in range(0, len(keys), _DELETE_CHUNK):
        chunk = [{"Key": key} for key in keys[start : start + _DELETE_CHUNK]]
        store.delete_objects(Bucket=DEFAULT_CACHE_BUCKET, Delete={"Objects": chunk, "Quiet": True})
    if keys:
        time.sleep(GATEWAY_MEMORY_S)
