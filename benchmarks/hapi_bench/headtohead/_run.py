"""One head-to-head run, from an empty machine to results, and back to an empty machine.

The testbed is ``hapi bench``'s (:func:`hapi_bench._run.testbed`): the storage tier (the
store, the gateway with its feature cache and a second gateway without it) in a network
namespace on one core, this process (the client tier) on the other, the veth between them
shaped with tc tbf. Per model: the contender's loaders are built once; per bandwidth and
load, hapi's loaders are built for the link (the planner picks the split for it), every
loader is warmed with the link lifted (workers started, sessions loaded), the feature
cache is emptied, and then the epochs run interleaved: epoch 1 of every configuration,
then epoch 2, each round starting with the next configuration. Each configuration trains
its own head through its epochs and is scored on held-out objects after them.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from hapi.models import Manifest, Registry
from hapi_bench.core._errors import BenchError
from hapi_bench.core._host import cpu_model
from hapi_bench.epochs._epochs import empty_cache_bucket, pending_writes
from hapi_bench.reports._results import RunResult
from hapi_bench.testbed._client import BUCKET
from hapi_bench.testbed._config import BenchConfig
from hapi_bench.testbed._data import Sample
from hapi_bench.testbed._netns import SHAPING, Link
from hapi_bench.testbed._preflight import check_environment
from hapi_bench.testbed._run import _setup, _store_client, pin_process, testbed
from hapi_bench.testbed._tier import StorageTier, cpu_seconds

from ._config import BANDWIDTHS, HeadToHeadConfig
from ._loaders import (
    CONFIGS,
    HAPI,
    HAPI_CACHE,
    REGION,
    S3TORCH,
    S3TORCH_GATEWAY,
    Endpoint,
    FrozenBlocks,
    Loader,
    LoaderSettings,
    credentials_file,
    descendants,
    flat,
    hapi_loader,
    held_out_features,
    s3torch_loader,
)
from ._results import LOADED, Cell, ConfigResult, Epoch
from ._same import Trace, check
from ._second_job import SecondJob, second_job

Log = Callable[[str], None]
STORE_PROFILE, GATEWAY_PROFILE = "hapi-h2h-store", "hapi-h2h-gateway"
BACKGROUND_S = 3.0
DRAIN_TIMEOUT_S = 120.0
DESCRIPTION = (
    "The same training job (the frozen layers of the model in onnxruntime, a linear head "
    "trained with SGD) fed four ways on hapi's two-tier testbed: AWS's s3torchconnector "
    "from the store and through hapi's gateway in pass-through (DataLoader workers decode "
    "with PIL and torchvision transforms equal to the model's preset; the frozen blocks run "
    "on the batch in the training process), hapi's FeatureDataset(split='auto') without the "
    "feature cache, and with it (epoch 1 cold). Storage tier on one core, client tier "
    "(training process and its DataLoader workers) on the other; the veth between them "
    f"shaped with {SHAPING}. Configurations interleaved epoch by epoch. Loaded cells: a "
    "second job reads the same objects through the gateway, every frozen block on the storage side."
)


class _Log:
    """The testbed's progress protocol, as plain lines."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def run(self, label: str, total: int) -> Callable[[int], None]:
        return lambda count: None

    def done(self, result: RunResult) -> None:
        return None


class LinearHead:
    """The trainable head: one linear layer, SGD, initialised from ``seed``."""

    def __init__(self, seed: int, classes: int = 4, lr: float = 0.1) -> None:
        self.seed, self.classes, self.lr = seed, classes, lr
        self.layer: Any = None
        self.optimizer: Any = None

    def step(self, rows: Any, labels: Any) -> None:
        """One SGD step on ``rows`` ``[B, D]``."""
        import torch

        if self.layer is None:
            with torch.random.fork_rng():
                torch.manual_seed(self.seed)
                self.layer = torch.nn.Linear(rows.shape[1], self.classes)
            self.optimizer = torch.optim.SGD(self.layer.parameters(), lr=self.lr)
        loss = torch.nn.functional.cross_entropy(self.layer(rows), torch.as_tensor(labels))
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()

    def accuracy(self, features: Any, labels: Any) -> float:
        """The share of ``labels`` the head gets right."""
        import torch

        with torch.no_grad():
            return float((self.layer(features).argmax(1) == labels).float().mean())


@dataclass(frozen=True)
class _Counters:
    wall: float
    rx_bytes: int
    client_cpu: float
    storage_cpu: float
    dropped: int = 0
    timeouts: int = 0


class CacheControl:
    """Empties the gateway's feature cache and waits for its writes."""

    def __init__(self, store: Any, tier: StorageTier, link: Link) -> None:
        self.store, self.tier, self.link = store, tier, link

    def metrics(self) -> str:
        """The gateway's ``/metrics``, read past the link's shaping."""
        url, auth = self.tier.spec.gateway_url + "/metrics", self.tier.spec.control_auth()
        with self.link.unshaped():
            return httpx.get(url, auth=auth, timeout=10).text

    def drain(self) -> None:
        """Wait until the gateway has written every queued entry.

        Raises:
            BenchError: Writes still pending after ``DRAIN_TIMEOUT_S``.
        """
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            if not pending_writes(self.metrics()):
                return
            time.sleep(0.05)
        raise BenchError(f"the gateway's cache writes did not finish in {DRAIN_TIMEOUT_S:g} s")

    def empty(self) -> None:
        """Delete every entry of the cache bucket (after the pending writes)."""
        self.drain()
        empty_cache_bucket(self.store)


class ModelRun:
    """The cells of one model."""

    def __init__(
        self,
        config: HeadToHeadConfig,
        link: Link,
        tier: StorageTier,
        manifest: Manifest,
        samples: list[Sample],
        client_cpu: int,
        log: Log,
    ) -> None:
        self.config, self.link, self.tier, self.manifest = config, link, tier, manifest
        self.client_cpu, self.log = client_cpu, log
        store = _store_client(tier)
        self.blocks = FrozenBlocks(Registry(store), manifest)
        train, held = samples[: config.samples], samples[config.samples :]
        keys = [s.key for s in held]
        self.held = held_out_features(store, BUCKET, keys, manifest, self.blocks)
        self.settings = LoaderSettings(
            bucket=BUCKET,
            keys=tuple(s.key for s in train),
            batch_size=config.batch_size,
            workers=config.workers,
            prefetch_factor=config.prefetch_factor,
            seed=config.seed,
            dtype=config.dtype,
            encoding=config.encoding,
        )
        spec = tier.spec
        self.contenders = {
            name: s3torch_loader(name, endpoint, self.settings, manifest, self.blocks)
            for name, endpoint in (
                (S3TORCH, Endpoint(url=spec.store_url, profile=STORE_PROFILE)),
                (S3TORCH_GATEWAY, Endpoint(url=spec.gateway_url, profile=GATEWAY_PROFILE)),
            )
        }
        self.cache = CacheControl(store, tier, link)
        self._job_pid: int | None = None

    def cells(self) -> list[Cell]:
        """Every bandwidth and load of the config, in that order."""
        try:
            return [
                self.cell(bandwidth, load)
                for bandwidth in self.config.bandwidths
                for load in self.config.loads
            ]
        finally:
            for loader in self.contenders.values():
                loader.close()
            self.link.unshape()

    def _second(self, load: str) -> AbstractContextManager[int | None]:
        if load != LOADED:
            return nullcontext()
        spec = self.tier.spec
        assert spec.uncached_url is not None
        job = SecondJob(
            endpoint=spec.uncached_url,
            access_key_id=spec.client_key,
            secret_access_key=spec.client_secret,
            bucket=BUCKET,
            keys=self.settings.keys,
            model=self.manifest.name,
            split=self.manifest.freeze,
        )
        return second_job(job, self.client_cpu)

    def cell(self, bandwidth: str, load: str) -> Cell:
        """One bandwidth, quiet or loaded: every configuration, epochs interleaved."""
        rate = BANDWIDTHS[bandwidth]
        self.log(f"{self.manifest.name} at {bandwidth}, {load}")
        with _fresh_bandwidth_memory(), self._second(load) as job_pid:
            self._job_pid = job_pid
            if rate is not None:
                self.link.shape(rate)
            loaders = dict(self.contenders)
            try:
                with self.link.unshaped():
                    loaders.update(self._hapi_loaders(rate))
                    for loader in loaders.values():
                        loader.warm(self.settings.batch_size, self.settings.workers)
                background = self._background() if job_pid else (0.0, 0.0)
                results, same = self._rounds(loaders)
            finally:
                for name in (HAPI, HAPI_CACHE):
                    if name in loaders:
                        loaders[name].close()
                self._job_pid = None
            self.link.unshape()
        return Cell(
            model=self.manifest.name,
            bandwidth=bandwidth,
            bandwidth_bps=rate,
            load=load,
            samples=len(self.settings.keys),
            batch_size=self.settings.batch_size,
            configs=results,
            same_samples=same,
            background=background,
        )

    def _hapi_loaders(self, rate: float | None) -> dict[str, Loader]:
        spec = self.tier.spec
        options = {
            "aws_access_key_id": spec.client_key,
            "aws_secret_access_key": spec.client_secret,
            "region_name": REGION,
        }
        cache_split: int | Literal["auto"] = "auto"
        if self.config.cache_split == "freeze":
            cache_split = self.manifest.freeze
        endpoints: dict[str, tuple[str | None, int | Literal["auto"]]] = {
            HAPI: (spec.uncached_url, "auto"),
            HAPI_CACHE: (spec.gateway_url, cache_split),
        }
        out = {}
        for name, (url, split) in endpoints.items():
            assert url is not None
            out[name] = hapi_loader(
                name, url, options, self.settings, self.manifest, rate, split=split
            )
            choice = out[name].dataset.split_choice
            self.log(f"  {name}: split {choice.split} ({choice.reason})")
        return out

    def _background(self) -> tuple[float, float]:
        """What the second job alone asks of the link (bits/s) and the storage core."""
        before = self._counters()
        time.sleep(BACKGROUND_S)
        after = self._counters()
        seconds = after.wall - before.wall
        return (
            (after.rx_bytes - before.rx_bytes) * 8 / seconds,
            (after.storage_cpu - before.storage_cpu) / seconds,
        )

    def _rounds(self, loaders: dict[str, Loader]) -> tuple[tuple[ConfigResult, ...], str | None]:
        heads = {name: LinearHead(self.config.seed) for name in CONFIGS}
        epochs: dict[str, list[Epoch]] = {name: [] for name in CONFIGS}
        traces: dict[str, dict[int, Trace]] = {name: {} for name in CONFIGS}
        self.cache.empty()
        for epoch in range(1, self.config.epochs + 1):
            shift = (epoch - 1) % len(CONFIGS)
            for name in CONFIGS[shift:] + CONFIGS[:shift]:
                trace = traces[name][epoch] = Trace()
                epochs[name].append(self._epoch(loaders[name], heads[name], epoch, trace))
                if name == HAPI_CACHE:
                    self.cache.drain()
                run = epochs[name][-1]
                self.log(
                    f"  {name:<16} epoch {epoch}: {run.epoch_s:6.2f} s, "
                    f"{run.link_bytes / run.samples / 1000:7.1f} KB/sample, "
                    f"{run.dropped_frames} frames dropped, "
                    f"{run.retransmission_timeouts} retransmission timeouts"
                )
        results = []
        for name in CONFIGS:
            dataset = loaders[name].dataset
            choice = getattr(dataset, "split_choice", None)
            results.append(
                ConfigResult(
                    config=name,
                    epochs=tuple(epochs[name]),
                    accuracy=heads[name].accuracy(*self.held),
                    split=None if choice is None else choice.split,
                    split_reason="" if choice is None else choice.reason,
                    plan=None if choice is None or choice.plan is None else choice.plan.to_dict(),
                )
            )
        return tuple(results), check(traces, S3TORCH)

    def _epoch(self, loader: Loader, head: LinearHead, epoch: int, trace: Trace) -> Epoch:
        loader.set_epoch(epoch)
        before = self._counters()
        samples = 0
        try:
            for features, labels in loader:
                rows = flat(features)
                head.step(rows, labels)
                trace.add(rows.detach().numpy(), labels.numpy())
                samples += len(labels)
        except Exception as exc:  # a loader's error, with what the gateway refused so far
            raise BenchError(
                f"{loader.name} failed in epoch {epoch} after {samples} samples: {exc}; "
                f"{self._refusals()}"
            ) from exc
        after = self._counters(wall_first=True)
        if samples != len(self.settings.keys):
            raise BenchError(f"{loader.name}: {samples} of {len(self.settings.keys)} samples")
        return Epoch(
            epoch=epoch,
            epoch_s=after.wall - before.wall,
            samples=samples,
            link_bytes=after.rx_bytes - before.rx_bytes,
            client_cpu_s=after.client_cpu - before.client_cpu,
            storage_cpu_s=after.storage_cpu - before.storage_cpu,
            dropped_frames=after.dropped - before.dropped,
            retransmission_timeouts=after.timeouts - before.timeouts,
        )

    def _refusals(self) -> str:
        """The gateway's 5xx answers and refusals since it started, from its metrics."""
        try:
            text = self.cache.metrics()
        except httpx.HTTPError as exc:
            return f"the gateway's metrics could not be read: {exc!r}"
        found = refusals(text)
        return "the gateway refused: " + ", ".join(found) if found else "the gateway refused none"

    def _client_cpu(self) -> float:
        """This process and its workers (not the storage tier, nor the second job)."""
        others = set(self.link.pids())
        if self._job_pid is not None:
            others |= {self._job_pid, *descendants(self._job_pid)}
        workers = [pid for pid in descendants() if pid not in others]
        return time.process_time() + cpu_seconds(workers)

    def _counters(self, wall_first: bool = False) -> _Counters:
        wall = time.perf_counter() if wall_first else 0.0
        client, storage = self._client_cpu(), self.tier.cpu_seconds()
        rx = self.link.rx_bytes()
        # tc and netstat, read before the clock starts or after it stops, as the rest
        dropped, timeouts = self.link.queue_stats()[1], self.link.retransmission_timeouts()
        return _Counters(wall or time.perf_counter(), rx, client, storage, dropped, timeouts)


_REFUSALS = (
    "hapi_identity_limited_total{",
    "hapi_pushdown_rate_limited_total{",
    "hapi_upstream_errors_total{",
)


def refusals(metrics: str) -> list[str]:
    """From a gateway's Prometheus exposition: each series of 5xx answers, identity and
    rate limits and upstream failures with a count above zero, as ``series=count``."""
    found = []
    for line in metrics.splitlines():
        series, _, value = line.rpartition(" ")
        if not series or line.startswith("#") or float(value) <= 0:
            continue
        answered = series.startswith("hapi_requests_total{") and 'status="5' in series
        if answered or series.startswith(_REFUSALS):
            found.append(f"{series}={float(value):g}")
    return found


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` in this process's environment for the block."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@contextmanager
def _fresh_bandwidth_memory() -> Iterator[None]:
    """An empty bandwidth memory for the block (``XDG_CACHE_HOME`` in a temporary folder):
    each cell is a first job on its link, which an earlier cell's figure, measured on
    another link through the same gateway URL, must not decide; nor may the run leave
    its figures in the user's own cache."""
    with (
        tempfile.TemporaryDirectory(prefix="hapi-h2h-cache-") as folder,
        _environ("XDG_CACHE_HOME", folder),
    ):
        yield


def _profiles(tier: StorageTier, directory: Path) -> AbstractContextManager[None]:
    """The CRT client's credentials: a shared credentials file with one profile for the
    store and one for the gateway, named in the environment for the block."""
    path = credentials_file(
        directory / "credentials",
        {
            STORE_PROFILE: (tier.spec.store_key, tier.spec.store_secret),
            GATEWAY_PROFILE: (tier.spec.client_key, tier.spec.client_secret),
        },
    )
    return _environ("AWS_SHARED_CREDENTIALS_FILE", str(path))


def run_headtohead(config: HeadToHeadConfig, log: Log) -> tuple[list[Cell], dict[str, Any]]:
    """Run the head-to-head; returns the cells and the run's metadata.

    Raises:
        TestbedUnavailable: Not root, tools missing, one core, or no namespace possible.
        BenchError: A tier failed or an epoch came up short.
    """
    client_cpu, storage_cpu = check_environment()
    import torch

    # Both tiers are pinned to one core each: the DataLoader's advice to use fewer
    # workers than the job's configuration says is expected here.
    warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)

    bench = BenchConfig(
        out=config.out,
        models=config.models,
        max_samples=config.samples + config.held_out,
        epochs=2,  # the storage tier then runs a second gateway, without the cache
        seed=config.seed,
        niceness=config.niceness,
    )
    started = time.monotonic()
    cells: list[Cell] = []
    with (
        testbed(bench, storage_cpu) as (link, tier),
        tempfile.TemporaryDirectory() as tmp,
        _profiles(tier, Path(tmp)),
    ):
        samples, _, manifests = _setup(bench, tier, _Log(log))
        pin_process(client_cpu, config.niceness)
        torch.set_num_threads(1)
        for manifest in manifests.values():
            run = ModelRun(config, link, tier, manifest, samples, client_cpu, log)
            cells += run.cells()
    meta = {
        "description": DESCRIPTION,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "client_cpu": client_cpu,
            "storage_cpu": storage_cpu,
        },
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "weights": {family: manifest.weights for family, manifest in manifests.items()},
        "total_s": time.monotonic() - started,
    }
    return cells, meta
