"""The client tier: one measured epoch of one configuration.

Each pushdown configuration is an :class:`hapi.sdk.IterableFeatureDataset` over the same
objects (``split=k`` asks the gateway for blocks ``[0, k)`` and runs ``[k, freeze)``
here); its background prefetcher keeps requests in flight while the loop trains a linear
head on the features, as a transfer-learning loop would. The baseline is
:class:`~._baseline.RawLoader` (plain GETs, everything computed here); the SDK's own
no-pushdown path (``split=None``) is measured too. A dataset is built and warmed (its
sessions loaded, on both tiers) once with the link unshaped, then reused at every
bandwidth, so model blocks never cross the shaped link.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.config import Config

from hapi.models import Manifest, Registry, RuntimeSettings, create_session
from hapi_bench.core._errors import BenchError
from hapi_bench.reports._results import RunResult
from hapi_bench.testbed._baseline import FETCH_THREADS, RawLoader
from hapi_bench.testbed._netns import Link
from hapi_bench.testbed._tier import StorageTier, steal_seconds

BUCKET = "bench-data"
PREFETCH = 4
RUNTIME = RuntimeSettings(device="cpu", intra_op_threads=1, inter_op_threads=1)


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """How the client tier reaches the gateway and what it reads.

    Args:
        endpoint: The gateway's URL across the link.
        access_key_id: Client credentials the gateway accepts.
        secret_access_key: Their secret.
        keys: Object keys of the epoch, in order.
        batch_size: Training batch and request size.
    """

    endpoint: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    keys: tuple[str, ...]
    batch_size: int

    def options(self) -> dict[str, Any]:
        """``boto3.client`` arguments."""
        return {
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "region_name": "us-east-1",
        }


@dataclass(frozen=True)
class Snapshot:
    """Counters at one instant."""

    wall: float
    rx_bytes: int
    client_cpu: float
    storage_cpu: float
    client_steal: float = 0.0
    storage_steal: float = 0.0
    queue: tuple[int, int] | None = None  # the link queue's frames sent and dropped

    @classmethod
    def take(cls, link: Link, tier: StorageTier) -> Snapshot:
        queue = link.queue_stats()  # a tc call: ahead of the clock, so a start's is not timed
        return cls(
            time.perf_counter(),
            link.rx_bytes(),
            time.process_time(),
            tier.cpu_seconds(),
            steal_seconds(os.sched_getaffinity(0)),  # the client's core, once pinned
            tier.steal_seconds(),
            queue,
        )


class Head:
    """A linear classifier trained with SGD on the features: the trainable part
    (``lr``: its learning rate; the cache scenario's sweep gives each job its own)."""

    def __init__(self, classes: int = 4, lr: float = 1e-3) -> None:
        self._classes = classes
        self._lr = lr
        self._layer: Any = None
        self._optimizer: Any = None

    def step(self, rows: Sequence[Any], labels: Sequence[int]) -> float:
        """One SGD step on a batch; returns the loss."""
        import torch

        inputs = torch.stack(list(rows)).flatten(1)
        if self._layer is None:
            self._layer = torch.nn.Linear(inputs.shape[1], self._classes)
            self._optimizer = torch.optim.SGD(self._layer.parameters(), lr=self._lr)
        targets = torch.tensor([max(0, label) for label in labels])
        loss = torch.nn.functional.cross_entropy(self._layer(inputs), targets)
        self._optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self._optimizer.step()
        return float(loss.item())


class ModelClient:
    """The client tier for one model: SDK datasets and the baseline loader, built lazily
    and reused at every bandwidth.

    Args:
        settings: Endpoint, credentials, keys, batch size.
        manifest: The registered model.
        link: The link (lifted while warming up).
        tier: The storage tier (its CPU time is counted).
    """

    def __init__(
        self, settings: ClientSettings, manifest: Manifest, link: Link, tier: StorageTier
    ) -> None:
        self.settings = settings
        self.manifest = manifest
        self.model = manifest.name
        self.link = link
        self.tier = tier
        self._datasets: dict[int | None, Any] = {}
        self._s3: Any = None
        self._raw: RawLoader | None = None

    def s3(self) -> Any:
        """The boto3 client for the gateway across the link (built on first use)."""
        if self._s3 is None:
            from hapi import sdk

            config = Config(max_pool_connections=2 * FETCH_THREADS)
            self._s3 = sdk.client(self.settings.endpoint, config=config, **self.settings.options())
        return self._s3

    def _build(self, split: int | None) -> Any:
        from hapi import sdk

        return sdk.IterableFeatureDataset.from_objects(
            [f"s3://{BUCKET}/{key}" for key in self.settings.keys],
            model=self.model,
            split=split,
            labels="folder",
            endpoint_url=self.settings.endpoint,
            client_options=self.settings.options(),
            runtime=RUNTIME,
            request_size=self.settings.batch_size,
            prefetch=PREFETCH,
        )

    def _build_raw(self) -> RawLoader:
        registry = Registry(self.s3())
        graph = registry.load_blocks(self.manifest, 0, self.manifest.freeze)
        return RawLoader(
            self.s3(),
            BUCKET,
            self.settings.keys,
            self.manifest,
            create_session(graph, RUNTIME),
            batch_size=self.settings.batch_size,
            depth=PREFETCH * self.settings.batch_size,
        )

    def warm(self, split: int | None, loader: str = "sdk") -> None:
        """With the link lifted: build the configuration the first time (sessions loaded
        on both tiers by reading a batch); later, make sure the gateway holds the split's
        session (it keeps a bounded number)."""
        with self.link.unshaped():
            if loader == "raw":
                if self._raw is None:
                    self._raw = self._build_raw()
                    with _closing(iter(self._raw)) as batches:
                        next(batches)
            elif split not in self._datasets:
                dataset = self._build(split)
                with _closing(iter(dataset)) as items:
                    next(items)
                self._datasets[split] = dataset
            elif split:
                reply = self.s3().get_features_batch(
                    BUCKET, list(self.settings.keys[:1]), model=self.model, split=split
                )
                reply.raise_for_errors()

    def epoch(
        self, split: int | None, progress: Callable[[int], None], loader: str = "sdk"
    ) -> RunResult:
        """Warm up, then one measured epoch at the current shaping: the SDK dataset of
        ``split``, or (``loader="raw"``) the baseline loader.

        Raises:
            BenchError: The epoch delivered fewer samples than there are objects.
        """
        self.warm(split, loader)
        head = Head()
        before = Snapshot.take(self.link, self.tier)
        if loader == "raw":
            assert self._raw is not None
            for features, labels in self._raw:
                head.step(torch_rows(features), labels)
                progress(len(labels))
            stats: Any = self._raw.stats
        else:
            dataset = self._datasets[split]
            self._train(dataset, head, progress)
            stats = dataset.stats
        after = Snapshot.take(self.link, self.tier)
        return self._result(split, loader, stats, before, after)

    def _train(self, dataset: Any, head: Head, progress: Callable[[int], None]) -> None:
        rows: list[Any] = []
        labels: list[int] = []
        for features, label in dataset:
            rows.append(features)
            labels.append(label)
            if len(rows) == self.settings.batch_size:
                head.step(rows, labels)
                progress(len(rows))
                rows, labels = [], []
        if rows:
            head.step(rows, labels)
            progress(len(rows))

    def _result(
        self, split: int | None, loader: str, stats: Any, before: Snapshot, after: Snapshot
    ) -> RunResult:
        if stats is None or stats.samples != len(self.settings.keys):
            got = 0 if stats is None else stats.samples
            raise BenchError(f"{self.model} {split=}: {got} of {len(self.settings.keys)} samples")
        return run_result(
            split,
            stats,
            before,
            after,
            self.link.rate_bps,
            loader=loader,
            batch_size=self.settings.batch_size,
        )

    def close(self) -> None:
        """Drop the datasets, the loader and their sessions."""
        self._datasets.clear()
        self._raw = None
        self._s3 = None


def torch_rows(features: Any) -> list[Any]:
    """A batch array as a list of torch rows (what the SDK yields)."""
    import torch

    return list(torch.from_numpy(features))


@contextlib.contextmanager
def _closing(items: Iterator[Any]) -> Iterator[Iterator[Any]]:
    """Close a generator on exit: stops a prefetcher after a partial read."""
    try:
        yield items
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def run_result(
    split: int | None,
    stats: Any,
    before: Snapshot,
    after: Snapshot,
    rate_bps: float | None,
    *,
    loader: str = "sdk",
    batch_size: int | None = None,
) -> RunResult:
    """One epoch's figures from the dataset's stats and the snapshots around it
    (``batch_size``: its requests' size, which counts the batches of the pipeline's
    bound)."""
    link_bytes = after.rx_bytes - before.rx_bytes
    epoch_s = after.wall - before.wall
    return RunResult(
        split=split,
        loader=loader,
        epoch_s=epoch_s,
        attempts_s=(epoch_s,),
        samples=stats.samples,
        link_bytes=link_bytes,
        payload_bytes=stats.bytes_received,
        stall_s=stats.wait_seconds,
        client_cpu_s=after.client_cpu - before.client_cpu,
        storage_cpu_s=after.storage_cpu - before.storage_cpu,
        link_s=link_bytes * 8 / rate_bps if rate_bps else 0.0,
        client_steal_s=after.client_steal - before.client_steal,
        storage_steal_s=after.storage_steal - before.storage_steal,
        batches=-(-stats.samples // batch_size) if batch_size else None,
        link_frames=_delta(before.queue, after.queue, 0),
        link_dropped=_delta(before.queue, after.queue, 1),
    )


def _delta(before: tuple[int, int] | None, after: tuple[int, int] | None, index: int) -> int | None:
    return None if before is None or after is None else after[index] - before[index]
