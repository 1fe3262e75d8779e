"""What the gateway's control plane tells the planner: one typed schema for both sides.

The gateway builds these values for ``/_hapi/stats`` and ``/_hapi/models[/{name}]`` (and
FastAPI publishes them in its OpenAPI document); the planner parses the same classes back,
so a renamed or retyped field fails on both sides at once instead of in a regex. They live
here, in the lowest package both may import.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Schema(BaseModel):
    # Unknown fields are ignored: a newer gateway may say more than an older planner reads.
    model_config = ConfigDict(frozen=True, extra="ignore")


class ServedSplit(_Schema):
    """One model version and split a tenant's blocks are served as."""

    model: str
    split: int


class MemoryBudgetStats(_Schema):
    """The storage-side memory budget shared by all tenants."""

    total_bytes: int
    weights_bytes: int
    source: str
    active_tenants: int
    share_bytes: int

    def new_tenant_share(self) -> int:
        """Bytes one more tenant would get: unused bytes divided among the active ones and it."""
        return max(1, (self.total_bytes - self.weights_bytes) // (self.active_tenants + 1))


class TenantStats(_Schema):
    """Batching figures of one batcher (a block prefix, shared by the models that have it)."""

    blocks: str
    served_as: list[ServedSplit]
    weights_bytes: int
    per_sample_bytes: int
    max_batch_size: int
    queue_depth: int
    batches: int
    samples: int
    oom_events: int
    samples_per_s: float
    ms_per_sample: float | None
    recent_batch_sizes: list[int]
    mean_batch_size: float | None
    samples_dropped: int = 0
    requests_cancelled: int = 0
    busy_share: float = 0.0  # of the last 10 s spent running batches (work in progress)

    def serves(self, ref: str) -> list[int]:
        """The splits of model version ``ref`` this tenant runs."""
        return [served.split for served in self.served_as if served.model == ref]


class RequestCounters(_Schema):
    """Pushdown requests' sample counters: listed, decoded, and left undecoded by requests
    whose client went away."""

    samples_listed: int = 0
    samples_decoded: int = 0
    samples_abandoned: int = 0
    requests_cancelled: int = 0


class GatewayStats(_Schema):
    """``GET /_hapi/stats``: the memory budget and every tenant's batching figures."""

    memory_budget: MemoryBudgetStats
    tenants: list[TenantStats]
    requests: RequestCounters = RequestCounters()


class BlockProfile(_Schema):
    """One block of a manifest, as the control plane shows it."""

    name: str
    hash: str
    size: int
    input_shape: list[int]
    output_shape: list[int]
    dtype: str
    params: int
    output_bytes: int
    peak_activation_bytes: int
    cpu_ms: float
    zeros: float | None = None
    """The share of the output's values that are zero on the export's photos; ``None``
    where the manifest predates that count."""


Source = Literal["measured", "calibrated", "manifest"]
"""Where a storage-side figure comes from: timed on real traffic, timed on a start-up or
first-use calibration run, or the manifest's export-time profile (nothing measured)."""


class Figure(_Schema):
    """One storage-side time, milliseconds per sample, with where it came from.

    ``samples`` is how many samples it was measured on (0 for the manifest's), ``age_s``
    the seconds since it was last updated (``None`` for the manifest's).
    """

    ms: float
    source: Source
    samples: int = 0
    age_s: float | None = None


class BlockTime(Figure):
    """The inference time of one block (its session run alone: no decode, queueing or
    HTTP), on ``device``, for storage batches of up to ``batch`` samples (powers of two;
    0 in the all-batches figure and in the manifest's). ``clock`` is ``cpu`` when the run's
    thread CPU time was taken (one intra-op thread on the CPU provider: immune to the core
    being shared), ``wall`` otherwise. A run of blocks ``[0, split)`` is timed as a whole;
    ``split_by`` says how its time was divided among the blocks: ``measured`` from real
    batches (onnxruntime's per-node profile on the CPU; on a GPU each block timed alone,
    per batch bucket), ``manifest`` by the export-time per-block times."""

    block: int
    device: str
    batch: int = 0
    clock: Literal["cpu", "wall"] = "cpu"
    split_by: Source = "manifest"


class StorageLoad(_Schema):
    """How much of a core the gateway got while its blocks ran on the CPU: process CPU
    time over wall time, at most 1 (source ``measured``). Before any block ran, what a
    short probe on one thread got (``probed``, one sample); 1 (``manifest``) when
    neither was measured."""

    available: float
    source: Literal["measured", "probed", "manifest"]
    samples: int = 0
    age_s: float | None = None


class StorageProfile(_Schema):
    """The storage side's own times for one model's frozen blocks.

    Args:
        blocks: One figure per frozen block ``[0, freeze)``, in order: measured over all
            batch sizes (weighted by samples) or, for a block never run, the manifest's.
        batches: The measured figures per block, device and batch-size bucket.
        decode: Decode and preprocess time per sample (thread CPU time); ``None`` until
            a sample was decoded (the manifest has no such figure).
        load: The share of a core the gateway got while its blocks ran.
    """

    blocks: list[BlockTime]
    batches: list[BlockTime] = []
    decode: Figure | None
    load: StorageLoad


class ModelSummary(_Schema):
    """One entry of ``GET /_hapi/models``."""

    name: str
    version: int
    ref: str
    family: str
    freeze: int
    blocks: int
    bytes: int
    parent: str | None
    created: str


class ModelProfile(_Schema):
    """``GET /_hapi/models/{name}``: the manifest's figures, the storage side's measured
    profile, and the tenants serving it."""

    name: str
    version: int
    ref: str
    family: str
    freeze: int
    bytes: int
    parent: str | None
    created: str
    blocks: list[BlockProfile]
    preprocess: dict[str, Any]
    served: list[TenantStats]
    storage: StorageProfile
