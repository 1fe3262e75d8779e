"""The cost model: predicted epoch time of every candidate split, and the choice.

Candidates are *no pushdown* (``split=None``: raw objects cross the network, the client
decodes and runs blocks ``[0, freeze)``), split ``0`` (the storage side decodes and
preprocesses only) and every split ``1..freeze`` (the storage side also runs blocks
``[0, split)``). One training batch of ``B`` samples passes three stages, each a linear
cost per sample:

- storage: ``B * (decode + blocks [0, split)) * load / available``: decode and block
  times are the storage side's own (measured alone, with its device to itself);
  ``load`` >= 1 models time-sharing the device with other busy tenants of the gateway,
  and ``available`` <= 1 is the share of a core the gateway process measurably gets on
  its host (about 0.5 next to one CPU-bound process): a loaded host is modelled by its
  measured load, never by inflating the block times,
- transfer: ``B * bytes_per_sample * 8 / bandwidth``,
- client: ``B * ((decode if no pushdown) + blocks [split, freeze) + head step)``, plus
  the client's CPU for its requests: one GET per object without pushdown, one request
  per batch with it.

The stages overlap (the client requests batch ``i + 1`` before training on batch ``i``),
so an epoch of ``n`` batches takes ``fill + (n - 1) * cycle + drain``, where the first
batch fills the pipeline (storage + transfer) and the last drains it (client). On separate
machines the cycle is the slowest stage; when both tiers share one machine's cores
(``Profile.shared_compute``: a gateway on loopback) the two compute stages do not overlap,
so the cycle is ``max(storage + client, transfer)``. When ``r`` readers each request a
batch, wait for it and compute on it before the next (``Profile.readers_in_turn``: the
map-style dataset's DataLoader workers), no more than ``r`` batches are in the pipeline,
so the cycle is at least ``(storage + transfer + client) / r``: in the head to head
(2026-12-02, 2 workers) splits whose stages were near each other (ResNet18 split 4 at
100 Mbit/s: 623, 496 and 431 ms a batch) ran 1.5-1.9x the slowest stage a batch, and
lost to raw objects they were predicted to beat by 24%. A candidate is feasible when each
side's memory holds its blocks' weights plus its batch of activations.

:func:`plan` picks the feasible candidate with the least epoch time, with one guard: a
candidate that sends more bytes per sample than the raw objects is chosen only when it
beats the best candidate that does not by more than ``byte_margin`` (10%): extra bytes
cost the store's network and every other tenant, so they must buy a clear gain; from a
storage side shared with other work (``storage_load > 1``), ``r`` times the raw bytes
must beat it by ``r`` times the margin. The wire
dtype is a candidate dimension: the plan also prices float16 features and chooses them
only when the caller allows lower precision. :class:`SplitKeeper` adds hysteresis to
re-planning: a new split is taken only when its gain persists over a window of epochs.

Everything here is pure: measurements come in as a :class:`Profile` and a bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hapi.models import Manifest
from hapi.protocol import WIRE_ITEMSIZE, format_bytes

from ._candidate import Candidate, Stage, fastest, split_label
from ._errors import InvalidInput, NoFeasibleSplit
from ._plan import DEFAULT_BYTE_MARGIN, Plan, format_duration
from ._profile import Profile

DEFAULT_BATCH_SIZE = 32
DEFAULT_DATASET_SIZE = 1_281_167  # ImageNet-1k's training set
DEFAULT_REPLAN_THRESHOLD = 0.25
SHARED_BYTE_MARGIN = 0.25
"""The byte margin on one machine (``shared_compute``): loopback makes extra bytes look
free, and what the model leaves out there (the gateway's own work per object, on the same
cores) was measured at the size of a 10% margin: ``hapi demo`` in float32 predicted split
19 1.11x faster than the raw images, and its uncached epochs came out even."""
DEFAULT_MIN_GAIN = 0.10
DEFAULT_WINDOW = 2
LOWER_PRECISION = "float16"


def plan(
    manifest: Manifest,
    profile: Profile,
    bandwidth_bps: float,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dataset_size: int = DEFAULT_DATASET_SIZE,
    byte_margin: float = DEFAULT_BYTE_MARGIN,
    allow_lower_precision: bool = False,
    features_only: bool = False,
) -> Plan:
    """Predict every candidate's epoch time and choose the fastest feasible one.

    Args:
        manifest: The model (its freeze point and block names).
        profile: Times, sizes and memory budgets; one entry per frozen block.
        bandwidth_bps: Bits per second between client and gateway (``inf``: no limit).
        batch_size: Samples per training batch.
        dataset_size: Samples per epoch.
        byte_margin: A candidate sending more bytes than the raw objects is chosen only
            when it is faster than every candidate that does not by more than this
            fraction (at least :data:`SHARED_BYTE_MARGIN` on one machine).
        allow_lower_precision: Also consider float16 features (half the bytes of
            float32) and choose them when faster; otherwise they are only priced, for
            the explanation.
        features_only: Choose among splits only: the client asked for features (the
            gateway's ``split=auto``). Reading raw objects is still priced.

    Returns:
        The plan. Ties go to the candidate sending fewer bytes, then to the earlier split.

    Raises:
        InvalidInput: The profile does not cover the frozen blocks, or a size is below 1.
        NoFeasibleSplit: Not even reading raw objects fits the client's memory.
    """
    _check(manifest, profile, bandwidth_bps, batch_size, dataset_size)
    if byte_margin < 0:
        raise InvalidInput(f"byte margin must be >= 0, not {byte_margin}")
    if profile.shared_compute:
        byte_margin = max(byte_margin, SHARED_BYTE_MARGIN)
    sizes = (batch_size, dataset_size, byte_margin, features_only)
    main = _plan_in(manifest, profile, bandwidth_bps, *sizes)
    if WIRE_ITEMSIZE[profile.wire_dtype] <= WIRE_ITEMSIZE[LOWER_PRECISION]:
        return main
    low = _plan_in(manifest, profile.in_dtype(LOWER_PRECISION), bandwidth_bps, *sizes)
    if allow_lower_precision and low.chosen.epoch_s < main.chosen.epoch_s:
        return replace(low, alternative=main.chosen, alternative_dtype=main.dtype)
    return replace(main, alternative=low.chosen, alternative_dtype=low.dtype)


def _plan_in(
    manifest: Manifest,
    profile: Profile,
    bandwidth_bps: float,
    batch_size: int,
    dataset_size: int,
    byte_margin: float,
    features_only: bool,
) -> Plan:
    batches = math.ceil(dataset_size / batch_size)
    splits: list[int | None] = [None, *range(manifest.freeze + 1)]
    candidates = tuple(
        _candidate(profile, split, manifest.freeze, bandwidth_bps, batch_size, batches)
        for split in splits
    )
    feasible = [c for c in candidates if c.feasible and not (features_only and c.split is None)]
    if not feasible:
        beyond = "" if features_only else ", not even reading raw objects"
        raise NoFeasibleSplit(
            f"no split of {manifest.ref} fits the memory budgets{beyond}", candidates
        )
    load = profile.storage_load
    best, note = _guard_bytes(feasible, profile.raw_bytes, byte_margin, load=load)
    return Plan(
        model=manifest.ref,
        freeze=manifest.freeze,
        block_names=tuple(block.name for block in manifest.blocks[: manifest.freeze]),
        split=best.split,
        candidates=candidates,
        bandwidth_bps=float(bandwidth_bps),
        batch_size=batch_size,
        dataset_size=dataset_size,
        profile=profile,
        byte_margin=byte_margin,
        note=note,
    )


def _guard_bytes(
    feasible: list[Candidate], raw_bytes: float, margin: float, *, load: float = 1.0
) -> tuple[Candidate, str]:
    """The fastest candidate, unless it sends more than the raw objects for a small gain.

    With a ``load`` over 1 (``Profile.storage_load``: other jobs busy on the storage
    side, or a storage side measured slower than profiled), a
    candidate sending ``r`` times the raw objects' bytes must gain ``r`` times the margin,
    as a move must (:meth:`SplitKeeper._lean`): the price of a shared storage side is the
    model's least sure, and the more bytes, the less it held. In the head to head's
    loaded cells (2026-12-02, two runs) ResNet18's splits 3 and 4, sending 14-28x the raw
    bytes and predicted 12-48% faster than raw objects, ran at 0.58-0.82x the contender,
    their storage side about twice as slow as priced.
    """
    best = fastest(feasible)
    lean = [c for c in feasible if c.bytes_per_sample <= raw_bytes]
    if best.bytes_per_sample <= raw_bytes or not lean:
        return best, ""
    fallback = fastest(lean)

    def needed(candidate: Candidate) -> float:
        return margin * (candidate.bytes_per_sample / raw_bytes if load > 1.0 else 1.0)

    def gain(candidate: Candidate) -> float:
        return fallback.epoch_s / candidate.epoch_s - 1.0

    paying = [c for c in feasible if c.bytes_per_sample > raw_bytes and gain(c) > needed(c)]
    if paying:
        return fastest(paying), ""
    ratio = best.bytes_per_sample / raw_bytes
    if load > 1.0:
        rule = (
            f"from a storage side shared with other work (priced x{load:.2f}), more bytes "
            f"than raw must buy {margin:.0%} for each multiple: more than {needed(best):.0%}."
        )
    else:
        rule = f"more bytes than raw must buy more than {margin:.0%}."
    return fallback, (
        f"Split {split_label(best.split)} would be only {gain(best):.0%} faster but sends "
        f"{ratio:.1f}x more bytes than the raw objects; {rule}"
    )


def _check(
    manifest: Manifest, profile: Profile, bandwidth: float, batch_size: int, dataset_size: int
) -> None:
    if profile.blocks != manifest.freeze:
        raise InvalidInput(
            f"the profile covers {profile.blocks} blocks, but {manifest.ref} freezes "
            f"{manifest.freeze}: profile the frozen blocks [0, {manifest.freeze})"
        )
    if not bandwidth > 0:
        raise InvalidInput(f"bandwidth must be positive, not {bandwidth}")
    if batch_size < 1 or dataset_size < 1:
        raise InvalidInput("batch size and dataset size must be at least 1")


def _candidate(
    profile: Profile, split: int | None, freeze: int, bandwidth: float, batch: int, batches: int
) -> Candidate:
    start = 0 if split is None else split
    storage = 0.0
    if split is not None:
        storage = (profile.storage_decode_ms + sum(profile.storage_ms[:split])) * batch
        storage *= profile.storage_load
        if not profile.shared_compute:  # on one box the client's compute shares the cores
            storage /= profile.storage_available
    client_decode = profile.client_decode_ms if split is None else 0.0
    client = (client_decode + sum(profile.client_ms[start:]) + profile.head_ms) * batch
    client += profile.client_request_ms * (batch if split is None else 1)
    sent = profile.sent_at(split)
    transfer = 1000.0 * batch * sent * 8 / bandwidth
    stages: dict[Stage, float] = {"storage": storage, "transfer": transfer, "client": client}
    bottleneck = max(stages, key=lambda name: stages[name])
    cycle = stages[bottleneck]
    if profile.shared_compute:  # one machine's cores: the two compute stages take turns
        cycle = max(storage + client, transfer)
    readers = profile.readers_in_turn
    if readers is not None and (storage + transfer + client) / readers > cycle:
        cycle = (storage + transfer + client) / readers  # too few batches in flight
        bottleneck = "turns"
    storage_memory, client_memory = _memory(profile, split, freeze, batch)
    infeasible = _infeasible(profile, storage_memory, client_memory)
    epoch_ms = storage + transfer + client + (batches - 1) * cycle
    return Candidate(
        split=split,
        bytes_per_sample=sent,
        storage_ms=storage,
        transfer_ms=transfer,
        client_ms=client,
        bottleneck=bottleneck,
        epoch_s=math.inf if infeasible else epoch_ms / 1000.0,
        storage_memory_bytes=storage_memory,
        client_memory_bytes=client_memory,
        infeasible=infeasible,
        cycle_ms=cycle,
    )


def client_weight_bytes(profile: Profile, split: int | None) -> int:
    """Bytes of the blocks the client runs at ``split``: ``[split, freeze)``, every frozen
    block for ``None`` (raw objects). What a client holds there, and what a process
    starting there fetches from the registry (each DataLoader worker builds its own
    session), over the link its data crosses."""
    return sum(profile.weight_bytes[0 if split is None else split :])


def _memory(profile: Profile, split: int | None, freeze: int, batch: int) -> tuple[int, int]:
    """Bytes each side needs: weights of its blocks plus a batch of activations."""
    client_start = 0 if split is None else split
    client = client_weight_bytes(profile, split) + profile.head_memory_bytes
    client += batch * profile.activation_bytes(client_start, freeze)
    if split is None:
        return 0, client
    storage = sum(profile.weight_bytes[:split]) + profile.storage_batch * profile.activation_bytes(
        0, split
    )
    return storage, client


def _infeasible(profile: Profile, storage: int, client: int) -> str | None:
    problems = []
    if profile.storage_memory_bytes is not None and storage > profile.storage_memory_bytes:
        problems.append(
            f"storage needs {format_bytes(storage)} > {format_bytes(profile.storage_memory_bytes)}"
        )
    if profile.client_memory_bytes is not None and client > profile.client_memory_bytes:
        problems.append(
            f"client needs {format_bytes(client)} > {format_bytes(profile.client_memory_bytes)}"
        )
    return "; ".join(problems) or None


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What a run measured, to compare with what its plan assumed. ``None``: not measured.

    Args:
        bandwidth_bps: Bits per second the transfers achieved.
        storage_ms_per_sample: The storage stage per sample as the cost model defines it
            (decode and blocks ``[0, split)`` under the current load), e.g. the
            ``decode`` and ``infer`` durations of the gateway's ``Server-Timing`` header.
        client_ms_per_sample: The client stage per sample.
    """

    bandwidth_bps: float | None = None
    storage_ms_per_sample: float | None = None
    client_ms_per_sample: float | None = None


def drift(plan: Plan, measured: Measurement) -> dict[str, float]:
    """Relative drift of each measured quantity from the plan: ``measured / assumed - 1``.

    Keys are ``bandwidth``, ``storage`` and ``client``, for what was measured and is
    comparable: the storage stage only when the plan pushes down (a split), and only
    stages the plan predicts to take time.
    """
    chosen = plan.chosen
    assumed = {
        "bandwidth": plan.bandwidth_bps,
        "storage": chosen.storage_ms / plan.batch_size if plan.split is not None else 0.0,
        "client": chosen.client_ms / plan.batch_size,
    }
    observed = {
        "bandwidth": measured.bandwidth_bps,
        "storage": measured.storage_ms_per_sample,
        "client": measured.client_ms_per_sample,
    }
    return {
        name: value / assumed[name] - 1.0
        for name, value in observed.items()
        if value is not None and value > 0 and 0 < assumed[name] < math.inf
    }


def needs_replan(
    plan: Plan, measured: Measurement, threshold: float = DEFAULT_REPLAN_THRESHOLD
) -> bool:
    """Whether measured bandwidth or storage-side throughput left the plan's assumptions
    by more than ``threshold`` (0.25: more than 25% either way)."""
    changes = drift(plan, measured)
    return any(abs(changes.get(name, 0.0)) > threshold for name in ("bandwidth", "storage"))


def replan(
    manifest: Manifest,
    previous: Plan,
    measured: Measurement,
    *,
    min_gain: float = DEFAULT_MIN_GAIN,
) -> Plan:
    """Plan again with what a run measured: its bandwidth, and its storage-side time as a
    new load factor (the storage side's profile scaled by measured over predicted).

    The previous split is kept (the plan's ``note`` says so) unless the new best is
    predicted more than ``min_gain`` faster than keeping it.
    """
    profile = previous.profile
    changes = drift(previous, measured)
    if "storage" in changes:
        load = profile.storage_load * (1.0 + changes["storage"])
        profile = replace(profile, storage_load=load)
    bandwidth = measured.bandwidth_bps or previous.bandwidth_bps
    new = plan(
        manifest,
        profile,
        bandwidth,
        batch_size=previous.batch_size,
        dataset_size=previous.dataset_size,
        byte_margin=previous.byte_margin,
    )
    gain = gain_over(new, previous.split)
    if new.split == previous.split or gain > min_gain:
        return new
    return replace(
        new,
        split=previous.split,
        note=f"Kept split {split_label(previous.split)}: split {split_label(new.split)} would be "
        f"only {gain:.0%} faster (a change needs more than {min_gain:.0%}).",
    )


def gain_over(new: Plan, split: int | None) -> float:
    """How much faster ``new``'s choice is predicted to be than staying at ``split``
    (``inf`` when ``split`` no longer fits)."""
    kept = new.candidate(split)
    if not kept.feasible:
        return math.inf
    return kept.epoch_s / new.chosen.epoch_s - 1.0


class SplitKeeper:
    """Hysteresis for re-planning: the split changes only when a better one is predicted
    more than ``min_gain`` faster in ``window`` consecutive proposals (epochs), and only
    when ``window`` epochs of the time it saves repay the fetch of the client blocks it
    needs (:func:`client_weight_bytes`) over the link: on a 10 Mbit/s link,
    EfficientNet-Lite0's 13.4 MB of blocks took 11 s of an epoch for a move from split 19
    to raw objects predicted to save 0.5 s an epoch (the head to head, 2026-12-02).

    Args:
        initial: The plan in force.
        min_gain: The predicted gain a change needs (0.10: 10% faster).
        window: Consecutive proposals of the same better split needed to change.
    """

    def __init__(
        self, initial: Plan, *, min_gain: float = DEFAULT_MIN_GAIN, window: int = DEFAULT_WINDOW
    ) -> None:
        if window < 1 or min_gain < 0:
            raise InvalidInput("hysteresis needs window >= 1 and min_gain >= 0")
        self.current = initial
        self.min_gain = min_gain
        self.window = window
        self.why = initial.reason()
        self._pending: int | None = None
        self._count = 0

    def update(self, proposed: Plan, *, readers: int = 1) -> Plan:
        """Take one epoch's proposal; return the plan in force after it (``why`` says why).
        ``readers``: the processes reading for the job (DataLoader workers), each of which
        fetches the blocks a move makes it run, over the same link."""
        lean, heavy = self._lean(proposed)
        stays = lean.split == self.current.split  # then the heavy split is the whole why
        kept = self._decide(lean, readers)
        if heavy:
            self.why = heavy[0].upper() + heavy[1:] + ("" if stays else " " + self.why)
        return kept

    def _decide(self, proposed: Plan, readers: int) -> Plan:
        old = self.current.split
        if proposed.split == old:
            self.current, self._count, self._pending = proposed, 0, None
            self.why = f"split {split_label(old)} is still the best."
            return self.current
        gain = gain_over(proposed, old)
        if gain <= self.min_gain:
            self._count, self._pending = 0, None
            self.why = (
                f"kept split {split_label(old)}: split {split_label(proposed.split)} would be only "
                f"{gain:.0%} faster (a change needs more than {self.min_gain:.0%})."
            )
            return self.current
        unpaid = self._unpaid(proposed, old, max(1, readers))
        if unpaid is not None:
            self._count, self._pending = 0, None
            self.why = unpaid
            return self.current
        self._count = self._count + 1 if self._pending == proposed.split else 1
        self._pending = proposed.split
        if self._count < self.window:
            self.why = (
                f"split {split_label(proposed.split)} predicted {gain:.0%} faster "
                f"({self._count} of {self.window} epochs needed to change); kept split "
                f"{split_label(old)}."
            )
            return self.current
        self.why = (
            f"changed split {split_label(old)} -> {split_label(proposed.split)}: predicted "
            f"{gain:.0%} faster for {self._count} epochs in a row."
        )
        self.current, self._count, self._pending = proposed, 0, None
        return self.current

    def _lean(self, proposed: Plan) -> tuple[Plan, str]:
        """``proposed``, or, where it moves the job to a split sending ``r`` times the raw
        objects' bytes for a predicted gain of no more than ``r`` times the minimum over the
        best candidate sending no more than them, that candidate instead (and why).

        A first plan takes such a split on the byte rule's margin (:func:`plan`); a move
        asks more, since the job has a split that works, and the more bytes, the less the
        cost model's price of them held: on the head to head's unshaped cells
        (2026-12-02), moves to splits sending 10-28x the raw bytes, predicted 48-160%
        faster, ran at 0.46-1.01x the contender's speed, loaded and quiet."""
        raw = proposed.profile.raw_bytes
        chosen = proposed.chosen
        if proposed.split == self.current.split or chosen.bytes_per_sample <= raw:
            return proposed, ""
        lean = [c for c in proposed.candidates if c.feasible and c.bytes_per_sample <= raw]
        if not lean:
            return proposed, ""
        best = fastest(lean)
        ratio = chosen.bytes_per_sample / raw
        gain = best.epoch_s / chosen.epoch_s - 1.0
        if gain > self.min_gain * ratio:
            return proposed, ""
        why = (
            f"split {split_label(proposed.split)}, predicted {gain:.0%} faster than split "
            f"{split_label(best.split)}, sends {ratio:.0f}x the raw objects' bytes: a move "
            f"there must be predicted more than {self.min_gain * ratio:.0%} faster."
        )
        return replace(proposed, split=best.split), why

    def _unpaid(self, proposed: Plan, old: int | None, readers: int) -> str | None:
        """Why a change whose blocks, fetched by each of ``readers``, take longer to cross
        the link than ``window`` epochs of its saving repay is not made (``None``: it
        pays)."""
        blocks = client_weight_bytes(proposed.profile, proposed.split)
        fetch_bytes = readers * blocks
        kept = proposed.candidate(old)
        if fetch_bytes <= 0 or not kept.feasible:
            return None
        saved_s = self.window * (kept.epoch_s - proposed.chosen.epoch_s)
        fetch_s = fetch_bytes * 8 / proposed.bandwidth_bps
        if saved_s > fetch_s:
            return None
        each = f", for each of {readers} processes reading" if readers > 1 else ""
        return (
            f"kept split {split_label(old)}: split {split_label(proposed.split)} would save "
            f"{format_duration(saved_s)} over {self.window} epochs, less than the "
            f"{format_duration(fetch_s)} its blocks ({format_bytes(blocks)}{each}) take to "
            "fetch over the link."
        )


def speedup(plan: Plan, split: int | None) -> float:
    """No pushdown's epoch time over ``split``'s (``nan`` when either is infeasible)."""
    base, other = plan.candidate(None).epoch_s, plan.candidate(split).epoch_s
    return base / other if math.isfinite(base) and math.isfinite(other) and other > 0 else math.nan
