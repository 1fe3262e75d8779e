"""``FeatureDataset`` (map-style) and ``IterableFeatureDataset``: objects in, features out.

Both yield ``(features, label)``: ``features`` is what blocks ``[0, freeze)`` produce for
the sample, whatever the split, because the gateway runs ``[0, split)`` and this process
runs ``[split, freeze)`` from the same registry blocks.

Process safety follows s3torchconnector and mosaic streaming: the dataset holds only
picklable values; the boto3 client and onnxruntime sessions live in an engine created
lazily in each process (keyed by pid, so a forked DataLoader worker builds its own) and
dropped on pickling. The iterable form shards by DDP rank, then by DataLoader worker.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Self, Unpack

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from hapi.models import RuntimeSettings
from hapi.protocol import DEFAULT_REGISTRY_BUCKET

from ._build import LabelsArg, Options, Prepared, SplitArg
from ._compute import Batch, Engine
from ._constructors import Constructors, DatasetOptions
from ._prefetch import Fetch, Pipeline
from ._split import SplitChoice, replanned, with_trial
from ._stats import EpochStats, Meter

Item = tuple[torch.Tensor, int]
logger = logging.getLogger("hapi.sdk")
DEFAULT_PREFETCH = 4


class _FeatureSource(Constructors):
    """What both dataset forms share: construction, per-process engine, item conversion."""

    def __init__(self, prepared: Prepared, *, request_size: int = 32, prefetch: int = 4) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, not {prefetch}")
        self._source = prepared.source
        self._labels = prepared.labels
        self._spec = prepared.spec
        self._choice = prepared.choice
        self._request_size = request_size
        self._prefetch = prefetch
        self._runtime: tuple[int, Engine] | None = (os.getpid(), Engine(prepared.spec, prepared.s3))

    # -- per-process state --------------------------------------------------------------

    def _engine(self) -> Engine:
        pid = os.getpid()
        if self._runtime is None or self._runtime[0] != pid:
            self._runtime = (pid, Engine(self._spec))
        return self._runtime[1]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runtime"] = None  # clients and sessions never cross processes
        return state

    def _starter(self) -> Callable[[Sequence[str]], Fetch[Batch]]:
        return functools.partial(self._engine().start, self._source.bucket)

    def _chunks(self, keys: Sequence[str]) -> list[Sequence[str]]:
        size = self._request_size
        return [keys[i : i + size] for i in range(0, len(keys), size)]

    def _items(self, batch: Batch) -> list[Item]:
        rows = torch.from_numpy(batch.features)
        labels = self._labels
        pairs = zip(batch.objects, batch.carried, strict=True)
        return [(rows[i], labels.label(key, carried)) for i, (key, carried) in enumerate(pairs)]

    def _record(self, meter: Meter, batch: Batch) -> None:
        meter.record(
            samples=len(batch.objects),
            nbytes=batch.nbytes,
            split=self._spec.split if batch.mode == "pushdown" else None,
            mode=batch.mode,
            server_ms=batch.server_ms,
            round_trip=batch.round_trip,
            local_samples=batch.local_samples,
            gateway_cache=batch.gateway_cache,
        )

    # -- what users look at ---------------------------------------------------------------

    @property
    def bucket(self) -> str:
        """The bucket of the objects."""
        return self._source.bucket

    @property
    def keys(self) -> tuple[str, ...]:
        """The object keys, in dataset order."""
        return self._source.keys

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names by label (empty when labels are integers already)."""
        return self._labels.classes

    @property
    def model(self) -> str:
        """``NAME@VERSION`` of the model, pinned when the dataset was built."""
        return str(self._spec.manifest.ref)

    @property
    def freeze(self) -> int:
        """Features are the output of blocks ``[0, freeze)``."""
        return self._spec.freeze

    @property
    def split(self) -> int | None:
        """The split requested from the gateway (``None``: no pushdown)."""
        return self._choice.split

    @property
    def split_choice(self) -> SplitChoice:
        """The split, why it was chosen, and the planner's plan when it decided."""
        return self._choice

    @property
    def raw_bytes(self) -> int | None:
        """Total bytes of the objects, when they were listed (``from_prefix``)."""
        return self._source.raw_bytes

    @property
    def pushdown(self) -> bool:
        """Whether this process gets features from the gateway (``False`` after fallback)."""
        return self._engine().pushdown

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(s3://{self.bucket}/{self._source.prefix}, "
            f"{len(self.keys)} objects, model={self.model}, split={self.split}, "
            f"freeze={self.freeze})"
        )


class FeatureDataset(_FeatureSource, Dataset[Item]):
    """Map-style dataset of ``(features, label)``, one item per image object.

    Works with any sampler (``DistributedSampler`` for DDP) and ``num_workers``.
    ``DataLoader`` fetches a whole batch through :meth:`__getitems__`: one request per
    ``request_size`` objects, up to ``prefetch`` of them at once.

    Build it with :meth:`from_prefix` or :meth:`from_objects`; :meth:`from_shards`
    gives the iterable form, since a shard's samples are known only once it is read.
    """

    def __init__(self, prepared: Prepared, *, request_size: int = 32, prefetch: int = 4) -> None:
        if prepared.source.shards:
            raise TypeError("shards have no index; use IterableFeatureDataset.from_shards")
        super().__init__(prepared, request_size=request_size, prefetch=prefetch)
        self._choice = with_trial(self._choice, epochs=False)  # no epochs to time it in
        self._meter: Meter | None = None

    @staticmethod
    def from_shards(
        uri: str | Sequence[str],
        *,
        model: str,
        split: SplitArg = "auto",
        freeze: int | None = None,
        labels: LabelsArg = "cls",
        dtype: str = "float32",
        endpoint_url: str | Sequence[str] | None = None,
        client_options: Mapping[str, Any] | None = None,
        registry_bucket: str = DEFAULT_REGISTRY_BUCKET,
        runtime: RuntimeSettings | None = None,
        request_size: int = 1,
        bandwidth: float | str | None = None,
        local_cache: str | os.PathLike[str] | None = None,
        **dataset: Unpack[DatasetOptions],
    ) -> IterableFeatureDataset:
        """WebDataset shards: returns an :class:`IterableFeatureDataset` (see there)."""
        return IterableFeatureDataset.from_shards(
            uri,
            model=model,
            split=split,
            freeze=freeze,
            labels=labels,
            dtype=dtype,
            endpoint_url=endpoint_url,
            client_options=client_options,
            registry_bucket=registry_bucket,
            runtime=runtime,
            request_size=request_size,
            bandwidth=bandwidth,
            local_cache=local_cache,
            **dataset,
        )

    @classmethod
    def _create(cls, prepared: Prepared, request_size: int, dataset: DatasetOptions) -> Self:
        unknown = sorted(set(dataset) - {"prefetch"})
        if unknown:
            raise TypeError(
                f"FeatureDataset takes no {', '.join(unknown)} (the iterable form does)"
            )
        prefetch = dataset.get("prefetch", DEFAULT_PREFETCH)
        return cls(prepared, request_size=request_size, prefetch=prefetch)

    def __len__(self) -> int:
        return len(self._source.keys)

    def __getitem__(self, index: int) -> Item:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Item]:
        """Items for several indices, fetched in as few requests as ``request_size`` allows."""
        positions = range(len(self))
        keys = [self._source.keys[positions[i]] for i in indices]
        meter = self._current_meter()
        started = time.perf_counter()
        batches = self._fetch_all(self._chunks(keys))
        meter.wait_seconds += time.perf_counter() - started  # the caller waited all along
        items: list[Item] = []
        for batch in batches:
            self._record(meter, batch)
            items.extend(self._items(batch))
        return items

    def _fetch_all(self, chunks: list[Sequence[str]]) -> list[Batch]:
        if len(chunks) == 1:
            return [self._engine().fetch(self._source.bucket, chunks[0])]
        with Pipeline(chunks, self._starter(), depth=min(self._prefetch, len(chunks))) as running:
            return list(running)

    def _current_meter(self) -> Meter:
        if self._meter is None:
            self._meter = Meter(0, total=None, progress=False)
        return self._meter

    @property
    def stats(self) -> EpochStats:
        """Figures since the last :meth:`reset_stats`, in this process (a DataLoader
        worker keeps its own)."""
        return self._current_meter().finish()

    def reset_stats(self) -> None:
        """Start counting afresh, e.g. at the start of an epoch."""
        self._meter = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_meter"] = None
        return state


class IterableFeatureDataset(_FeatureSource, IterableDataset[Item]):
    """Iterable dataset of ``(features, label)``, with background prefetch.

    Objects are sharded by DDP rank, then by DataLoader worker (``rank`` and
    ``world_size`` default to ``torch.distributed``'s when it is initialized), so each
    sample is read exactly once per epoch across all processes; ranks may get counts
    that differ by one object. A background prefetcher keeps ``prefetch`` requests of
    ``request_size`` objects in flight ahead of the training loop.

    Args:
        prepared: Use the ``from_*`` constructors.
        request_size: Objects per request.
        prefetch: Requests fetched ahead of the one computing; fetching overlaps the
            client's decoding and blocks (memory stays bounded by ``2 * prefetch + 1``
            requests, raw or computed).
        shuffle: Shuffle the objects each epoch (the same order on every rank).
        seed: Shuffle seed; call :meth:`set_epoch` each epoch for a new order.
        rank: This process's DDP rank.
        world_size: The number of DDP ranks.
        progress: Show a tqdm bar per epoch (in the main process only).
    """

    def __init__(
        self,
        prepared: Prepared,
        *,
        request_size: int = 32,
        prefetch: int = DEFAULT_PREFETCH,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        progress: bool = False,
    ) -> None:
        if (rank is None) != (world_size is None):
            raise ValueError("pass rank and world_size together")
        if world_size is not None and not (world_size >= 1 and 0 <= (rank or 0) < world_size):
            raise ValueError(f"need 0 <= rank < world_size, not rank={rank}, {world_size=}")
        super().__init__(prepared, request_size=request_size, prefetch=prefetch)
        self._choice = with_trial(self._choice, epochs=True)
        self._shuffle = shuffle
        self._seed = seed
        self._epoch = 0
        self._ranks = None if rank is None or world_size is None else (rank, world_size)
        self._progress = progress
        self.history: list[EpochStats] = []

    @classmethod
    def from_shards(
        cls,
        uri: str | Sequence[str],
        *,
        model: str,
        split: SplitArg = "auto",
        freeze: int | None = None,
        labels: LabelsArg = "cls",
        dtype: str = "float32",
        endpoint_url: str | Sequence[str] | None = None,
        client_options: Mapping[str, Any] | None = None,
        registry_bucket: str = DEFAULT_REGISTRY_BUCKET,
        runtime: RuntimeSettings | None = None,
        request_size: int = 1,
        bandwidth: float | str | None = None,
        local_cache: str | os.PathLike[str] | None = None,
        **dataset: Unpack[DatasetOptions],
    ) -> Self:
        """WebDataset tar shards under a prefix (``s3://bucket/shards/``) or listed.

        Each shard is one unit of sharding; every image member becomes a sample, with its
        ``.cls`` member as label (``labels="cls"``, the default here). The options are
        :meth:`from_prefix`'s (``request_size`` counts shards, default 1).
        """
        options = Options(
            model=model,
            split=split,
            freeze=freeze,
            labels=labels,
            dtype=dtype,
            endpoint_url=endpoint_url,
            client_options=client_options,
            registry_bucket=registry_bucket,
            runtime=runtime,
            request_size=request_size,
            bandwidth=bandwidth,
            local_cache=local_cache,
        )
        return cls._from(uri, options, dataset, shards=True)

    @classmethod
    def _create(cls, prepared: Prepared, request_size: int, dataset: DatasetOptions) -> Self:
        return cls(prepared, request_size=request_size, **dataset)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch (it seeds the shuffle), like ``DistributedSampler.set_epoch``."""
        self._epoch = epoch

    @property
    def stats(self) -> EpochStats | None:
        """The last epoch's figures in this process (``None`` before the first)."""
        return self.history[-1] if self.history else None

    def _rank(self) -> tuple[int, int]:
        if self._ranks is not None:
            return self._ranks
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            return distributed.get_rank(), distributed.get_world_size()
        return 0, 1

    def _rank_keys(self) -> list[str]:
        keys = list(self._source.keys)
        if self._shuffle:
            random.Random(f"{self._seed}:{self._epoch}").shuffle(keys)
        rank, world = self._rank()
        return keys[rank::world]

    def _worker_keys(self) -> tuple[list[str], bool]:
        keys = self._rank_keys()
        worker = get_worker_info()
        if worker is None:
            return keys, True
        return keys[worker.id :: worker.num_workers], False

    def __len__(self) -> int:
        """Samples this rank yields per epoch (images only: a shard's count is unknown)."""
        if self._source.shards:
            raise TypeError("the number of samples in shards is known only once they are read")
        return len(self._rank_keys())

    def __iter__(self) -> Iterator[Item]:
        keys, main = self._worker_keys()
        total = None if self._source.shards else len(keys)
        meter = Meter(len(self.history), total=total, progress=self._progress and main)
        prefetcher = Pipeline(self._chunks(keys), self._starter(), depth=self._prefetch)
        complete = False
        try:
            for batch in prefetcher:
                meter.wait_seconds = prefetcher.wait_s
                self._record(meter, batch)
                yield from self._items(batch)
            complete = True
        finally:
            prefetcher.close()
            meter.wait_seconds = prefetcher.wait_s
            self.history.append(meter.finish())
        if complete and main:
            self._replan(self.history[-1])

    def _replan(self, stats: EpochStats) -> None:
        """Take the planner's new split when the epoch's measurements call for one; only
        here, in the process that owns the dataset (workers' copies are rebuilt)."""
        choice = replanned(self._choice, self._spec.manifest, stats)
        if choice is None:
            return
        logger.info("%s: %s", self.model, choice.reason)
        self._choice = choice
        self._spec = dataclasses.replace(self._spec, split=choice.split)
        engine = self._engine()
        engine.spec = self._spec
        engine.pushdown = choice.split is not None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["history"] = []
        return state
