"""Pushdown: a GET naming a model and a split returns features instead of the object.

``GET /{bucket}/{key}`` with ``x-hapi-model`` / ``x-hapi-split`` (or ``hapi-*`` query
parameters) on an image or a WebDataset tar shard, and ``POST /{bucket}?hapi-batch`` with
a JSON list of keys (``split=auto`` is planned in :mod:`._pushdown_plan`). A request
goes in two steps:

1. fetch the objects (bounded together by ``max_object_bytes``) and list their samples,
   counting them against ``max_request_samples`` and reading each image's header, without
   decoding any pixels; per-key failures of a batch are known here
   (:mod:`._fetch`);
2. decode, run and send the samples in windows sized from ``max_decoded_bytes``: one
   window decodes (in a worker pool, off the event loop) while the previous one runs
   through blocks ``[0, split)`` on the shared batcher, and its rows go out as soon as they
   are done (:mod:`._stream`).

So what one request holds is bounded by settings, whatever the objects hold. A client
that goes away cancels its request: decoding stops at the next sample, and its queued
samples leave the batcher.

Work is shared fairly between identities (the callers' access keys): the batcher serves
their samples in fair order (:mod:`._batcher`), the decoding threads take their jobs in
turn (:class:`._fairness.FairPool`), ``identity_requests_per_s`` caps each one's request
rate, and ``/metrics`` meters each one's samples and compute seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np

from hapi.models import Manifest, PendingSample, UndecodableObject

from .._errors import BackendError, DecodeUnavailable, S3Error, SlowDown, UnprocessableObject
from .._identities import Caller
from .._metrics import Metrics
from .._settings import GatewaySettings
from .._store import StoreClient
from .._types import ASGIReceive, ASGISend
from ._batcher import Arrival, Batcher
from ._cache import Cached, FeatureCache
from ._cached import CachedSample, EntryWriter, cached_samples, lookup_all, merge_rows
from ._decode_processes import DecodeProcesses, DecodeWorkerLost
from ._decoders import Decoding
from ._fairness import FairPool, RequestRate
from ._fetch import Listing, ObjectLister
from ._locality import FetchMeter
from ._params import Params, check_augment, check_split, parse_batch, parse_params
from ._plan import choose_split
from ._stream import Answer, open_stream
from ._tenants import RequestStats, Tenants, per_sample_bytes

__all__ = ["Params", "Pushdown", "parse_params"]

T = TypeVar("T")
_REASONS_SHOWN = 20  # per-key reasons in the message of an all-failed batch
_NOT_EXPECTED: contextlib.nullcontext[None] = contextlib.nullcontext()  # no batcher to tell


class _Progress:
    """Samples of one request whose decoding started (counted in the worker threads)."""

    def __init__(self) -> None:
        self.started = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self.started += 1


class Pushdown:
    """Serves pushdown requests.

    Args:
        settings: Gateway settings (backend URL and credentials, limits).
        store: The gateway's store client (objects are fetched through it).
        tenants: Manifests, sessions and batchers.
        decode_pool: Worker threads for listing, decoding and preprocessing (each
            identity's jobs in turn).
        cache: The feature cache (``None``: none).
        metrics: Where samples served per identity are counted.
        fetches: Counts object fetches by placement (``None``: counted in ``metrics`` as
            placement unknown).
        decoding: The decoder images go through (``None``: Pillow).
        processes: Worker processes Pillow's decoding is handed to (``None``: the
            decoding threads decode themselves).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        store: StoreClient,
        tenants: Tenants,
        decode_pool: FairPool,
        cache: FeatureCache | None = None,
        metrics: Metrics | None = None,
        fetches: FetchMeter | None = None,
        decoding: Decoding | None = None,
        *,
        processes: DecodeProcesses | None = None,
    ) -> None:
        self._settings = settings
        self._decoding = decoding
        self._processes = processes
        self.tenants = tenants
        self._pool = decode_pool
        self._metrics = metrics
        self._rate = RequestRate(settings.identity_requests_per_s)
        self.cache = cache
        self._store = store
        self._fetches = fetches or FetchMeter(metrics)
        self._serve_as(Caller.anonymous())  # until acting_as names the caller

    def acting_as(self, caller: Caller) -> Pushdown:
        """This pushdown serving ``caller``: each object fetch, and each cache lookup's
        HEAD, goes upstream as the caller's own store identity (unsigned for an anonymous
        caller), so the store judges whether it may read the object, cached or not."""
        view = copy.copy(self)
        view._serve_as(caller)
        return view

    def _serve_as(self, caller: Caller) -> None:
        self.caller = caller
        self._as_caller = self._store.acting_as(caller.upstream)
        self._decode_pool = self._pool.serving(caller.name)
        self._lister = ObjectLister(self._settings, self._decode_pool, self._fetches)

    @property
    def stats(self) -> RequestStats:
        return self.tenants.requests

    async def get(
        self,
        send: ASGISend,
        receive: ASGIReceive,
        bucket: str,
        key: str,
        given: Mapping[str, tuple[str, str]],
        *,
        colocated: bool = False,
    ) -> None:
        """Features of one object (an image, or every sample of a shard).

        Args:
            given: The request's pushdown parameters, as the edge parsed them.
            colocated: The client runs on the gateway's machine (for ``split=auto``).
        """
        params = replace(parse_params(given), colocated=colocated)
        await _cancel_on_disconnect(self._serve(send, bucket, [key], params, batch=False), receive)

    async def batch(
        self,
        send: ASGISend,
        receive: ASGIReceive,
        bucket: str,
        body: bytes,
        given: Mapping[str, tuple[str, str]],
        *,
        colocated: bool = False,
    ) -> None:
        """Features of several objects, stacked in key order; failures listed per key."""
        keys, params = parse_batch(body, given, max_keys=self._settings.max_batch_keys)
        params = replace(params, colocated=colocated)
        await _cancel_on_disconnect(self._serve(send, bucket, keys, params, batch=True), receive)

    async def _serve(
        self, send: ASGISend, bucket: str, keys: Sequence[str], params: Params, *, batch: bool
    ) -> None:
        with self.tenants.serving_one():
            await self._serving(send, bucket, keys, params, batch=batch)

    async def _serving(
        self, send: ASGISend, bucket: str, keys: Sequence[str], params: Params, *, batch: bool
    ) -> None:
        started = time.perf_counter()
        self._admit()
        if params.augment is not None:  # a sample's identity includes its bucket
            params = replace(params, augment=replace(params.augment, bucket=bucket))
        manifest, params = await self._resolve(params)
        assert params.split is not None
        if self._metrics is not None:
            self._metrics.series(
                self._metrics.model_requests, manifest.ref, str(params.split)
            ).inc()
        hits, timings, cache = await self._lookup(bucket, keys, manifest, params)
        missing = [key for key in keys if key not in hits]
        split = params.split
        batcher = await self.tenants.batcher(manifest, split) if split and missing else None
        # Samples are on their way: worth a short wait for company in the batcher.
        expected = batcher.expecting(self.caller.name) if batcher is not None else _NOT_EXPECTED
        progress = _Progress()
        decoded = self._decoded_as_listed(manifest, params, missing, batcher, progress)
        with expected as arrival:
            try:
                listing = await self._lister.list_all(
                    self._as_caller, bucket, missing, manifest, batch, params.augment, decoded
                )
            except asyncio.CancelledError:
                self.stats.requests_cancelled += 1
                raise
            answer, writer = self._answer(keys, hits, listing, manifest, params, cache, timings)
            answer.started = started
            await self._run(send, answer, arrival, progress, writer, decoded)

    def _decoded_as_listed(
        self,
        manifest: Manifest,
        params: Params,
        missing: Sequence[str],
        batcher: Batcher | None,
        progress: _Progress,
    ) -> _DecodedAsListed | None:
        """Where a request's images are decoded in the pool job that lists them (one hop
        to the pool a sample, not two; a batch's key that fails to decode fails alone, as
        one that fails to list does): for a single GET, or a batch that fits one window,
        decoded by Pillow in the decoding threads, with no view to draw. ``None``
        otherwise."""
        split = params.split
        assert split is not None
        if (
            not missing
            or params.augment is not None
            or self._processes is not None
            or manifest.preprocess.decoder != "pil"
            or len(missing) > self.window(manifest, split, batcher)
        ):
            return None

        def decode(sample: PendingSample, out: np.ndarray) -> None:
            self._decode_into(manifest, split, progress, sample, out)

        return _DecodedAsListed(missing, tuple(manifest.input.shape), decode)

    def _admit(self) -> None:
        """Count the request against its identity's rate.

        Raises:
            SlowDown: The identity is over ``identity_requests_per_s``.
        """
        try:
            self._rate.take(self.caller.name)
        except SlowDown:
            if self._metrics is not None:
                self._metrics.pushdown_rate_limited.labels(self.caller.name).inc()
            raise

    def _served(self, source: str, samples: int) -> None:
        """Meter samples served without the batcher (its meter counts computed ones)."""
        if self._metrics is not None and samples:
            self._metrics.series(self._metrics.pushdown_samples, self.caller.name, source).inc(
                samples
            )

    def _answer(
        self,
        keys: Sequence[str],
        hits: dict[str, Cached],
        listing: Listing,
        manifest: Manifest,
        params: Params,
        cache: FeatureCache | None,
        timings: dict[str, float],
    ) -> tuple[Answer, EntryWriter | None]:
        """The answer's samples in key order (cached rows in place), and the writer of the
        computed objects' cache entries."""
        split, missing = params.split, [key for key in keys if key not in hits]
        assert split is not None
        samples: list[PendingSample | CachedSample] = []
        owners: list[str | None] = []
        for key in keys:
            found = cached_samples(hits[key]) if key in hits else listing.samples.get(key, [])
            samples += found
            owners += [None if key in hits else key] * len(found)
        if not samples:
            raise _all_failed(listing.errors)
        if missing:
            timings.update({"fetch": listing.fetch_ms, "decode": 0.0, "infer": 0.0})
        answer = Answer(
            manifest,
            params,
            samples,
            _output_shape(manifest, split),
            errors={k: f"{e.code}: {e.message}" for k, e in listing.errors.items()},
            timings=timings,
            cache="bypass" if cache is None else ("miss" if missing else "hit"),
        )
        writer = None
        if cache is not None and missing:
            row_bytes = 4 * math.prod(answer.row_shape)
            writer = EntryWriter(
                cache,
                manifest,
                split,
                params.dtype,
                owners,
                listing.identities,
                row_bytes,
                caller=self.caller.name,
                view=_view_material(params),
            )
        return answer, writer

    async def _lookup(
        self, bucket: str, keys: Sequence[str], manifest: Manifest, params: Params
    ) -> tuple[dict[str, Cached], dict[str, float], FeatureCache | None]:
        """Cached entries of ``keys``, the lookup's timing, and the cache in use (``None``
        when there is none, it is off, or the request bypasses it)."""
        cache = self.cache
        if cache is None or not cache.enabled or params.cache == "bypass":
            return {}, {}, None
        if params.augment is not None and not params.augment.views:
            return {}, {}, None  # a fresh view per epoch: never cached
        assert params.split is not None
        started = time.perf_counter()
        hits = await lookup_all(
            cache,
            self._as_caller,
            bucket,
            keys,
            manifest,
            params.split,
            params.dtype,
            params.cache,
            _view_material(params),
        )
        return hits, {"cache": (time.perf_counter() - started) * 1000}, cache

    async def _resolve(self, params: Params) -> tuple[Manifest, Params]:
        manifest = await self.tenants.manifest(params.model)
        if self._decoding is not None:  # the preset served names the decoder (cache keys)
            manifest = self._decoding.served(manifest)
        if params.split is None:  # split=auto on the gateway's view
            storage = await self.tenants.profiler.current(manifest)
            assumed = self._settings.assumed_bandwidth_bps
            split = choose_split(manifest, params, self.tenants.budget, assumed, storage)
            params = replace(params, split=split)
        assert params.split is not None
        check_split(manifest, params.split)
        check_augment(manifest, params)
        return manifest, params

    # -- step 2: decode, run and send in windows -----------------------------------------

    async def _run(
        self,
        send: ASGISend,
        answer: Answer,
        arrival: Arrival | None,
        progress: _Progress,
        writer: EntryWriter | None = None,
        decoded: _DecodedAsListed | None = None,
    ) -> None:
        samples, stream = answer.samples, open_stream(send, answer)
        batcher = arrival.batcher if arrival is not None else None
        assert answer.params.split is not None
        size = self.window(answer.manifest, answer.params.split, batcher)
        pending = sum(not isinstance(s, CachedSample) for s in samples)
        self.stats.samples_listed += pending
        windows = [samples[i : i + size] for i in range(0, len(samples), size)]
        decoding: asyncio.Future[np.ndarray] = asyncio.ensure_future(
            self._decode(windows[0], answer, progress, decoded)
        )
        try:
            for index in range(len(windows)):
                inputs = await decoding
                if index + 1 < len(windows):  # the next window decodes while this one runs
                    decoding = asyncio.ensure_future(
                        self._decode(windows[index + 1], answer, progress)
                    )
                outputs = await self._infer(inputs, answer, arrival)
                del inputs
                rows = merge_rows(windows[index], outputs, answer.row_shape)
                if writer is not None:
                    writer.add(windows[index], rows)
                await stream.rows(rows)
                self._served("cache", sum(isinstance(s, CachedSample) for s in windows[index]))
                if self._metrics is not None:
                    labels = (answer.manifest.ref, str(answer.params.split))
                    self._metrics.series(self._metrics.model_samples, *labels).inc(len(rows))
            await stream.finish()
        except BaseException as exc:
            decoding.cancel()
            with contextlib.suppress(BaseException):
                await decoding
            if isinstance(exc, asyncio.CancelledError):
                self.stats.requests_cancelled += 1
                self.stats.samples_abandoned += pending - progress.started
            raise

    def window(self, manifest: Manifest, split: int, batcher: Batcher | None) -> int:
        """Samples per window: two windows (one decoding, one running) of inputs,
        activations and outputs fit in ``max_decoded_bytes``."""
        inputs = 4 * math.prod(manifest.input.shape)
        outputs = 4 * math.prod(_output_shape(manifest, split))
        activations = per_sample_bytes(manifest, split) if split else 0
        each = inputs + activations + 2 * outputs  # outputs: float32, then their wire bytes
        size = max(1, self._settings.max_decoded_bytes // (2 * each))
        return size if batcher is None else min(size, batcher.max_queue)

    async def _decode(
        self,
        samples: Sequence[PendingSample | CachedSample],
        answer: Answer,
        progress: _Progress,
        as_listed: _DecodedAsListed | None = None,
    ) -> np.ndarray:
        """Decode the window's samples that the cache did not answer (the rows decoded as
        they were listed, when every one was)."""
        manifest, split = answer.manifest, answer.params.split
        assert split is not None
        window = [s for s in samples if isinstance(s, PendingSample)]
        early = None if as_listed is None else as_listed.rows(window)
        if as_listed is not None and early is not None:
            answer.timings["decode"] = answer.timings.get("decode", 0.0) + as_listed.ms()
            return early
        started = time.perf_counter()
        inputs = np.empty((len(window), *manifest.input.shape), np.float32)
        max_pixels = self._settings.max_image_pixels
        decoded = (
            None
            if self._metrics is None
            else self._metrics.series(self._metrics.decode_seconds, manifest.ref, str(split))
        )

        def one(index: int, sample: PendingSample) -> None:
            self._decode_into(manifest, split, progress, sample, inputs[index])

        def chunk(start: int, stop: int) -> None:  # in a worker process, one message
            assert self._processes is not None
            for _ in range(start, stop):
                progress.start()
            rows, preset = inputs[start:stop], manifest.preprocess
            times = self._processes.decode(
                window[start:stop], preset, max_pixels=max_pixels, out=rows
            )
            for seconds in times:  # CPU seconds of the worker that decoded each
                self.stats.count_decoded(seconds)
            if decoded is not None:
                decoded.inc(sum(times))

        def batch() -> None:  # DALI: the whole window in one pipeline run
            assert self._decoding is not None
            decoder = self._decoding.batch_decoder(manifest.preprocess)
            for _ in window:
                progress.start()
            started = time.perf_counter()
            images, keys = [s.image for s in window], [s.member or s.key for s in window]
            decoder.decode(images, inputs, keys=keys)
            seconds = time.perf_counter() - started
            self.stats.count_decoded(seconds)
            if decoded is not None:
                decoded.inc(seconds)

        loop = asyncio.get_running_loop()
        if manifest.preprocess.decoder != "pil" and window:
            jobs = [loop.run_in_executor(self._decode_pool, batch)]
        elif self._processes is not None:
            bounds = _chunks(len(window), self._processes.count)
            jobs = [loop.run_in_executor(self._decode_pool, chunk, *b) for b in bounds]
        else:
            jobs = [
                loop.run_in_executor(self._decode_pool, one, i, s) for i, s in enumerate(window)
            ]
        try:
            await (jobs[0] if len(jobs) == 1 else asyncio.gather(*jobs))  # one: no gathering
        except UndecodableObject as exc:
            raise UnprocessableObject(
                f"{exc} (model {manifest.ref} needs an image or a tar shard)"
            ) from exc
        except DecodeWorkerLost as exc:
            raise DecodeUnavailable(f"{exc}; retry the request", retry_after=1) from exc
        finally:
            for job in jobs:
                job.cancel()  # those not started yet never start
        _add(answer.timings, "decode", started)
        return inputs

    def _decode_into(
        self,
        manifest: Manifest,
        split: int,
        progress: _Progress,
        sample: PendingSample,
        out: np.ndarray,
    ) -> None:
        """Decode one sample into ``out`` in a decoding thread, and meter it."""
        progress.start()
        started = time.thread_time()
        sample.decode(manifest.preprocess, max_pixels=self._settings.max_image_pixels, out=out)
        seconds = time.thread_time() - started
        self.stats.count_decoded(seconds)
        if self._metrics is not None:
            self._metrics.series(self._metrics.decode_seconds, manifest.ref, str(split)).inc(
                seconds
            )

    async def _infer(
        self, inputs: np.ndarray, answer: Answer, arrival: Arrival | None
    ) -> np.ndarray:
        if arrival is None:
            self._served("decoded", len(inputs))
            return inputs
        if not len(inputs):  # every sample of the window came from the cache
            return np.empty((0, *answer.row_shape), np.float32)
        started = time.perf_counter()
        # The first window may be told to slow down (nothing is sent yet); later ones
        # wait for room in the queue, since their response has started.
        outputs, used = await arrival.submit(inputs, wait=not arrival.expected)
        answer.batch_size = max(answer.batch_size, used)
        _add(answer.timings, "infer", started)
        return outputs


class _DecodedAsListed:
    """A request's images decoded in the pool jobs that list them, a row per key.

    Called (in a decoding thread) with each key's listed samples: an image is decoded into
    its key's row, and a shard left for its window (its members are found only now).
    :meth:`rows` gives a window's inputs when every one of its samples was decoded so.
    """

    def __init__(
        self,
        keys: Sequence[str],
        shape: tuple[int, ...],
        decode: Callable[[PendingSample, np.ndarray], None],
    ) -> None:
        self.inputs = np.empty((len(keys), *shape), np.float32)
        self._row = {key: row for row, key in enumerate(keys)}
        self._decode = decode
        self._rows: dict[int, int] = {}  # id(sample) -> its row, once decoded
        self._first = math.inf
        self._last = -math.inf

    def __call__(self, key: str, samples: list[PendingSample]) -> None:
        if len(samples) != 1 or samples[0].key != key:
            return  # a shard's members (named key#member): decoded with their window
        started = time.perf_counter()
        self._decode(samples[0], self.inputs[self._row[key]])
        self._rows[id(samples[0])] = self._row[key]
        self._first, self._last = min(self._first, started), max(self._last, time.perf_counter())

    def rows(self, window: Sequence[PendingSample]) -> np.ndarray | None:
        """The inputs of ``window`` in its order, or ``None`` if one was not decoded here."""
        found = [self._rows.get(id(sample)) for sample in window]
        rows = [row for row in found if row is not None]
        if len(rows) < len(found):
            return None
        if rows == list(range(len(self.inputs))):
            return self.inputs
        return self.inputs[rows]  # some keys failed (or came twice): their rows copied

    def ms(self) -> float:
        """Milliseconds from the first decode's start to the last one's end."""
        return max(0.0, (self._last - self._first) * 1000)


def _view_material(params: Params) -> dict[str, object] | None:
    """The augmented view's part of the cache key (``None``: the preset's features)."""
    return None if params.augment is None else params.augment.cache_material()


def _add(timings: dict[str, float], name: str, started: float) -> None:
    timings[name] = timings.get(name, 0.0) + (time.perf_counter() - started) * 1000


def _all_failed(errors: dict[str, S3Error]) -> S3Error:
    """No key of a batch could be served: one error, with every key's reason."""
    reasons = "; ".join(
        f"{key}: {e.code}: {e.message}" for key, e in list(errors.items())[:_REASONS_SHOWN]
    )
    if len(errors) > _REASONS_SHOWN:
        reasons += f"; and {len(errors) - _REASONS_SHOWN} more"
    message = f"no key of the batch could be served: {reasons}"
    kinds = {(e.code, e.status) for e in errors.values()}
    if len(kinds) == 1:
        code, status = kinds.pop()
        return BackendError(code, status, message)
    return UnprocessableObject(message)


_CHUNK = 8  # samples at most in one message to a decode worker (others wait behind it)


def _chunks(samples: int, workers: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each chunk a window's samples go to worker processes in: as
    few messages as keep every worker busy, of at most ``_CHUNK`` samples."""
    size = max(1, min(_CHUNK, -(-samples // workers)))
    return [(start, min(start + size, samples)) for start in range(0, samples, size)]


def _output_shape(manifest: Manifest, split: int) -> tuple[int, ...]:
    return (
        tuple(manifest.input.shape)
        if split == 0
        else tuple(manifest.blocks[split - 1].output_shape)
    )


async def _cancel_on_disconnect(work: Awaitable[T], receive: ASGIReceive) -> T:
    """Run ``work``, but cancel it if the client goes away (and wait until it has let go
    of its samples: decoding stopped, queued samples dropped)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise ConnectionAbortedError("client disconnected during pushdown")
        return task.result()
    finally:
        watcher.cancel()


async def _disconnected(receive: ASGIReceive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
