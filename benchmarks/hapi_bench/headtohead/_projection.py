"""Past this machine, on paper: epoch time for N clients sharing one storage node.

The model is a pipeline bound. An epoch of ``S`` samples, read by ``N`` clients that each
take ``S / N`` of them, passes three stages that work at once (requests are prefetched):

- **the clients**: each runs its share at ``client_s`` seconds per sample on one core
  (decoding and the blocks it keeps), so this stage takes ``S / N * client_s``;
- **the link** into the storage node, shared by all clients: ``S * link_bytes * 8 / B``;
- **the storage node**: ``serve_s`` per sample of CPU to serve a request (store, proxy)
  on its ``cores``, plus ``compute_s`` of decoding and frozen blocks, which on a CPU node
  runs on the same cores and on a GPU node runs on the device at the lesser of its decode
  and blocks rates (a pipeline of two engines: nvJPEG/DALI and the SMs).

The epoch takes as long as its slowest stage, ``max(client, link, storage)``, plus the
pipeline's fill when it has few batches (the first batch passes every stage before the
slowest has work: ``n`` batches take ``(n - 1) / n`` of the slowest stage plus ``1 / n`` of
all three). Nothing else is charged (start-up, scheduling), and CPU seconds are charged as
wall seconds, so on cores shared with other work the model is optimistic by their share:
:func:`check` says how far it is from each cell the testbed measured.

A second job on the storage node (the testbed's loaded cells) takes a max-min fair share of
what it shares: it leaves ``capacity - min(its demand, capacity / 2)`` of the link and of
the storage node's cores to the job being projected.

Inputs are per-sample costs measured by the head-to-head run (:class:`PathCosts`) and, for
the GPU node, published throughputs stated as such (:data:`GPU_NODE`, REFERENCES.md:
"The physical limit of a GPU storage node"); ``make bench-device`` figures replace them
when a device is lent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

IMAGENET_TRAIN = 1_281_167
"""Samples in an ImageNet-1k training epoch: the projected dataset."""
BANDWIDTHS_BPS = (1e9, 10e9, 100e9)
CLIENTS = (1, 8, 64, 512)


@dataclass(frozen=True, kw_only=True)
class PathCosts:
    """What one way of reading costs per sample (measured on the testbed).

    Args:
        link_bytes: Bytes over the link per sample (headers and ACKs included).
        client_s: Client CPU seconds per sample, one core.
        serve_s: Storage CPU seconds per sample to serve it (store, pass-through, cache
            read): stays on the storage node's cores on a GPU node too.
        compute_s: Storage seconds per sample of decoding and frozen blocks on one CPU
            core (0 when the storage node only serves bytes).
    """

    link_bytes: float
    client_s: float
    serve_s: float
    compute_s: float = 0.0

    def __post_init__(self) -> None:
        if min(self.link_bytes, self.client_s, self.serve_s, self.compute_s) < 0:
            raise ValueError("per-sample costs must be >= 0")


@dataclass(frozen=True, kw_only=True)
class StorageNode:
    """A storage node.

    Args:
        name: For tables.
        cores: CPU cores that serve requests (and compute, on a CPU node).
        device_rate: Samples/s the device decodes and runs the frozen blocks at (the
            lesser of the two rates); ``None`` for a CPU-only node.
        source: Where ``device_rate`` comes from, for the report.
    """

    name: str
    cores: float
    device_rate: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.cores <= 0 or (self.device_rate is not None and self.device_rate <= 0):
            raise ValueError("cores and device_rate must be > 0")


DALI_DECODE_RATE = 19_000.0
"""DALI decode + random crop + resize on one Hopper GPU, the low end of NVIDIA's CI figure
(19,000-30,000 images/s; REFERENCES.md)."""
TENSORRT_RESNET50_RATE = 88_714.0
"""MLPerf Inference v4.0 closed, ResNet-50 offline on one H100, INT8 TensorRT (REFERENCES.md):
the whole network, so a lower bound for the frozen prefix of ResNet18 or EfficientNet-Lite0."""
CPU_NODE = StorageNode(name="CPU node, 32 cores", cores=32)
GPU_NODE = StorageNode(
    name="GPU node, 1 Hopper + 32 cores",
    cores=32,
    device_rate=min(DALI_DECODE_RATE, TENSORRT_RESNET50_RATE),
    source="DALI 19,000 img/s decode (NVIDIA CI), TensorRT 88,714/s ResNet-50 (MLPerf v4.0)",
)


def gpu_node_from_device(results: Mapping[str, Any], model: str) -> StorageNode:
    """The GPU node with a device run's measured rates for ``model`` in place of the
    published ones: ``make bench-device``'s ``bench-device.json`` or ``hapi-bench
    device-ceiling``'s ``bench-device-ceiling.json``, parsed. Blocks: the best batch's
    samples/s of the deepest split timed (every frozen block, so a lower bound for the
    prefix); decoding: the device's measured rate where the run timed one (the ceiling's
    nvJPEG figure at its best batch), else DALI's published one.

    Raises:
        KeyError: The results hold no such model.
    """
    rows = results["models"][model]["splits"]
    deepest = max(rows, key=lambda row: int(row["split"]))
    blocks = max(float(rate) for rate in deepest["samples_per_s"].values())
    measured = results.get("decode", {}).get("device", {})
    decode = max((float(rate) for rate in measured.values()), default=DALI_DECODE_RATE)
    decode_source = (
        f"decode {decode:,.0f} img/s measured ({results.get('runtime', 'nvJPEG')})"
        if measured
        else "DALI 19,000 img/s decode (NVIDIA CI)"
    )
    return StorageNode(
        name=f"GPU node, {results.get('device', 'device')} measured + 32 cores",
        cores=GPU_NODE.cores,
        device_rate=min(decode, blocks),
        source=f"{decode_source}, blocks {blocks:,.0f}/s (measured, split {deepest['split']})",
    )


@dataclass(frozen=True, kw_only=True)
class Background:
    """A second job on the storage node: what it asks of the link and of the cores when
    it runs alone (bits/s, cores busy)."""

    link_bps: float = 0.0
    storage_cores: float = 0.0


QUIET = Background()


@dataclass(frozen=True)
class Stages:
    """Seconds each stage needs for one epoch, which passes it in ``batches`` batches."""

    client_s: float
    link_s: float
    storage_s: float
    batches: int = 0

    @property
    def epoch_s(self) -> float:
        """The slowest stage; with ``batches``, plus the pipeline's fill: the first batch
        passes every other stage before the slowest has work, so ``n`` batches take
        ``(n - 1)`` of the slowest stage's batch times plus one batch through all three."""
        slowest = max(self.client_s, self.link_s, self.storage_s)
        if self.batches < 1:
            return slowest
        total = self.client_s + self.link_s + self.storage_s
        return slowest * (self.batches - 1) / self.batches + total / self.batches

    @property
    def bottleneck(self) -> str:
        """``client``, ``link`` or ``storage``."""
        named = {"client": self.client_s, "link": self.link_s, "storage": self.storage_s}
        return max(named, key=lambda name: named[name])


def _left(capacity: float, demand: float) -> float:
    """What a max-min fair share with one other job leaves of ``capacity``."""
    return capacity - min(demand, capacity / 2)


def stages(
    costs: PathCosts,
    node: StorageNode,
    *,
    clients: int,
    bandwidth_bps: float,
    samples: int = IMAGENET_TRAIN,
    background: Background = QUIET,
    batches: int = 0,
) -> Stages:
    """Each stage's seconds for an epoch of ``samples`` read by ``clients`` clients, in
    ``batches`` batches per client (0: so many that the pipeline's fill does not count).

    ``bandwidth_bps`` is the storage node's link, shared by every client (``math.inf``:
    the link is never the bottleneck).
    """
    if clients < 1 or samples < 1 or bandwidth_bps <= 0:
        raise ValueError("clients and samples must be >= 1, bandwidth > 0")
    link_bps = _left(bandwidth_bps, background.link_bps)
    link_s = 0.0 if math.isinf(link_bps) else samples * costs.link_bytes * 8 / link_bps
    cores = _left(node.cores, background.storage_cores)
    if node.device_rate is None:
        storage_s = samples * (costs.serve_s + costs.compute_s) / cores
    else:
        device_s = samples / node.device_rate if costs.compute_s > 0 else 0.0
        storage_s = max(samples * costs.serve_s / cores, device_s)
    return Stages(samples / clients * costs.client_s, link_s, storage_s, batches)


def epoch_s(
    costs: PathCosts,
    node: StorageNode,
    *,
    clients: int,
    bandwidth_bps: float,
    samples: int = IMAGENET_TRAIN,
    background: Background = QUIET,
    batches: int = 0,
) -> float:
    """The projected epoch time (seconds); see :func:`stages`."""
    return stages(
        costs,
        node,
        clients=clients,
        bandwidth_bps=bandwidth_bps,
        samples=samples,
        background=background,
        batches=batches,
    ).epoch_s


@dataclass(frozen=True)
class Projection:
    """One row of the projection table: one model, node, bandwidth and client count."""

    model: str
    node: str
    bandwidth_bps: float
    clients: int
    contender_s: float
    hapi_s: float
    hapi_warm_s: float | None
    bottlenecks: tuple[str, str]

    @property
    def speedup(self) -> float:
        """The contender's epoch time over hapi's (the planner's pick, cold)."""
        return self.contender_s / self.hapi_s


@dataclass(frozen=True)
class _Point:
    node: StorageNode
    clients: int
    bandwidth_bps: float
    samples: int

    def stages(self, costs: PathCosts) -> Stages:
        return stages(
            costs,
            self.node,
            clients=self.clients,
            bandwidth_bps=self.bandwidth_bps,
            samples=self.samples,
        )


def project(
    model: str,
    contender: PathCosts,
    hapi: Sequence[PathCosts],
    *,
    warm: PathCosts | None = None,
    nodes: Sequence[StorageNode] = (CPU_NODE, GPU_NODE),
    bandwidths: Sequence[float] = BANDWIDTHS_BPS,
    clients: Sequence[int] = CLIENTS,
    samples: int = IMAGENET_TRAIN,
) -> list[Projection]:
    """The projection table of one model.

    ``hapi`` holds the paths hapi can take (its pushdown split, and reading raw objects
    through the gateway): the planner takes the fastest, so hapi's time is their minimum.
    ``warm`` is the feature cache's path (second epoch onward), if measured.
    """
    if not hapi:
        raise ValueError("hapi needs at least one path")
    rows = []
    for node in nodes:
        for bandwidth in bandwidths:
            for count in clients:
                point = _Point(node, count, bandwidth, samples)
                them = point.stages(contender)
                ours = min((point.stages(path) for path in hapi), key=lambda s: s.epoch_s)
                rows.append(
                    Projection(
                        model=model,
                        node=node.name,
                        bandwidth_bps=bandwidth,
                        clients=count,
                        contender_s=them.epoch_s,
                        hapi_s=ours.epoch_s,
                        hapi_warm_s=None if warm is None else point.stages(warm).epoch_s,
                        bottlenecks=(them.bottleneck, ours.bottleneck),
                    )
                )
    return rows


@dataclass(frozen=True)
class Deviation:
    """The model against one measured epoch."""

    label: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        """``predicted / measured - 1``: negative where the model is optimistic."""
        return self.predicted_s / self.measured_s - 1


@dataclass(frozen=True, kw_only=True)
class MeasuredCell:
    """One measured configuration of one testbed cell, as the check reads it."""

    label: str
    costs: PathCosts
    samples: int
    bandwidth_bps: float | None  # None: unshaped
    epoch_s: float
    background: Background = QUIET
    batches: int = 0


TESTBED_NODE = StorageNode(name="the testbed's storage tier: one core", cores=1)


def check(cells: Sequence[MeasuredCell], node: StorageNode = TESTBED_NODE) -> list[Deviation]:
    """The model against every measured cell: one client, the cell's bandwidth and
    background, the testbed's one-core storage tier."""
    out = []
    for cell in cells:
        predicted = epoch_s(
            cell.costs,
            node,
            clients=1,
            bandwidth_bps=math.inf if cell.bandwidth_bps is None else cell.bandwidth_bps,
            samples=cell.samples,
            background=cell.background,
            batches=cell.batches,
        )
        out.append(Deviation(cell.label, cell.epoch_s, predicted))
    return out


def summary(deviations: Sequence[Deviation]) -> tuple[float, float]:
    """The median and the largest absolute relative error."""
    if not deviations:
        return math.nan, math.nan
    errors = sorted(abs(d.error) for d in deviations)
    middle = len(errors) // 2
    median = errors[middle] if len(errors) % 2 else (errors[middle - 1] + errors[middle]) / 2
    return median, errors[-1]
