"""What both dataset forms share: construction, the per-process engine, items.

Process safety follows s3torchconnector and mosaic streaming: the dataset holds only
picklable values; the boto3 client and onnxruntime sessions live in an engine created
lazily in each process (keyed by pid, so a forked DataLoader worker builds its own) and
dropped on pickling.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hapi.protocol import Augmentation, AugmentPolicy

from ..client._client import AugmentSpec, policy_of
from ..planning._link import EpochLog, LinkEstimate, Served, SpanLog, checkpoint_step, endpoint_key
from ..planning._split import SplitChoice, learned, with_readers
from ..planning._stats import Meter, storage_span, wire_spans
from ._build import Prepared
from ._compute import Batch, Engine
from ._constructors import Constructors
from ._prefetch import Fetch

Item = tuple[torch.Tensor, int]
DEFAULT_PREFETCH = 4
LIVE_CHECKPOINTS = 4
"""Stable estimates of the link planned with while a job runs (then epochs take over)."""
logger = logging.getLogger("hapi.sdk")


class FeatureSource(Constructors):
    """What both dataset forms share: construction, per-process engine, item conversion."""

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
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, not {prefetch}")
        self._policy = augment if isinstance(augment, AugmentPolicy | None) else policy_of(augment)
        if isinstance(views, bool) or not isinstance(views, int) or views < 0:
            raise ValueError(f"views must be an integer >= 0, not {views!r}")
        self._views = views
        self._view_seed = seed
        self._source = prepared.source
        self._labels = prepared.labels
        self._spec = prepared.spec
        self._choice = prepared.choice
        self._request_size = request_size
        self._prefetch = prefetch
        self._runtime: tuple[int, Engine] | None = (os.getpid(), Engine(prepared.spec, prepared.s3))
        self._memory = prepared.memory
        learns = prepared.choice.basis is not None and prepared.choice.measured_bandwidth
        # Every process reading for this dataset (DataLoader workers too) logs its
        # responses' wire spans in one place; each plans from all of them.
        self._spans: SpanLog | None = SpanLog() if learns else None
        self._replayed = 0  # spans of the log this process has planned with
        self._checkpoints = 0
        self._readers = 1  # processes that have read for this dataset, as the log last showed
        # What an epoch's responses measured, for an owner that runs none of them (the
        # map-style form sets it; the iterable form counts its own epochs).
        self._served: EpochLog | None = None

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

    def _starter(self, epoch: int = 0) -> Callable[[Sequence[str]], Fetch[Batch]]:
        return functools.partial(self._viewing(epoch).start, self._source.bucket)

    def _viewing(self, epoch: int) -> Engine:
        """This process's engine, asking for ``epoch``'s views (with ``augment=``)."""
        engine = self._engine()
        engine.augment = (
            None
            if self._policy is None
            else Augmentation(
                policy=self._policy,
                seed=self._view_seed,
                epoch=epoch,
                views=self._views,
                bucket=self._source.bucket,
            )
        )
        return engine

    @property
    def augment(self) -> AugmentPolicy | None:
        """The augmentation policy of the training views (``None``: the preset's centre
        crop, as evaluation sets keep)."""
        return self._policy

    def _chunks(self, keys: Sequence[str]) -> list[Sequence[str]]:
        size = self._request_size
        return [keys[i : i + size] for i in range(0, len(keys), size)]

    def _items(self, batch: Batch) -> list[Item]:
        rows = torch.from_numpy(batch.features)
        labels = self._labels
        pairs = zip(batch.objects, batch.carried, strict=True)
        return [(rows[i], labels.label(key, carried)) for i, (key, carried) in enumerate(pairs)]

    def _record(self, meter: Meter, batch: Batch, samples: int | None = None) -> None:
        """Count ``batch`` (``samples``: the rows of it this process delivers, when it
        delivers fewer than it received: another consumer's samples of a shard)."""
        rows = len(batch.objects)
        used = rows if samples is None else samples
        meter.record(
            samples=used,
            nbytes=batch.nbytes,
            split=batch.split if batch.mode == "pushdown" else None,
            mode=batch.mode,
            server_ms=batch.server_ms,
            round_trip=batch.round_trip,
            local_samples=batch.local_samples * used // rows if rows else 0,
            gateway_cache=batch.gateway_cache,
            wire=batch.wire,
        )
        self._observe(batch)

    # -- learning the link from the job's own responses -------------------------------------

    def _observe(self, batch: Batch) -> None:
        """Log a pushdown response's wire spans, and (the map-style form) what its epoch
        counts; once the span log (every process's responses) has reached this
        process's next checkpoint, plan with it."""
        log, served = self._spans, self._served
        if (log is None and served is None) or batch.mode != "pushdown":
            return
        if batch.round_trip is None or batch.split is None:
            return
        spans = wire_spans(batch.nbytes, batch.round_trip, batch.server_ms, batch.wire)
        if served is not None:
            storage = storage_span(batch.round_trip, batch.server_ms)
            for index, (carried, wire) in enumerate(spans):
                first = index == 0  # a batch sent in parts has a span per part
                served.add(
                    Served(
                        samples=len(batch.objects) if first else 0,
                        split=batch.split,
                        storage=storage if first else (0.0, 0.0),
                        wire=wire,
                        wire_bytes=carried,
                        pid=os.getpid(),
                    )
                )
        if log is None:
            return
        for carried, span in spans:
            log.add(carried, span)
        if len(log) >= self._replayed + checkpoint_step():
            self._learn("after {n} responses")

    def _learn(self, when: str) -> None:
        """Go through the span log as one process receiving every response would: at each
        stable checkpoint this process has not planned with, plan with the estimate
        (through the keeper's hysteresis) and remember it; after
        :data:`LIVE_CHECKPOINTS`, stop (epochs take over). ``when`` may name ``{n}``,
        the responses counted at the checkpoint."""
        log = self._spans
        if log is None:
            return
        spans = log.spans()
        self._seen_readers(log.readers())
        link = LinkEstimate()
        for nbytes, span in spans:
            link.add(nbytes, span)
            bits = link.checkpoint()
            if bits is None or link.responses <= self._replayed:
                continue
            text = when.format(n=link.responses)
            manifest = self._spec.manifest
            self._take(learned(self._choice, manifest, bits, text, readers=self._readers))
            self._remember(bits)
            self._checkpoints += 1
            if self._checkpoints >= LIVE_CHECKPOINTS:
                self._spans = None
                break
        self._replayed = max(self._replayed, link.responses)

    def _seen_readers(self, readers: int) -> None:
        """Count the processes a log showed reading for this dataset; a form whose readers
        take turns (:attr:`READERS_IN_TURN`) plans with as many from here on."""
        if readers < 1:
            return
        self._readers = max(self._readers, readers)
        if self.READERS_IN_TURN is not None:
            self._choice = with_readers(self._choice, self._readers)

    def _take(self, choice: SplitChoice) -> None:
        """Use ``choice`` from the next request on (requests already made keep theirs:
        every split gives the same features)."""
        changed = choice.split != self._choice.split
        self._choice = choice
        if not changed:
            return
        logger.info("%s: %s", self.model, choice.reason)
        self._spec = dataclasses.replace(self._spec, split=choice.split)
        engine = self._engine()
        engine.spec = self._spec
        engine.pushdown = choice.split is not None

    def _remember(self, bits_per_second: float) -> None:
        if self._memory is not None and self._spec.endpoints:
            self._memory.remember(endpoint_key(self._spec.endpoints), bits_per_second)

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
