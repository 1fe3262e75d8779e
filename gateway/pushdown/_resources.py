"""Pushdown's resources, owned by the app's lifespan: worker pools, registry, tenants."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from hapi.models import RuntimeSettings, runs_on_cuda
from hapi.protocol import Placement

from .._metrics import Metrics
from .._settings import GatewaySettings
from .._store import StoreClient
from ._batcher import MemoryBudget
from ._cache import FeatureCache
from ._decode_processes import DecodeProcesses
from ._decoders import Decoding
from ._fairness import FairPool
from ._handler import Pushdown
from ._locality import open_fetch_meter
from ._priority import applies, bulk_niceness, lower_this_thread
from ._registry import AsyncRegistry, StoreRegistry
from ._tenants import SessionFactory, Tenants

log = logging.getLogger("hapi.gateway")


def _bulk_priority(steps: int) -> functools.partial[None]:
    """What each pushdown worker thread and decode process runs first: its drop to
    ``steps`` nice steps below the request handling (see :mod:`._priority`)."""
    return functools.partial(lower_this_thread, bulk_niceness(steps))


def memory_budget(settings: GatewaySettings) -> MemoryBudget:
    """Free GPU memory when inference runs on CUDA, the configured budget otherwise."""
    if runs_on_cuda(settings.device):
        free = _gpu_free_bytes()
        if free is not None:
            return MemoryBudget(total=int(free * 0.9), source="90% of free GPU memory at start-up")
    return MemoryBudget(total=settings.memory_budget_bytes, source="configured (CPU)")


def _gpu_free_bytes() -> int | None:
    return _gpu_memory("free")


def gpu_used_bytes() -> float:
    """Memory in use on GPU 0 (0 when it cannot be read), for ``/metrics``."""
    return float(_gpu_memory("used") or 0)


def _gpu_memory(which: str) -> int | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, f"--query-gpu=memory.{which}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return int(out.strip().splitlines()[0]) * 1024 * 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        log.warning("cannot read the GPU's %s memory (%s)", which, exc)
        return None


@contextlib.asynccontextmanager
async def open_pushdown(
    settings: GatewaySettings,
    store: StoreClient,
    metrics: Metrics | None = None,
    *,
    registry: AsyncRegistry | None = None,
    runner: SessionFactory | None = None,
    placement: Placement | None = None,
) -> AsyncIterator[Pushdown]:
    """Create pushdown's pools, registry, tenants, feature cache and the placement lookup
    its fetches are counted by; close them on exit.

    ``registry``, ``runner`` and ``placement`` replace the backend's registry, the
    onnxruntime sessions and the lookup of ``settings.placement`` (the seams in-process
    tests use).
    """
    workers = settings.decode_workers or os.cpu_count() or 2
    if metrics is not None and runs_on_cuda(settings.device):
        metrics.device_memory.set_function(gpu_used_bytes)
    decoding = Decoding(settings)  # a decoder the node cannot run fails the start here
    runtime = RuntimeSettings(
        device=settings.device,
        intra_op_threads=settings.intra_op_threads,
        tf32=settings.tf32,
        conv_search=settings.conv_search,
    )
    # Worker processes decode Pillow's images; DALI decodes a window at once on its own.
    processes = settings.decode_processes if decoding.name == "pil" else 0
    if settings.compute_niceness + settings.decode_niceness and not applies():
        log.warning(
            "compute_niceness and decode_niceness are applied on Linux only; pushdown runs "
            "at the requests' priority"
        )
    bulk = _bulk_priority(settings.compute_niceness)
    # Decoding further down than the blocks: a window already decoded runs its blocks
    # before a newer request's images decode beside them on the same cores.
    lowest = _bulk_priority(settings.compute_niceness + settings.decode_niceness)
    with (
        FairPool(max(workers, processes), "hapi-decode", initializer=lowest) as decode_pool,
        DecodeProcesses(processes, initializer=lowest)
        if processes
        else contextlib.nullcontext() as decoders,
        ThreadPoolExecutor(1, thread_name_prefix="hapi-infer", initializer=bulk) as infer_pool,
        ThreadPoolExecutor(1, thread_name_prefix="hapi-load", initializer=bulk) as load_pool,
        open_fetch_meter(settings, metrics, placement) as fetches,
    ):
        tenants = Tenants(
            registry or StoreRegistry(store),
            memory_budget(settings),
            infer_pool,
            load_pool=load_pool,
            runtime=runtime,
            max_delay_s=settings.max_queue_delay_ms / 1000,
            max_queue_samples=settings.max_queue_samples,
            fixed_batch=settings.fixed_batch_size,
            make_run=runner,
            meter=metrics.computed if metrics is not None else None,
            observe=metrics.batch_observer if metrics is not None else None,
        )
        try:
            busy = tenants.is_serving
            async with FeatureCache(settings, store, metrics, busy=busy).running() as cache:
                yield Pushdown(
                    settings,
                    store,
                    tenants,
                    decode_pool,
                    cache,
                    metrics,
                    fetches,
                    decoding,
                    processes=decoders,
                )
        finally:
            await tenants.close()
