"""``IterableFeatureDataset``: epochs of features, dealt to DDP ranks and DataLoader
workers, prefetched in the background, and resumable at the exact next sample.

Each epoch is one order of sample ids (``_order``): the objects, or the shards' samples, in
a seeded permutation of (seed, epoch), padded or cut so every rank gets as many; each
consumer (a rank, or each of its workers) delivers a contiguous span of it, shards' samples
through a seeded shuffle buffer. The dataset's ``state_dict`` is where its pass stands (a
few integers, ``_position``): torchdata's ``StatefulDataLoader`` keeps one per worker,
matched to the batches the training loop took, and ``load_state_dict`` continues from it,
in the same layout or dealt afresh to another number of ranks and workers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Self, Unpack

import torch
from torch.utils.data import IterableDataset, get_worker_info

from hapi.models import RuntimeSettings
from hapi.protocol import DEFAULT_REGISTRY_BUCKET

from ..client._client import AugmentSpec
from ..client._errors import StateMismatch
from ..planning._split import replanned, resumed_at, with_trial
from ..planning._stats import EpochStats, Meter
from ._base import DEFAULT_PREFETCH, FeatureSource
from ._build import LabelsArg, Options, Prepared, SplitArg
from ._compute import Batch
from ._constructors import DatasetOptions
from ._epoch import PassPlan, Request, plan_pass
from ._order import Layout, epoch_order
from ._position import (
    SPLIT_IN_USE,
    Identity,
    Position,
    combine,
    find_states,
    listing_digest,
    split_in_use,
)
from ._prefetch import Pipeline

Sample = tuple[torch.Tensor, int] | tuple[torch.Tensor, int, dict[str, Any]]
logger = logging.getLogger("hapi.sdk")
DEFAULT_SHUFFLE_BUFFER = 1000


class IterableFeatureDataset(FeatureSource, IterableDataset[Sample]):
    """Iterable dataset of ``(features, label)``, with background prefetch, equal work per
    rank, and a position that ``StatefulDataLoader`` saves and restores.

    An epoch's order depends on ``seed`` and the epoch alone, never on the number of ranks
    or workers. Its samples are dealt to DDP ranks (``rank`` and ``world_size`` default to
    ``torch.distributed``'s when it is initialized), then to DataLoader workers, so each
    sample is read once per epoch across all processes, and every rank yields as many
    samples (and batches): the ranks' shares are evened out by padding with repeated
    samples (``drop_last=False``, as ``DistributedSampler`` does) or by leaving out fewer
    than ``world_size`` samples (``drop_last=True``). ``set_epoch(e)`` picks the epoch.

    Args:
        prepared: Use the ``from_*`` constructors.
        request_size: Objects per request.
        prefetch: Requests fetched ahead of the one computing; fetching overlaps the
            client's decoding and blocks (memory stays bounded by ``2 * prefetch + 1``
            requests, raw or computed).
        shuffle: Shuffle each epoch: the objects (or shards) in a new order, and the
            samples of shards through a shuffle buffer.
        seed: Shuffle seed; call :meth:`set_epoch` each epoch for a new order.
        rank: This process's DDP rank.
        world_size: The number of DDP ranks.
        progress: Show a tqdm bar per epoch (in the main process only).
        drop_last: Even out the ranks by leaving samples out rather than repeating some.
        shuffle_buffer: Samples of shards held to shuffle them (with ``shuffle``).
        batch_size: The DataLoader's batch size, if you like: each worker then gets whole
            batches, and a rank yields one partial batch at most (else one per worker).
        with_info: Items are ``(features, label, info)``: ``info["key"]`` names the
            sample (``key``, or ``key#i`` for a shard's ``i``-th), ``info["padded"]`` is
            true for a repeat that evens out the ranks.
        augment: A random view of each sample in place of the preset's centre crop (an
            ``AugmentPolicy``, its spec or its mapping form); each epoch draws fresh views
            from ``seed``, the epoch and the sample alone, so a resumed or re-dealt epoch
            sees the views the uninterrupted run would have. Leave it out for evaluation.
        views: Views the gateway's cache keeps per object (epoch ``e`` reads view
            ``e % views``); 0: a fresh view every epoch, never cached.
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
        drop_last: bool = False,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        batch_size: int | None = None,
        with_info: bool = False,
        augment: AugmentSpec = None,
        views: int = 0,
    ) -> None:
        if (rank is None) != (world_size is None):
            raise ValueError("pass rank and world_size together")
        if world_size is not None and not (world_size >= 1 and 0 <= (rank or 0) < world_size):
            raise ValueError(f"need 0 <= rank < world_size, not rank={rank}, {world_size=}")
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, not {shuffle_buffer}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        super().__init__(
            prepared,
            request_size=request_size,
            prefetch=prefetch,
            augment=augment,
            views=views,
            seed=seed,
        )
        self._choice = with_trial(self._choice, epochs=True)
        self._shuffle = shuffle
        self._seed = seed
        self._epoch = 0
        self._ranks = None if rank is None or world_size is None else (rank, world_size)
        self._progress = progress
        self._drop_last = drop_last
        self._shuffle_buffer = shuffle_buffer
        self._batch_size = batch_size
        self._with_info = with_info
        source = prepared.source
        self._counts = source.counts or (1,) * len(source.keys)
        self._identity = self._identify()
        self._resume: Position | None = None
        self._pass: tuple[int, PassPlan] | None = None
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
        encoding: str = "zeros",
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

        Every image member becomes a sample, with its ``.cls`` member as label
        (``labels="cls"``, the default here). Building the dataset counts each shard's
        samples from its tar headers (ranged reads, no member bodies), so samples rather
        than whole shards are dealt to ranks and workers. The options are
        :meth:`from_prefix`'s (``request_size`` counts shards, default 1).
        """
        options = Options.of_call(locals())
        return cls._from(uri, options, dataset, shards=True)

    @classmethod
    def _create(cls, prepared: Prepared, request_size: int, dataset: DatasetOptions) -> Self:
        return cls(prepared, request_size=request_size, **dataset)

    # -- epochs and positions ----------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next pass runs (:meth:`set_epoch`, or a loaded state's)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch (it seeds the shuffle), like ``DistributedSampler.set_epoch``. A
        loaded position of another epoch is dropped: that epoch starts afresh."""
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None
        running = self._running()
        if running is not None and running.position.epoch != epoch:
            self._pass = None  # the state is the new epoch's start, not the last pass's end
        self._epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """Where this process's pass stands: the epoch, the layout and the samples it
        delivered (never a list of samples). ``StatefulDataLoader`` calls it in each
        worker; save the loader's ``state_dict()``, which holds them all."""
        return {**self._position_state(), SPLIT_IN_USE: self._choice.split}

    def _position_state(self) -> dict[str, Any]:
        running = self._running()
        if running is not None:
            return running.state()
        layout, _, worker = self._consumer()
        try:
            position, start = self._continuation(layout, worker)
        except StateMismatch:
            assert self._resume is not None
            return self._resume.state(worker)
        return dataclasses.replace(position, emitted={worker: start}).state(worker)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved position: the next pass delivers the samples of the saved
        epoch not yet delivered, each once.

        ``state`` is a ``StatefulDataLoader``'s ``state_dict()`` (one rank's: DDP ranks
        step together) or one of this dataset's own. Loaded into the loader, its workers
        continue where they stopped, in the same layout. Loaded into the dataset (before
        the loader iterates), it continues with any number of ranks and workers: what
        the saved pass left is dealt afresh. With ``split="auto"`` it continues at the
        split the job was using (see ``split_choice``), and epochs re-plan from there.

        Raises:
            StateMismatch: The state belongs to another dataset (other objects, model,
                split policy, shuffle or seed: the message says which), or the objects
                listed changed since it was saved.
        """
        states = find_states(state)
        position = combine(states, self._identity)
        recorded, split = split_in_use(states, self.freeze)
        if recorded and self._identity.split == "auto":
            self._take(resumed_at(self._choice, split))
        current = self._resume
        if current is not None and current.same_pass(position):
            position = dataclasses.replace(
                position, emitted={**current.emitted, **position.emitted}
            )
        self._resume = position
        self._epoch = position.epoch
        self._pass = None

    def _identify(self) -> Identity:
        source, choice = self._source, self._choice
        listed = source.sizes is not None
        where = f"s3://{source.bucket}/{source.prefix}"
        shards = self._counts if source.shards else None
        return Identity(
            objects=where if listed else f"{len(source.keys)} objects in s3://{source.bucket}",
            listing=listing_digest(source.keys, shards),
            samples=sum(self._counts),
            model=self.model,
            freeze=self.freeze,
            split="auto" if choice.policy != "given" else choice.split,
            shuffle=self._shuffle,
            seed=self._seed,
            augment="" if self.augment is None else f"{self.augment.spec()}; views={self._views}",
        )

    def _running(self) -> PassPlan | None:
        if self._pass is None or self._pass[0] != os.getpid():
            return None  # a pass of the process this copy was forked from
        return self._pass[1]

    def _consumer(self) -> tuple[Layout, int, int]:
        """This process's layout, rank and worker index."""
        rank, world = self._rank()
        worker = get_worker_info()
        index, workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
        buffer = self._shuffle_buffer if self._shuffle and self._source.shards else 0
        layout = Layout(world, workers, self._batch_size, self._drop_last, buffer)
        return layout, rank, index

    def _continuation(self, layout: Layout, worker: int) -> tuple[Position, int]:
        """The pass ``worker`` runs in ``layout``, and the samples delivered in it already."""
        if self._resume is None:
            return Position(self._identity, self._epoch, (), layout), 0
        return self._resume.continued(layout, worker)

    # -- iterating ---------------------------------------------------------------------

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

    def __len__(self) -> int:
        """Samples this rank yields in a whole epoch (padding included)."""
        layout, _, _ = self._consumer()
        return layout.dealt(sum(self._counts)) // layout.ranks

    def __iter__(self) -> Iterator[Sample]:
        layout, rank, worker = self._consumer()
        position, start = self._continuation(layout, worker)
        order = epoch_order(
            self._counts, shuffle=self._shuffle, seed=self._seed, epoch=position.epoch
        )
        plan = plan_pass(
            position=position,
            start=start,
            rank=rank,
            worker=worker,
            seed=self._seed,
            epoch_order=order,
        )
        self._pass = (os.getpid(), plan)
        main = get_worker_info() is None
        meter = Meter(
            len(self.history),
            total=plan.remaining,
            progress=self._progress and main,
            resumed=plan.resumed,
        )
        requests = plan.requests(self._source.keys, self._counts, self._request_size)
        starter = self._starter(position.epoch)  # the epoch's views, resumed or not
        pipeline = Pipeline([r.keys for r in requests], starter, depth=self._prefetch)
        complete = False
        try:
            yield from self._deliver(plan, requests, pipeline, meter)
            complete = True
        finally:
            pipeline.close()
            meter.wait_seconds = pipeline.wait_s
            self.history.append(meter.finish())
        if complete:
            self._resume = None
            if main:
                self._replan(self.history[-1])

    def _deliver(
        self, plan: PassPlan, requests: list[Request], pipeline: Pipeline[Any, Batch], meter: Meter
    ) -> Iterator[Sample]:
        """Deliver in emission order, taking requests in span order as samples are due."""
        held: dict[int, Sample] = {}
        pending = iter(requests)
        for position in plan.emission[plan.emitted :].tolist():
            while position not in held:
                request = next(pending)
                batch = next(pipeline)
                meter.wait_seconds = pipeline.wait_s
                held.update(self._received(plan, request, batch, meter))
                meter.held_peak = max(meter.held_peak, len(held))
            item = held.pop(position)
            plan.emitted += 1  # counted as handed over: a state taken now includes it
            yield item

    def _received(
        self, plan: PassPlan, request: Request, batch: Batch, meter: Meter
    ) -> dict[int, Sample]:
        """The items ``batch`` gives for the positions ``request`` fills."""
        rows = list(request.rows(batch, self._source.bucket))
        self._record(meter, batch, samples=len(rows))
        features = torch.from_numpy(batch.features)
        alone = plan.position.layout.buffer > 0  # held rows must not keep whole batches
        found: dict[int, Sample] = {}
        for position, row, member in rows:
            key = batch.objects[row]
            label = self._labels.label(key, batch.carried[row])
            value = features[row].clone() if alone else features[row]
            if not self._with_info:
                found[position] = (value, label)
                continue
            name = f"{key}#{member}" if self._source.shards else key
            found[position] = (value, label, {"key": name, "padded": bool(plan.padded[position])})
        return found

    def _replan(self, stats: EpochStats) -> None:
        """Take the planner's new split when the epoch's measurements call for one, and
        remember the bandwidth the epoch measured; only here, in the process that owns
        the dataset (workers' copies are rebuilt). From the first full epoch on, epochs
        re-plan: the link estimate of the job's first responses has done its part."""
        if self._spans is not None:
            self._seen_readers(self._spans.readers())
        self._spans = None
        bits = stats.bandwidth_bps if stats.mode == "pushdown" else None
        if bits and self._choice.measured_bandwidth and self._memory is not None:
            self._remember(bits)
        choice = replanned(self._choice, self._spec.manifest, stats, readers=self._readers)
        if choice is not None:
            self._take(choice)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["history"] = []
        state["_pass"] = None
        # A spawned worker starts without torch.distributed: it takes this rank's place.
        state["_ranks"] = self._rank()
        return state
