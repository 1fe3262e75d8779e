"""The gateway's view of one model, as the planner uses it: figures in, a profile out.

The SDK reads a gateway's ``/_hapi/models/{name}`` and ``/_hapi/stats`` (typed by
:class:`hapi.protocol.ModelProfile` and :class:`hapi.protocol.GatewayStats`);
:func:`gateway_view` turns them into a :class:`GatewayProfile`, whose
:meth:`~GatewayProfile.apply` prices a :class:`~hapi.planner.Profile` with the storage
side's own measured times, memory budget and load. No HTTP here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hapi.protocol import Figure, GatewayStats, ModelProfile, StorageLoad, StorageProfile

from ._profile import Profile

BUSY_SHARE = 0.05  # a tenant running batches less of the time than this is idle


@dataclass(frozen=True, kw_only=True)
class GatewayProfile:
    """The gateway's view of one model.

    Args:
        model: ``NAME@VERSION`` the gateway resolved.
        cpu_ms: The manifest's per-block CPU ms per sample, frozen blocks.
        storage: The storage side's own figures as served: per block (measured, or the
            manifest's for a block never run), decode, and the host's availability, each
            with its source and age.
        memory_bytes: A new tenant's share of the memory budget: unused bytes divided
            among the active tenants and one more. ``None`` when unknown.
        busy_tenants: Tenants with work queued now or running lately, this model's
            included: a view is taken when a job plans, before it has sent anything, so
            whatever runs is another job's (another job of the same model shares the
            batches, and the storage side's throughput with them).
        busy_work: The device those tenants take, in devices: 1 for each tenant with
            work queued (it takes its turn at every batch), its busy share of the last
            seconds for one without a queue now (a job that sends its next request when
            its last is answered keeps the device busy with an empty queue). ``None``:
            each busy tenant counts 1.
    """

    model: str
    cpu_ms: tuple[float, ...]
    storage: StorageProfile
    memory_bytes: int | None
    busy_tenants: int
    busy_work: float | None = None

    @property
    def scale(self) -> float:
        """Measured over manifest time across the measured blocks (1 if none): how much
        faster or slower this storage side is than where the manifest was profiled."""
        measured = [b for b in self.storage.blocks if b.source != "manifest"]
        ms = sum(b.ms for b in measured)
        predicted = sum(self.cpu_ms[b.block] for b in measured if b.block < len(self.cpu_ms))
        return ms / predicted if ms > 0 and predicted > 0 else 1.0

    @property
    def storage_ms(self) -> tuple[float, ...]:
        """Per-block storage-side ms per sample: measured where the block ran, else the
        manifest's scaled by :attr:`scale`."""
        scale = self.scale
        figures = {b.block: b for b in self.storage.blocks}
        return tuple(
            figures[i].ms if i in figures and figures[i].source != "manifest" else ms * scale
            for i, ms in enumerate(self.cpu_ms)
        )

    @property
    def storage_load(self) -> float:
        """Factor for time-sharing the device with the other busy tenants' work."""
        return 1.0 + (self.busy_tenants if self.busy_work is None else self.busy_work)

    def origin(self) -> str:
        """Where the storage-side figures came from and how old they are, and what other
        jobs take of the device, in words."""
        origin = describe_storage(self.storage, self.scale)
        if not self.busy_tenants:
            return origin
        jobs = "job" if self.busy_tenants == 1 else "jobs"
        return (
            f"{origin} {self.busy_tenants} other {jobs} busy on the storage side: its "
            f"blocks priced x{self.storage_load:.2f} for sharing the device."
        )

    def apply(self, profile: Profile) -> Profile:
        """``profile`` with this view's storage-side times, decode, memory budget and load.

        With ``shared_compute`` (client and gateway on one machine) the client's blocks
        and decoding are priced by the same figures: they run on the same cores, and the
        gateway's are measured on real traffic.
        """
        decode = self.storage.decode
        storage_ms = self.storage_ms[: profile.blocks]
        decode_ms = decode.ms if decode is not None else profile.storage_decode_ms
        shared = profile.shared_compute
        return replace(
            profile,
            storage_ms=storage_ms,
            client_ms=storage_ms if shared else profile.client_ms,
            client_decode_ms=decode_ms if shared else profile.client_decode_ms,
            storage_decode_ms=decode_ms,
            storage_memory_bytes=self.memory_bytes or profile.storage_memory_bytes,
            storage_load=self.storage_load,
            storage_available=self.storage.load.available,
            storage_origin=self.origin(),
        )


def describe_storage(storage: StorageProfile, scale: float = 1.0) -> str:
    """One sentence on the sources and ages of a served storage profile."""
    measured = [b for b in storage.blocks if b.source != "manifest"]
    parts = []
    if measured:
        samples = min(b.samples for b in measured)
        parts.append(
            f"blocks {_ranges([b.block for b in measured])} {measured[0].source} on "
            f"{measured[0].device} (at least {samples} samples each, {_age(measured)})"
        )
    never = [b.block for b in storage.blocks if b.source == "manifest"]
    if never:
        how = f"x{scale:.2f} as measured blocks say" if measured else "unscaled: nothing ran"
        parts.append(f"blocks {_ranges(never)} from the manifest ({how})")
    decode = storage.decode
    parts.append(
        "decode not measured (the planner's default)"
        if decode is None
        else f"decode {decode.ms:.2f} ms {decode.source} ({decode.samples} samples, "
        f"{_age([decode])})"
    )
    load = storage.load
    parts.append(
        f"{load.available:.0%} of a core available ("
        + (f"{load.source}, {_age([load])})" if load.source != "manifest" else "assumed)")
    )
    return "Storage side: " + "; ".join(parts) + "."


def _age(figures: Sequence[Figure | StorageLoad]) -> str:
    ages = [f.age_s for f in figures if f.age_s is not None]
    return f"{max(ages):.0f} s old" if ages else "age unknown"


def _ranges(indices: Sequence[int]) -> str:
    spans: list[list[int]] = []
    for index in sorted(indices):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def gateway_view(model: ModelProfile, stats: GatewayStats) -> GatewayProfile:
    """The planner's view of ``model`` from the gateway's typed answers, for a job that
    has sent nothing yet (every busy tenant is another job's)."""
    work = [1.0 if t.queue_depth else t.busy_share for t in stats.tenants]
    budget = stats.memory_budget
    return GatewayProfile(
        model=model.ref,
        cpu_ms=tuple(block.cpu_ms for block in model.blocks[: model.freeze]),
        storage=model.storage,
        memory_bytes=budget.new_tenant_share() if budget.total_bytes else None,
        busy_tenants=sum(1 for w in work if w >= BUSY_SHARE),
        busy_work=sum(w for w in work if w >= BUSY_SHARE),
    )
