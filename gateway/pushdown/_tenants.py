"""Models the gateway serves: manifests looked up on demand, sessions and batchers cached.

A batcher is keyed by the hashes of the blocks it runs, not by model name: tenants whose
models share a frozen block prefix and split share one session and one batch queue.
Manifests pinned to a version are immutable and cached for good; ``NAME`` (the latest
version) is re-resolved after a short TTL, so a newly registered model or version is
servable without a restart.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hapi.models import (
    InvalidModelSpec,
    Manifest,
    ModelError,
    RuntimeSettings,
    assemble_blocks,
    create_session,
    parse_ref,
    runs_on_cuda,
)
from hapi.models import NoSuchModel as RegistryNoSuchModel
from hapi.protocol import GatewayStats, MemoryBudgetStats, RequestCounters, ServedSplit, TenantStats

from .._errors import InvalidArgument, NoSuchModel, ServiceUnavailable
from ._batcher import Batcher, MemoryBudget, Meter, Observer, OutOfMemory
from ._params import check_split
from ._profiles import ChainedRun, ProfiledRun, StorageProfiler, TimedRun
from ._registry import AsyncRegistry

QUIET_S = 0.25
"""How long no pushdown request must have been served before the gateway counts as idle
(the feature cache writes its entries then): longer than the gaps between one job's
requests, shorter than the pause between its epochs."""
_OOM_MARKERS = (
    "failed to allocate memory",
    "out of memory",
    "cudnn_status_alloc_failed",
    "bad_alloc",
)
SessionFactory = Callable[[Manifest, int], Callable[[np.ndarray], np.ndarray]]


@dataclass
class RequestStats:
    """Pushdown requests' sample counters, for ``/_hapi/stats``: what was listed, what was
    decoded, and what requests whose client went away left undecoded."""

    samples_listed: int = 0
    samples_decoded: int = 0
    samples_abandoned: int = 0
    requests_cancelled: int = 0
    profiler: StorageProfiler = field(default_factory=StorageProfiler, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_decoded(self, cpu_s: float | None = None) -> None:
        """One more sample decoded, in ``cpu_s`` of thread CPU time (called from the
        decoding threads)."""
        with self._lock:
            self.samples_decoded += 1
        if cpu_s is not None:
            self.profiler.record_decode(cpu_s)

    def as_dict(self) -> dict[str, int]:
        return {
            "samples_listed": self.samples_listed,
            "samples_decoded": self.samples_decoded,
            "samples_abandoned": self.samples_abandoned,
            "requests_cancelled": self.requests_cancelled,
        }


@dataclass
class _Tenant:
    batcher: Batcher
    weights: int
    models: set[tuple[str, int]]
    last_used: float
    run: TimedRun | None = None

    async def close(self) -> None:
        await self.batcher.close()
        if self.run is not None:
            await asyncio.to_thread(self.run.close)


def _device_of(session: Any) -> str:
    return "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"


def ort_runner(session: Any) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap an onnxruntime session as a batch run function that reports OOM as such."""
    input_name = session.get_inputs()[0].name

    def run(batch: np.ndarray) -> np.ndarray:
        try:
            return np.asarray(session.run(None, {input_name: batch})[0])
        except MemoryError as exc:
            raise OutOfMemory(str(exc)) from exc
        except Exception as exc:  # onnxruntime's pybind errors have no useful types
            if any(marker in str(exc).lower() for marker in _OOM_MARKERS):
                raise OutOfMemory(str(exc)) from exc
            raise

    return run


def per_sample_bytes(manifest: Manifest, split: int) -> int:
    """Memory one sample needs through blocks ``[0, split)``: the largest pair of
    consecutive activations (a block's input and output live together), or the block's
    own measured peak when that is larger."""
    blocks = manifest.blocks[:split]
    input_bytes = 4 * math.prod(manifest.input.shape)
    best = 0
    for block in blocks:
        best = max(best, input_bytes + block.output_bytes, block.peak_activation_bytes)
        input_bytes = block.output_bytes
    return best


class Tenants:
    """Manifests, sessions and batchers of the models this gateway serves.

    Args:
        registry: The registry (read on the event loop; its reads are async).
        budget: The shared memory budget.
        infer_pool: Where inference runs (one thread per device).
        load_pool: Where sessions are built (``None``: the event loop's default executor).
        runtime: Session settings (device, threads).
        make_run: Builds the run function of blocks ``[0, split)``; the seam that tests
            use to inject an executor (the default loads blocks and makes an ORT session).
            Every batch it runs is timed alone for the storage profile.
        latest_ttl_s: How long ``NAME`` stays resolved to one version.
        max_tenants: Sessions kept at most; the least recently used idle one goes first.
        max_delay_s: The batchers' longest queue delay.
        max_queue_samples: Per-batcher queue bound.
        meter: Told each identity's samples and compute seconds of every batch.
        observe: ``observe(model_ref, split)`` gives the observer of that batcher's batches
            (their sizes, run times and queue waits).
    """

    def __init__(
        self,
        registry: AsyncRegistry,
        budget: MemoryBudget,
        infer_pool: Executor,
        *,
        load_pool: Executor | None = None,
        runtime: RuntimeSettings | None = None,
        make_run: SessionFactory | None = None,
        latest_ttl_s: float = 5.0,
        max_tenants: int = 16,
        max_delay_s: float = 0.004,
        max_queue_samples: int = 4096,
        fixed_batch: int | None = None,
        meter: Meter | None = None,
        observe: Callable[[str, int], Observer] | None = None,
    ) -> None:
        self.registry = registry
        self._observe = observe
        self.budget = budget
        self._pool = infer_pool
        self._load_pool = load_pool
        self._runtime = runtime or RuntimeSettings()
        self._make_run = make_run
        self._device = "cpu"  # where sessions run: set by the first onnxruntime session
        self._latest_ttl = latest_ttl_s
        self._max_tenants = max_tenants
        self._batcher_options: dict[str, Any] = {
            "max_delay_s": max_delay_s,
            "max_queue_samples": max_queue_samples,
            "fixed_batch": fixed_batch,
            "meter": meter,
        }
        self._pinned: dict[str, Manifest] = {}
        self._latest: dict[str, tuple[float, Manifest]] = {}
        self._tenants: collections.OrderedDict[tuple[str, ...], _Tenant] = collections.OrderedDict()
        self._creating: dict[tuple[str, ...], asyncio.Task[_Tenant]] = {}
        self._resolving: dict[str, asyncio.Task[Manifest]] = {}
        self.requests = RequestStats()
        self.serving = 0  # pushdown requests being served now (the cache's writes wait)
        self._idle_since = time.monotonic()

    async def manifest(self, ref: str) -> Manifest:
        """Resolve ``NAME`` or ``NAME@VERSION``.

        Raises:
            InvalidArgument: ``ref`` cannot name a model (it can never succeed).
            NoSuchModel: The registry has no such model.
        """
        try:
            parse_ref(ref)
        except InvalidModelSpec as exc:
            raise InvalidArgument(f"x-hapi-model: {exc}") from exc
        if ref in self._pinned:
            return self._pinned[ref]
        cached = self._latest.get(ref)
        if cached is not None and time.monotonic() - cached[0] < self._latest_ttl:
            return cached[1]
        # Every request that finds the name unresolved (each time its latest version goes
        # stale) waits on one read of the registry, not one read each; one that goes away
        # leaves the read to the others.
        reading = self._resolving.get(ref)
        if reading is None:
            reading = asyncio.get_running_loop().create_task(self._lookup(ref))
            self._resolving[ref] = reading
            reading.add_done_callback(lambda task: self._resolved(ref, task))
        manifest = await asyncio.shield(reading)
        self._pinned[manifest.ref] = manifest
        if "@" not in ref:
            self._latest[ref] = (time.monotonic(), manifest)
        return manifest

    def _resolved(self, ref: str, task: asyncio.Task[Manifest]) -> None:
        self._resolving.pop(ref, None)
        if not task.cancelled():
            task.exception()  # seen: every waiter may have gone away before it failed

    async def _lookup(self, ref: str) -> Manifest:
        try:
            return await self.registry.get_manifest(ref)
        except RegistryNoSuchModel as exc:
            raise NoSuchModel(
                f"the registry has no model {ref!r}; `hapi models ls` lists them"
            ) from exc
        except ModelError as exc:
            raise ServiceUnavailable(
                f"the model registry cannot be read: {exc}", retry_after=1
            ) from exc

    async def batcher(self, manifest: Manifest, split: int) -> Batcher:
        """The batcher running blocks ``[0, split)`` of ``manifest`` (shared by prefix).

        Raises:
            InvalidArgument: ``split`` is outside ``0..freeze``.
            ValueError: ``split`` is 0, which runs no block (its callers decode only).
        """
        check_split(manifest, split)
        if split == 0:
            raise ValueError("split 0 runs no block: it has no batcher")
        key = manifest.hashes[:split]
        tenant = self._tenants.get(key)
        if tenant is None:
            task = self._creating.get(key)
            if task is None:
                task = asyncio.get_running_loop().create_task(self._create(manifest, split))
                self._creating[key] = task
                task.add_done_callback(lambda _t: self._creating.pop(key, None))
            tenant = await asyncio.shield(task)
        tenant.last_used = time.monotonic()
        tenant.models.add((manifest.ref, split))
        self._tenants.move_to_end(key)
        return tenant.batcher

    async def _create(self, manifest: Manifest, split: int) -> _Tenant:
        if self._make_run is None:
            untimed = await self._ort_run(manifest, split)
        else:
            untimed = await asyncio.to_thread(self._make_run, manifest, split)
        run = self._timed(untimed, manifest, split)
        weights = sum(block.size for block in manifest.blocks[:split])
        name = f"{manifest.ref}[0:{split}]"
        batcher = Batcher(
            name,
            run,
            per_sample_bytes=per_sample_bytes(manifest, split),
            budget=self.budget,
            pool=self._pool,
            observer=self._observe(manifest.ref, split) if self._observe else None,
            **self._batcher_options,
        )
        tenant = _Tenant(batcher, weights, set(), time.monotonic(), run)
        self._tenants[manifest.hashes[:split]] = tenant
        self.budget.weights += weights
        await self._evict()
        return tenant

    @property
    def profiler(self) -> StorageProfiler:
        """The storage side's measured times."""
        return self.requests.profiler

    def _timed(
        self, run: Callable[[np.ndarray], np.ndarray], manifest: Manifest, split: int
    ) -> TimedRun:
        return TimedRun(
            run,
            manifest,
            split,
            device=self._device,
            profiler=self.profiler,
            cpu_clock=self._device == "cpu" and self._runtime.intra_op_threads == 1,
        )

    async def _ort_run(self, manifest: Manifest, split: int) -> Callable[[np.ndarray], np.ndarray]:
        """Blocks ``[0, split)`` fetched (async), then verified, composed and loaded into
        an onnxruntime session in a worker thread (CPU work, not I/O)."""
        try:
            blobs = await self.registry.fetch_blocks(manifest, 0, split)
            return await asyncio.get_running_loop().run_in_executor(
                self._load_pool, self._session, manifest, split, blobs
            )
        except ModelError as exc:
            raise ServiceUnavailable(
                f"cannot load {manifest.ref} blocks [0, {split}): {exc}"
            ) from exc

    def _session(
        self, manifest: Manifest, split: int, blobs: list[bytes | None]
    ) -> Callable[[np.ndarray], np.ndarray]:
        graph = assemble_blocks(manifest, 0, blobs)
        if not runs_on_cuda(self._runtime.device):
            prefix = os.path.join(tempfile.gettempdir(), f"hapi-profile-{os.getpid()}-")
            session = create_session(graph, self._runtime, profile_prefix=prefix)
            self._device = _device_of(session)
            return ProfiledRun(ort_runner(session), session, split)
        session = create_session(graph, self._runtime)
        self._device = _device_of(session)
        chain = [
            ort_runner(create_session(assemble_blocks(manifest, i, [blob]), self._runtime))
            for i, blob in enumerate(blobs)
        ]
        return ChainedRun(ort_runner(session), chain)

    async def _evict(self) -> None:
        while len(self._tenants) > self._max_tenants:
            key, tenant = next(iter(self._tenants.items()))
            if tenant.batcher.queued:
                return  # the oldest is busy; try again on the next creation
            del self._tenants[key]
            self.budget.weights -= tenant.weights
            await tenant.close()

    async def close(self) -> None:
        """Stop every batcher."""
        for tenant in self._tenants.values():
            await tenant.close()
        self._tenants.clear()

    @contextlib.contextmanager
    def serving_one(self) -> Iterator[None]:
        """Count a pushdown request as served for the block."""
        self.serving += 1
        try:
            yield
        finally:
            self.serving -= 1
            if not self.serving:
                self._idle_since = time.monotonic()

    def is_serving(self) -> bool:
        """Whether pushdown requests are being served now, or were in the last
        :data:`QUIET_S`: the gaps between a job's requests do not count as idle."""
        return self.serving > 0 or time.monotonic() - self._idle_since < QUIET_S

    def queued_samples(self) -> int:
        """Samples waiting in every batcher."""
        return sum(tenant.batcher.queued for tenant in self._tenants.values())

    def stats(self) -> GatewayStats:
        """Per-tenant batching figures and the memory budget, for ``/_hapi/stats``."""
        budget = MemoryBudgetStats(
            total_bytes=self.budget.total,
            weights_bytes=self.budget.weights,
            source=self.budget.source,
            active_tenants=self.budget.active_tenants,
            share_bytes=self.budget.share(),
        )
        return GatewayStats(
            requests=RequestCounters(**self.requests.as_dict()),
            memory_budget=budget,
            tenants=[_stats(t) for t in self._tenants.values()],
        )


def _stats(tenant: _Tenant) -> TenantStats:
    return TenantStats(
        blocks=tenant.batcher.name,
        served_as=[ServedSplit(model=ref, split=split) for ref, split in sorted(tenant.models)],
        weights_bytes=tenant.weights,
        per_sample_bytes=tenant.batcher.per_sample_bytes,
        max_batch_size=tenant.batcher.max_batch_size(),
        queue_depth=tenant.batcher.queued,
        **tenant.batcher.stats.as_dict(),
    )
