"""``FeatureDataset``, the map-style form: objects in, features out, one item per image.

Items are ``(features, label)``: ``features`` is what blocks ``[0, freeze)`` produce for
the sample, whatever the split, because the gateway runs ``[0, split)`` and this process
runs ``[split, freeze)`` from the same registry blocks. The iterable form, with epochs,
shuffling, sharding by rank and worker and resumable positions, is ``_iterable``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Self

from torch.utils.data import Dataset

from ..client._client import AugmentSpec
from ..planning._link import EpochLog
from ..planning._split import replanned, with_trial
from ..planning._stats import EpochStats, Meter, served_stats
from ._base import DEFAULT_PREFETCH, FeatureSource, Item
from ._build import Prepared
from ._compute import Batch
from ._constructors import DatasetOptions
from ._iterable import IterableFeatureDataset
from ._prefetch import Pipeline


class FeatureDataset(FeatureSource, Dataset[Item]):
    """Map-style dataset of ``(features, label)``, one item per image object.

    Works with any sampler (``DistributedSampler`` for DDP) and ``num_workers``.
    ``DataLoader`` fetches a whole batch through :meth:`__getitems__`: one request per
    ``request_size`` objects, up to ``prefetch`` of them at once.

    Build it with :meth:`from_prefix` or :meth:`from_objects`; :meth:`from_shards`
    gives the iterable form, since a shard's samples are known only once it is read.

    Each DataLoader worker asks for a batch, waits for it and computes on it before it
    asks for the next, so ``split="auto"`` plans for no more batches in flight than
    readers (:attr:`READERS_IN_TURN`, 2 until :meth:`set_epoch` has seen how many
    processes read: a DataLoader's workers, or this process alone).
    """

    READERS_IN_TURN = 2

    def __init__(
        self,
        prepared: Prepared,
        *,
        request_size: int = 32,
        prefetch: int = 4,
        augment: AugmentSpec = None,
        views: int = 0,
        seed: int = 0,
    ) -> None:
        if prepared.source.shards:
            raise TypeError("shards have no index; use IterableFeatureDataset.from_shards")
        super().__init__(
            prepared,
            request_size=request_size,
            prefetch=prefetch,
            augment=augment,
            views=views,
            seed=seed,
        )
        self._epoch = 0
        self._choice = with_trial(self._choice, epochs=False)  # no epochs to time it in
        self._meter: Meter | None = None
        # What the workers' pushdown responses measured since the last set_epoch: once
        # the live link estimate is done, each set_epoch re-plans with it.
        self._served = EpochLog() if self._choice.basis is not None else None
        self._epoch_started = time.perf_counter()

    # WebDataset shards have no index: the constructor is the iterable form's, which returns
    # an IterableFeatureDataset (the same typed signature, written once).
    from_shards = IterableFeatureDataset.from_shards

    @classmethod
    def _create(cls, prepared: Prepared, request_size: int, dataset: DatasetOptions) -> Self:
        unknown = sorted(set(dataset) - {"prefetch", "augment", "views", "seed"})
        if unknown:
            raise TypeError(
                f"FeatureDataset takes no {', '.join(unknown)} (the iterable form does)"
            )
        return cls(
            prepared,
            request_size=request_size,
            prefetch=dataset.get("prefetch", DEFAULT_PREFETCH),
            augment=dataset.get("augment"),
            views=dataset.get("views", 0),
            seed=dataset.get("seed", 0),
        )

    @property
    def epoch(self) -> int:
        """The epoch whose views (with ``augment=``) items are."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: with ``augment=``, each epoch's items are fresh views (view
        ``epoch % views`` with ``views=``), the same on every run with the same ``seed``.

        It is also where this process plans with the link its DataLoader workers measured
        (their responses are logged for it): a job that started without a known bandwidth
        takes the planner's split from the next epoch on, through the same hysteresis as
        a job measuring its own responses, and remembers the figure. Workers created for
        the next epoch start from that split; persistent workers plan from the same log
        themselves. Once that estimate is done, each ``set_epoch`` re-plans as the
        iterable form does after an epoch, with the bandwidth and the storage side's time
        the workers' responses measured since the last one (the split changes for a
        predicted gain of more than 10% two epochs in a row, blocks paid for): a move
        that the storage side's load made slower than planned is undone."""
        live = self._spans is not None
        self._learn(f"after {{n}} responses (the workers', before epoch {epoch})")
        now = time.perf_counter()
        if self._served is not None:
            served = self._served.take()
            split = self._choice.split
            if not live and served and split is not None:
                seconds = now - self._epoch_started
                stats = served_stats(self._epoch, served, split, seconds)
                self._seen_readers(len({s.pid for s in served}))
                if stats.samples:
                    self._replan(stats)
        self._epoch_started = now
        self._epoch = epoch

    def _replan(self, stats: EpochStats) -> None:
        choice = replanned(self._choice, self._spec.manifest, stats, readers=self._readers)
        if choice is not None:
            self._take(choice)

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
            return [self._viewing(self._epoch).fetch(self._source.bucket, chunks[0])]
        starter = self._starter(self._epoch)
        with Pipeline(chunks, starter, depth=min(self._prefetch, len(chunks))) as running:
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
