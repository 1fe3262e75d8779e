"""Turning object keys into features at the freeze point, one process at a time.

An :class:`Engine` belongs to one process (see ``_dataset``): it holds that process's
boto3 client and onnxruntime sessions. A batch of keys goes to the gateway as one
``?hapi-batch`` request for blocks ``[0, split)``, and the engine runs ``[split, freeze)``
here with the same registry blocks, so every split yields the same tensor. Against a
plain S3 store, or a gateway whose registry lacks the model, it reads the raw objects
instead, decodes them exactly as the gateway would (``hapi.models._decode``) and runs
``[0, freeze)`` here: the same outputs, after one :class:`FallbackWarning` per process.
Those two are the only reasons: a refusal (:class:`AccessDenied`) or a server error is
raised at the batch it belongs to, and the next batch asks the gateway again. A split of
``None`` (given, or the planner's choice) is no fallback: it warns of nothing.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from botocore.exceptions import BotoCoreError, ClientError

from hapi.models import (
    Manifest,
    ModelError,
    Registry,
    RuntimeSettings,
    Sample,
    UndecodableObject,
    create_session,
    decode_object,
)
from hapi.protocol import Augmentation

from ..client._client import client
from ..client._errors import (
    ModelUnavailable,
    NoSuchModel,
    PushdownUnavailable,
    RequestError,
    UnprocessableObject,
    request_error,
)
from ..client._parts import owners_of
from ..client._wire import WireSpan
from ._local_cache import LocalCache
from ._prefetch import Deferred, Fetch

GET_THREADS = 2
"""GETs in flight at once per engine when objects are read raw; requests queue for them
in order. Each DataLoader worker has its own engine, so a job has ``2 * workers``. With 4
the two workers' 8 flows overflowed a 10 Mbit/s link's 256 KiB queue (47-112 frames
dropped an epoch in the head to head, none for the contender's 2 flows) and raw reads ran
at 0.89-0.92x the contender; with 2, no frame was dropped and they ran at 1.04-1.05x."""

RUN_EVERY = GET_THREADS
"""The fewest samples of raw objects the blocks run on while the next object is still being
read: a request's blocks then run while its later objects are on the link (run once on the
whole request after its last read, they left a DataLoader worker's link idle meanwhile).
Objects that have arrived by the time the one before them is decoded wait for one run on
them all: ResNet18's blocks cost 0.6-1.3 ms a sample more on runs of 2 than on a request's
16 (a DataLoader of 2 workers reading raw objects on loopback, four interleaved runs)."""

_warned: set[tuple[tuple[str, ...], str]] = set()
_warned_lock = threading.Lock()


class FallbackWarning(UserWarning):
    """The endpoint cannot serve the model's features; objects are read and computed here."""


@dataclass(frozen=True, kw_only=True)
class Spec:
    """What every process needs to rebuild its engine (picklable, so workers get it).

    Args:
        endpoints: The resolved endpoints (empty: AWS), in the order given.
        client_options: Extra ``boto3.client`` keyword arguments.
        registry_bucket: Where the model's blocks are.
        manifest: The model version, pinned for the whole run.
        freeze: Blocks ``[0, freeze)`` produce the features.
        split: Blocks ``[0, split)`` run on the storage side; ``None``: no pushdown.
        dtype: Wire dtype of pushed-down features.
        encoding: Their answers' encoding (``zeros`` or ``dense``).
        runtime: onnxruntime settings for the blocks run here.
        local_cache: A directory keeping features at the freeze point on this machine.
        etags: The objects' ETags, when they were listed (they key the local cache).
    """

    endpoints: tuple[str, ...]
    client_options: Mapping[str, Any] = field(default_factory=dict)
    registry_bucket: str
    manifest: Manifest
    freeze: int
    split: int | None
    dtype: str = "float32"
    encoding: str = "zeros"
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    local_cache: str | None = None
    etags: Mapping[str, str] | None = None


@dataclass
class Batch:
    """Features at the freeze point for a run of objects.

    Args:
        features: ``float32`` ``[N, ...]``, writable.
        objects: The object key of each row (a shard gives several rows).
        carried: The label each sample carried (a shard's ``.cls``), or ``None``.
        nbytes: Bytes received for it.
        mode: ``pushdown`` or ``local``.
        server_ms: The gateway's ``Server-Timing`` durations.
        round_trip: ``time.perf_counter()`` at the request's start and end.
        local_samples: Rows served from the local cache (no request made for them).
        gateway_cache: The gateway's ``x-hapi-cache`` answer (``hit``, ``miss``,
            ``bypass``; empty without a request or pushdown).
        split: The split the gateway ran (``None``: no pushdown).
        wire: The response's arrival as the client timed it (``Features.wire``).
    """

    features: np.ndarray
    objects: list[str]
    carried: list[int | None]
    nbytes: int
    mode: str
    server_ms: dict[str, float] = field(default_factory=dict)
    round_trip: tuple[float, float] | None = None
    local_samples: int = 0
    gateway_cache: str = ""
    split: int | None = None
    wire: tuple[WireSpan, ...] = ()


class Engine:
    """One process's client, sessions and pushdown state.

    Args:
        spec: The dataset's spec.
        s3: A client to reuse (the process that built the dataset has one already).
    """

    def __init__(self, spec: Spec, s3: Any = None) -> None:
        self.spec = spec
        if s3 is None:
            s3 = client(list(spec.endpoints) or None, **spec.client_options)
        self.s3 = s3
        self.registry = Registry(self.s3, spec.registry_bucket)
        self.pushdown = spec.split is not None
        self.augment: Augmentation | None = None  # this epoch's views (set by the dataset)
        self._sessions: dict[tuple[int, int], Any] = {}
        self._local_caches: dict[int | None, LocalCache] = {}
        self._lock = threading.Lock()
        # Raw reads, queued in request order; the engine already belongs to one process.
        # Threads start on first use.
        self.reads = ThreadPoolExecutor(GET_THREADS, thread_name_prefix="hapi-get")

    @property
    def split(self) -> int | None:
        """The split in use now (``None`` once fallen back to local compute)."""
        return self.spec.split if self.pushdown else None

    def fetch(self, bucket: str, keys: Sequence[str]) -> Batch:
        """Features at the freeze point for ``keys``, in order; objects in the local
        cache are read from it, the rest fetched (and then kept there).

        Raises:
            AccessDenied: The gateway (or the store) refused the credentials or the
                permissions; pushdown stays on.
            RequestError: An object is missing or undecodable (naming it), the gateway
                refused the request, or a server error outlasted the retries.
            ModelUnavailable: The blocks cannot be loaded or run here.
        """
        return self.start(bucket, keys).wait()()

    def start(self, bucket: str, keys: Sequence[str]) -> Fetch[Batch]:
        """Queues the network part of :meth:`fetch` now, behind what was started before.

        A pipeline starts its requests in order and waits for each on a fetch thread,
        while an earlier one decodes and runs its blocks, as a plain-GET loader does;
        the compute a wait returns holds the received bytes until it runs. Objects in
        the local cache are read during the wait.
        """
        spec = self.spec
        if spec.local_cache is None or self.augment is not None:  # views are not kept here
            return self.start_uncached(bucket, keys)
        cache = self._local_cache(spec.local_cache)
        kept = [key for key in keys if cache.holds(bucket, key)]  # a stat each
        held = set(kept)
        missing = [key for key in keys if key not in held]
        pending = self.start_uncached(bucket, missing) if missing else None
        return _Cached(self, cache, bucket, keys, kept, pending)

    def _local_cache(self, root: str) -> LocalCache:
        """The local cache for the split in use now (one per split: it keys the entries)."""
        split = self.split
        cache = self._local_caches.get(split)
        if cache is None:
            spec = self.spec
            cache = LocalCache(root, spec.manifest, spec.freeze, split, spec.dtype, spec.etags)
            self._local_caches[split] = cache
        return cache

    def start_uncached(self, bucket: str, keys: Sequence[str]) -> Fetch[Batch]:
        """:meth:`start`, past the local cache."""
        if self.pushdown:  # one HTTP request: nothing to queue ahead of it
            return Deferred(functools.partial(self._receive, bucket, keys))
        return _RawReads(self, bucket, keys)

    def _receive(self, bucket: str, keys: Sequence[str]) -> Callable[[], Batch]:
        if self.pushdown:  # any other error is raised here, at its batch
            try:
                return self._pushdown(bucket, keys)
            except PushdownUnavailable as exc:
                self._fall_back(str(exc))
            except NoSuchModel as exc:
                self._fall_back(
                    f"the gateway at {', '.join(self.spec.endpoints)} has no model "
                    f"{self.spec.manifest.ref} ({exc.message})"
                )
        return _RawReads(self, bucket, keys).wait()

    def _fall_back(self, why: str) -> None:
        self.pushdown = False
        ref = self.spec.manifest.ref
        with _warned_lock:
            if (self.spec.endpoints, ref) in _warned:
                return
            _warned.add((self.spec.endpoints, ref))
        warnings.warn(
            f"{why}; reading raw objects and running {ref} blocks [0, {self.spec.freeze}) "
            "here instead (the same features; the objects cross the network whole)",
            FallbackWarning,
            stacklevel=2,
        )

    def _pushdown(self, bucket: str, keys: Sequence[str]) -> Callable[[], Batch]:
        spec = self.spec
        assert spec.split is not None
        split = spec.split
        started = time.perf_counter()
        augment = self.augment
        views = {}
        if augment is not None:
            views = {"augment": augment.policy, "seed": augment.seed, "epoch": augment.epoch}
            views["views"] = augment.views
        reply = self.s3.get_features_batch(
            bucket,
            list(keys),
            model=spec.manifest.ref,
            split=split,
            dtype=spec.dtype,
            encoding=spec.encoding,
            **views,
        )
        round_trip = (started, time.perf_counter())
        reply.raise_for_errors()
        labels = [-1] * len(reply.keys) if reply.labels is None else reply.labels.tolist()
        return lambda: Batch(
            features=self.run(reply.features, split, spec.freeze),
            objects=owners_of(keys, reply.keys),
            carried=[None if label < 0 else int(label) for label in labels],
            nbytes=reply.nbytes,
            mode="pushdown",
            server_ms=dict(reply.server_timing),
            round_trip=round_trip,
            gateway_cache=reply.cache,
            split=split,
            wire=reply.wire,
        )

    def decode_and_run(
        self, bucket: str, objects: Iterable[tuple[str, bytes]], arrived: Callable[[], bool]
    ) -> Batch:
        """Decode raw objects as the gateway would and run blocks ``[0, freeze)`` here.

        ``objects`` may be lazy (:class:`_RawReads` yields each as its read completes):
        each is decoded as it comes. ``arrived`` says whether the next object is already
        here: while it is not, the blocks run on the samples decoded (at least
        :data:`RUN_EVERY`), so they run while the reads behind them are on the link;
        samples whose objects came at once run together."""
        samples: list[tuple[str, Sample]] = []
        outputs: list[np.ndarray] = []
        nbytes = ran = 0
        augment = None if self.augment is None else replace(self.augment, bucket=bucket)
        for key, data in objects:
            nbytes += len(data)
            try:
                decoded = decode_object(
                    data, self.spec.manifest.preprocess, key=key, augment=augment
                )
            except UndecodableObject as exc:
                raise UnprocessableObject(
                    "UnprocessableObject", str(exc), bucket=bucket, key=key
                ) from exc
            samples.extend((key, sample) for sample in decoded)
            if len(samples) - ran >= RUN_EVERY and not arrived():
                outputs.append(self._run_samples(samples[ran:]))
                ran = len(samples)
        if ran < len(samples) or not outputs:
            outputs.append(self._run_samples(samples[ran:]))
        return Batch(
            features=outputs[0] if len(outputs) == 1 else np.concatenate(outputs),
            objects=[key for key, _ in samples],
            carried=[sample.label for _, sample in samples],
            nbytes=nbytes,
            mode="local",
        )

    def _run_samples(self, samples: Sequence[tuple[str, Sample]]) -> np.ndarray:
        return self.run(np.stack([sample.array for _, sample in samples]), 0, self.spec.freeze)

    def read(self, bucket: str, key: str) -> bytes:
        """One object, whole (image codecs and tar indexes seek)."""
        return read_object(self.s3, bucket, key)

    def run(self, inputs: np.ndarray, start: int, stop: int) -> np.ndarray:
        """Run blocks ``[start, stop)`` here; returns a writable float32 array."""
        if start >= stop:
            return np.array(inputs, dtype=np.float32)  # a copy: wire arrays are read-only
        session = self._session(start, stop)
        first = session.get_inputs()[0]
        if first.type == "tensor(float16)":
            inputs = inputs.astype(np.float16)
        try:
            output = session.run(None, {first.name: inputs})[0]
        except Exception as exc:  # onnxruntime raises untyped pybind errors
            raise ModelUnavailable(
                f"blocks [{start}, {stop}) of {self.spec.manifest.ref} failed here: {exc}"
            ) from exc
        return np.asarray(output, dtype=np.float32)

    def _session(self, start: int, stop: int) -> Any:
        with self._lock:  # one session per range, however many prefetch threads ask
            session = self._sessions.get((start, stop))
            if session is None:
                try:
                    graph = self.registry.load_blocks(self.spec.manifest, start, stop)
                    session = create_session(graph, self.spec.runtime)
                except ModelError as exc:
                    raise ModelUnavailable(
                        f"cannot load blocks [{start}, {stop}) of {self.spec.manifest.ref} "
                        f"from s3://{self.spec.registry_bucket}: {exc}"
                    ) from exc
                self._sessions[(start, stop)] = session
            return session


def read_object(s3: Any, bucket: str, key: str, start: int = 0, stop: int | None = None) -> bytes:
    """Bytes ``[start, stop)`` of an object (the whole object by default) with ``s3``.

    Raises:
        RequestError: The store refused or failed the read (naming the object).
    """
    extra = (
        {}
        if start == 0 and stop is None
        else {"Range": f"bytes={start}-{'' if stop is None else stop - 1}"}
    )
    try:
        return bytes(s3.get_object(Bucket=bucket, Key=key, **extra)["Body"].read())
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        raise request_error(
            str(error.get("Code", "Unknown")),
            str(error.get("Message", "")),
            bucket=bucket,
            key=key,
            status=status,
        ) from exc
    except BotoCoreError as exc:
        raise RequestError("NetworkError", str(exc), bucket=bucket, key=key) from exc


class _RawReads:
    """A request's raw reads, queued on the engine's GET threads when it is made."""

    def __init__(self, engine: Engine, bucket: str, keys: Sequence[str]) -> None:
        self._engine = engine
        self._bucket = bucket
        self._keys = list(keys)
        self._reads = [engine.reads.submit(engine.read, bucket, key) for key in keys]
        self._next = 0  # the read after the object last handed out

    def wait(self) -> Callable[[], Batch]:
        """The compute, which decodes each object as its read completes, in key order.

        Waiting here for every read before any decoding left a DataLoader worker's link
        idle while it decoded and ran the blocks, and its CPU idle while it read: in the
        head to head's loaded cell at 10 Mbit/s raw reads ran at 0.70-0.80x the
        contender reading the same objects; decoding each object as it comes, and
        running the blocks while the reads behind them are on the link, at
        1.04-1.05x."""
        arrivals = self._arrivals()
        return functools.partial(self._engine.decode_and_run, self._bucket, arrivals, self._here)

    def _arrivals(self) -> Iterator[tuple[str, bytes]]:
        try:
            for index, (key, read) in enumerate(zip(self._keys, self._reads, strict=True)):
                self._next = index + 1
                yield key, read.result()
        except BaseException:
            self.cancel()
            raise

    def _here(self) -> bool:
        """Whether the object after the last one handed out has been read (or there is
        none)."""
        return self._next >= len(self._reads) or self._reads[self._next].done()

    def cancel(self) -> None:
        for read in self._reads:  # the reads not started yet are dropped
            read.cancel()


@dataclass(frozen=True)
class _Cached:
    """A request partly served by the local cache: the misses' fetch (``pending``) was
    queued when it was made; :meth:`wait` reads the ``kept`` entries (one that cannot be
    read is fetched then, a miss after all) and waits for the rest."""

    engine: Engine
    cache: LocalCache
    bucket: str
    keys: Sequence[str]
    kept: list[str]
    pending: Fetch[Batch] | None

    def wait(self) -> Callable[[], Batch]:
        parts = {key: self.cache.get(self.bucket, key) for key in self.kept}
        received = [] if self.pending is None else [self.pending.wait()]
        lost = [key for key in self.kept if parts[key] is None]
        if lost:
            received.append(self.engine.start_uncached(self.bucket, lost).wait())
        return functools.partial(self._finish, parts, received)

    def _finish(
        self,
        parts: dict[str, tuple[np.ndarray, list[int | None]] | None],
        received: list[Callable[[], Batch]],
    ) -> Batch:
        fetched = [compute() for compute in received]
        for batch in fetched:
            for key, part in _per_object(batch).items():
                self.cache.put(self.bucket, key, *part)
                parts[key] = part
        return _assemble(self.keys, parts, fetched)

    def cancel(self) -> None:
        if self.pending is not None:
            self.pending.cancel()


def _per_object(batch: Batch) -> dict[str, tuple[np.ndarray, list[int | None]]]:
    """A fetched batch's rows and carried labels, by object (an object's rows are
    consecutive)."""
    rows: dict[str, list[int]] = {}
    for index, key in enumerate(batch.objects):
        rows.setdefault(key, []).append(index)
    return {
        key: (batch.features[index], [batch.carried[i] for i in index])
        for key, index in rows.items()
    }


def _assemble(
    keys: Sequence[str],
    parts: Mapping[str, tuple[np.ndarray, list[int | None]] | None],
    fetched: Sequence[Batch],
) -> Batch:
    """``keys``' rows in order, from the local cache or the fetches (the request's, then
    one for entries that could not be read after all)."""
    arrays, objects, carried = [], [], []
    for key in keys:
        part = parts.get(key)
        if part is None:
            continue
        arrays.append(part[0])
        objects.extend([key] * len(part[0]))
        carried.extend(part[1])
    first = fetched[0] if fetched else None
    return Batch(
        features=np.concatenate(arrays) if arrays else np.zeros((0,), np.float32),
        objects=objects,
        carried=carried,
        nbytes=sum(batch.nbytes for batch in fetched),
        mode="cached" if first is None else first.mode,
        server_ms={} if first is None else first.server_ms,
        round_trip=None if first is None else first.round_trip,
        split=None if first is None else first.split,
        local_samples=len(objects) - sum(len(batch.objects) for batch in fetched),
        gateway_cache="" if first is None else first.gateway_cache,
        wire=() if first is None else first.wire,
    )
