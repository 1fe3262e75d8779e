"""What a testbed run records: one run per (model, bandwidth, split), grouped in cells.

Pure values, JSON both ways, so the report math and the plots can be tested on
synthetic results without a testbed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

BASELINE = "baseline"
SDK_LOCAL = "sdk, no pushdown"


def split_label(split: int | None, loader: str = "raw") -> str:
    """``baseline`` (no pushdown, the raw loader), ``sdk, no pushdown`` or ``split K``."""
    if split is not None:
        return f"split {split}"
    return BASELINE if loader == "raw" else SDK_LOCAL


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """One epoch of one configuration, measured or bounded.

    Args:
        split: ``None`` for no pushdown (raw objects, every frozen block on the client).
        loader: ``raw`` (the baseline loader) or ``sdk`` (``hapi.sdk``'s dataset; with
            ``split=None`` its own local path).
        measured: ``False`` when the run was not made because the link alone could not
            carry its bytes in less than the bound factor times the best measured epoch;
            ``epoch_s`` is then that lower bound and the CPU figures are zero.
        epoch_s: Wall time of the epoch (after warm-up), or the lower bound.
        samples: Samples in the epoch.
        link_bytes: Bytes the client's end of the link received (frames, headers
            included); for a bound, the payload bytes.
        payload_bytes: Response bytes the client read (features, or objects).
        stall_s: Time the training loop waited for data.
        client_cpu_s: CPU time of the client process during the epoch.
        storage_cpu_s: CPU time of the storage tier (store and gateway) during the epoch.
        link_s: ``link_bytes`` at the shaped rate: the least time the link needs.
        predicted_s: The planner's predicted epoch time for this configuration.
        repeats: How many times it was measured (contenders ``--repeats`` times; the
            median counts, the faster of two).
        attempts_s: Every measured epoch time of the configuration, in order (the
            spread of the repeats).
        client_steal_s: Time the host's hypervisor held the client's core back while it
            had work (``steal`` in ``/proc/stat``) during the counted epoch.
        storage_steal_s: The same for the storage tier's core.
        batches: Requests (training batches) in the epoch, the pipeline's items;
            ``None`` where unknown (the efficiency then ignores fill and drain).
        storage_available: The share of its core the gateway measured it had while its
            blocks ran, as it served it after a pushdown run with a competitor on the
            storage core; ``None`` where not measured or quiet (the storage stage is then
            its CPU seconds alone: on a quiet core the gateway's shortfall is the store
            beside it, whose CPU seconds the tier's already count).
        link_frames: Frames the storage tier's end of the link sent through its shaping
            queue during the epoch; ``None`` where not recorded.
        link_dropped: Frames that queue dropped during the epoch (each one a
            retransmission, and a stalled GET the loader may wait on).
    """

    split: int | None
    loader: str = "sdk"
    measured: bool = True
    epoch_s: float
    samples: int
    link_bytes: int
    payload_bytes: int
    stall_s: float = 0.0
    client_cpu_s: float = 0.0
    storage_cpu_s: float = 0.0
    link_s: float = 0.0
    predicted_s: float | None = None
    repeats: int = 1
    attempts_s: tuple[float, ...] = ()
    client_steal_s: float = 0.0
    storage_steal_s: float = 0.0
    batches: int | None = None
    storage_available: float | None = None
    link_frames: int | None = None
    link_dropped: int | None = None

    @property
    def label(self) -> str:
        """``baseline``, ``sdk, no pushdown`` or ``split K``."""
        return split_label(self.split, self.loader)

    @property
    def key(self) -> tuple[int | None, str]:
        """What identifies the configuration within a cell."""
        return self.split, self.loader

    @property
    def samples_per_s(self) -> float:
        """Throughput of the epoch."""
        return self.samples / self.epoch_s if self.epoch_s > 0 else 0.0

    @property
    def bytes_per_sample(self) -> float:
        """Link bytes per sample."""
        return self.link_bytes / self.samples if self.samples else 0.0

    @property
    def storage_stage_s(self) -> float:
        """The storage tier's stage: its CPU seconds, over the share of its core the
        gateway measured it had where a competitor held the rest (a half-available core
        needs two seconds of wall time for one of CPU)."""
        share = self.storage_available
        if share is None or not 0.0 < share < 1.0:
            return self.storage_cpu_s
        return self.storage_cpu_s / share

    @property
    def stages_s(self) -> dict[str, float]:
        """Each stage's seconds: client CPU, storage (:attr:`storage_stage_s`) and the
        link at its rate."""
        return {"client": self.client_cpu_s, "storage": self.storage_stage_s, "link": self.link_s}

    @property
    def slowest_stage_s(self) -> float:
        """The busiest stage's seconds."""
        return max(self.stages_s.values())

    @property
    def bottleneck(self) -> str:
        """Which stage :attr:`slowest_stage_s` is."""
        stages = self.stages_s
        return max(stages, key=lambda name: stages[name])

    @property
    def pipeline_bound_s(self) -> float:
        """The least time a pipeline of these stages can take for the epoch's batches:
        the slowest stage for every batch, plus the other stages' share of one batch
        (the first batch crosses them before the slowest stage has work, the last one
        after it is done). The slowest stage alone where the batch count is unknown."""
        slowest = self.slowest_stage_s
        if not self.batches:
            return slowest
        return slowest + (sum(self.stages_s.values()) - slowest) / self.batches

    @property
    def efficiency(self) -> float | None:
        """Epoch time over :attr:`pipeline_bound_s` (1.0 is a perfect pipeline: nothing
        waited but the fill and drain every pipeline has); ``None`` for a bound."""
        if not self.measured or self.slowest_stage_s <= 0:
            return None
        return self.epoch_s / self.pipeline_bound_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields plus the derived figures."""
        return {
            **asdict(self),
            "label": self.label,
            "samples_per_s": self.samples_per_s,
            "bytes_per_sample": self.bytes_per_sample,
            "bottleneck": self.bottleneck if self.measured else None,
            "efficiency": self.efficiency,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunResult:
        """The inverse of :meth:`to_dict` (derived figures are ignored)."""
        names = cls.__dataclass_fields__
        values = {k: v for k, v in data.items() if k in names}
        values["attempts_s"] = tuple(values.get("attempts_s", ()))
        return cls(**values)

    @property
    def steal_s(self) -> float:
        """The larger of the two cores' steal: what the host took from the pipeline."""
        return max(self.client_steal_s, self.storage_steal_s)


@dataclass(frozen=True, kw_only=True)
class CellResult:
    """Every run of one model at one bandwidth.

    Args:
        model: The model family (registered under that name).
        freeze: Blocks ``[0, freeze)`` are frozen; splits run ``0..freeze``.
        regime: ``network-bound``, ``balanced`` or ``compute-bound`` (for the baseline).
        ratio: Client compute rate over network rate for raw objects, as chosen.
        measured_ratio: The same with the probed bandwidth.
        bandwidth_bps: The shaped rate (``tc tbf``).
        probed_bps: What the planner's bandwidth probe measured.
        client_rate: Samples/s the client decodes and runs the frozen blocks at (measured).
        raw_bytes: Mean object bytes.
        batch_size: Training batch (and request) size.
        pick: The planner's split (``None``: no pushdown, run by the baseline loader).
        pick_reason: The planner's one-line reason.
        wire_bytes: Payload bytes per sample at each split ``0..freeze`` (from the manifest).
        runs: The baseline, the SDK's no-pushdown path, then the sweep (the pick is one
            of them).
        plan: The planner's plan as JSON (``Plan.to_dict()``: its profile, bandwidth and
            every candidate's predicted stages), for what-if analyses.
        profile: What re-planning the cell offline needs: client and storage per-block ms,
            decode ms on both sides, the storage figures as the gateway served them (with
            sources and ages), availability, bandwidth, bytes per split and raw bytes.
        trial: Where the plan had a near tie (``hapi.planner.Trial``), the trial as
            ``split="auto"`` runs it: ``rival``, the epochs it timed (``epochs_s``: the
            pick, the rival, the pick; kept apart from ``runs``, so the judge's epochs
            never decide it) and the split it ``kept``. ``None`` without a near tie.
    """

    model: str
    freeze: int
    regime: str
    ratio: float
    measured_ratio: float
    bandwidth_bps: float
    probed_bps: float
    client_rate: float
    raw_bytes: float
    batch_size: int
    pick: int | None
    pick_reason: str = ""
    wire_bytes: tuple[int, ...] = ()
    runs: tuple[RunResult, ...] = field(default_factory=tuple)
    plan: Mapping[str, Any] = field(default_factory=dict)
    profile: Mapping[str, Any] = field(default_factory=dict)
    trial: Mapping[str, Any] | None = None

    @property
    def kept(self) -> int | None:
        """The split ``split="auto"`` runs after its first epochs: the pick, or what a
        near tie's trial kept."""
        return self.pick if self.trial is None else self.trial["kept"]

    def run(self, split: int | None) -> RunResult | None:
        """The run of ``split`` (``None``: the baseline loader), if made or bounded."""
        loader = "raw" if split is None else "sdk"
        return next((r for r in self.runs if r.key == (split, loader)), None)

    @property
    def sdk_local(self) -> RunResult | None:
        """The SDK's own no-pushdown run, if measured."""
        return next((r for r in self.runs if r.key == (None, "sdk") and r.measured), None)

    @property
    def samples(self) -> int:
        """Samples per epoch."""
        return self.runs[0].samples if self.runs else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        data = asdict(self)
        data["runs"] = [run.to_dict() for run in self.runs]
        data["wire_bytes"] = list(self.wire_bytes)
        data["plan"] = dict(self.plan)
        data["profile"] = dict(self.profile)
        data["trial"] = None if self.trial is None else dict(self.trial)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellResult:
        """The inverse of :meth:`to_dict`."""
        names = cls.__dataclass_fields__
        values = {k: v for k, v in data.items() if k in names}
        runs = [RunResult.from_dict(r) for r in data.get("runs", ())]
        batch = values.get("batch_size")
        if batch:  # recordings from before runs counted their batches
            runs = [
                run if run.batches else replace(run, batches=math.ceil(run.samples / batch))
                for run in runs
            ]
        values["runs"] = tuple(runs)
        values["wire_bytes"] = tuple(data.get("wire_bytes", ()))
        return cls(**values)


def finite(value: float | None) -> float | None:
    """``value`` unless it is ``None``, infinite or NaN (JSON has no infinity)."""
    return value if value is not None and math.isfinite(value) else None
