"""Choosing the split for ``split="auto"``, and re-planning as the job runs.

The planner decides (:func:`hapi.planner.plan`): it predicts each candidate's pipelined
epoch time from the manifest's per-block figures, the gateway's own measurements and the
bandwidth. Nothing is sent to learn that bandwidth before the first sample: a build reads
the gateway's view of the model (a few KiB of control plane) and starts from the best
figure there is without sending anything more (:class:`Bandwidth`: one remembered for the
endpoint by an earlier job, else an operator's hint, else, across machines, the arrival of
the one object the build reads anyway to time decoding here), or, with none, from the
split that sends the fewest bytes. The job's own responses then measure the link
(``_link``), and once that estimate is stable, :func:`learned` plans with it through the
same hysteresis as re-planning (a :class:`hapi.planner.SplitKeeper`). An explicit probe
(``bandwidth="probe"``) is opt-in and lasts about a second of the link. When the planner cannot decide (the
endpoint is not a hapi gateway; or the dataset freezes at another point than the manifest
the planner plans for), the policy is the one the manifest alone supports: send the fewest
bytes per sample, at the latest split among equals.

A gateway on this machine (loopback, or this host's own address) shares the training
loop's cores: the plan then models the two tiers' compute as taking turns, so on one box
pushdown is chosen for the bytes it saves, never for a speedup that cannot exist.

The client's own figures (its blocks, decoding one of the dataset's objects, the CPU a
request costs it) are measured here when the dataset is built (:func:`measure_client`),
not taken from the manifest, which recorded the exporting machine's.

After each full epoch, what was measured (bandwidth, the gateway's time per sample) is
compared with what the plan assumed; :func:`hapi.planner.needs_replan` decides whether
to plan again (a drift beyond 25%), and a :class:`hapi.planner.SplitKeeper` changes the
split only when the new one is predicted more than 10% faster for two epochs in a row.

Where another candidate is predicted within 5% of the pick, the profile cannot decide
between them: a :class:`hapi.planner.Trial` runs the rival for the second epoch and the
pick for the third, and keeps the faster (unless the first epoch's measurements already
make a third split clearly the best, when re-planning takes over).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from botocore.exceptions import BotoCoreError, ClientError

from hapi import planner, protocol
from hapi.models import Manifest, ModelError, Registry, RuntimeSettings, decode_object

from ..client._errors import ProbeError
from ..client._host import same_host
from ..client._probe import GatewayAuth, fetch_gateway_profile, probe_bandwidth
from ..client._wire import WireSpan, read_timed
from ._link import Bandwidth, LinkEstimate
from ._measure import measure_request_ms, run_client_blocks
from ._stats import EpochStats

logger = logging.getLogger("hapi.sdk")
PROBE_SECONDS = 1.0
"""How long an explicit probe (``bandwidth="probe"``) ties up the link."""


@dataclass(frozen=True)
class Basis:
    """What the planner needs besides a bandwidth: kept so that a figure measured later
    (the job's own responses) can be planned with.

    Args:
        profile: The model's profile here and on the gateway.
        batch_size: Objects per request.
        dataset_size: Samples per epoch.
    """

    profile: planner.Profile
    batch_size: int
    dataset_size: int

    def plan(self, manifest: Manifest, bandwidth_bps: float) -> planner.Plan:
        """The plan at ``bandwidth_bps``.

        Raises:
            planner.PlannerError: No split is feasible.
        """
        return planner.plan(
            manifest,
            self.profile,
            bandwidth_bps,
            batch_size=self.batch_size,
            dataset_size=self.dataset_size,
        )


@dataclass(frozen=True)
class SplitChoice:
    """The split a dataset uses, and why.

    Args:
        split: Blocks ``[0, split)`` run on the storage side; ``None`` means no pushdown
            (read raw objects and run every frozen block here).
        reason: One sentence for people.
        policy: ``given``, ``planner``, ``trial`` (a near tie timed, or its outcome),
            ``replanned``, ``resumed`` (the split a saved job was using) or
            ``fewest-bytes``.
        plan: The planner's plan, when it decided (``plan.explain()`` has the table).
        measured_bandwidth: Whether the job's own transfers may correct the plan's
            bandwidth (a remembered figure or a hint is a starting point, not a fact).
        keeper: The hysteresis that re-planning goes through (with the planner only).
        trial: The near tie being timed, when the plan has one (with the planner only).
        bandwidth_source: Where the plan's bandwidth came from: ``measured`` (the job's
            responses, or an explicit probe), ``remembered`` (an earlier job's, for this
            endpoint), ``hint`` (``bandwidth=`` or ``HAPI_BANDWIDTH``), ``sampled``
            (the body of the one object read to time this client, across machines), or
            ``default`` (none: the split sending the fewest bytes, until the link is
            measured).
        basis: What the planner needs besides a bandwidth, when the gateway answered:
            a figure measured later is planned with it (see :func:`learned`).
    """

    split: int | None
    reason: str
    policy: str
    plan: planner.Plan | None = None
    measured_bandwidth: bool = True
    keeper: planner.SplitKeeper | None = None
    trial: planner.Trial | None = None
    bandwidth_source: str = "default"
    basis: Basis | None = None


@dataclass(frozen=True)
class ClientTimes:
    """What the client side costs on this machine, measured on one of the dataset's
    objects (ms; ``block_ms``/``decode_ms`` ``None`` when not measured: on one machine
    the gateway's figures price the client's blocks and decoding)."""

    request_ms: float
    block_ms: tuple[float, ...] | None = None
    decode_ms: float | None = None
    wire: WireSpan | None = None
    """When the object read to time decoding arrived (too small to time: ``nbytes`` 0)."""
    zeros: tuple[float, ...] | None = None
    """Each frozen block's share of zero values in that object's features (measured with
    the blocks): what the ``zeros`` encoding leaves off the wire."""

    def bandwidth(self) -> Bandwidth | None:
        """The link as the object read here measured it (source ``sampled``): the live
        estimate's figure (:class:`LinkEstimate`) over that one body, if it was read and
        large enough to time."""
        if self.wire is None:
            return None
        link = LinkEstimate()
        link.add(self.wire.nbytes, (self.wire.start, self.wire.end))
        bits = link.bandwidth_bps()
        return None if bits is None else Bandwidth(bits, "sampled")

    def profile_args(self, encoding: str = "zeros") -> dict[str, Any]:
        """Keyword arguments of :func:`hapi.planner.profile_from_manifest`, for answers in
        ``encoding``."""
        found: dict[str, Any] = {"client_request_ms": self.request_ms}
        if self.zeros is not None and encoding == "zeros":
            found["zeros"] = self.zeros
        if self.block_ms is not None:
            found["client_ms"] = self.block_ms
        if self.decode_ms is not None:
            found["client_decode_ms"] = self.decode_ms
        return found


MEASURE_SAMPLES = 2
"""Samples per timed run when measuring the client's blocks: the whole timing took 1.4 s
for ResNet50 and 1.8 s for VGG11 on one core, once per dataset."""


def measure_client(
    s3: Any,
    registry: Registry,
    manifest: Manifest,
    bucket: str,
    key: str,
    runtime: RuntimeSettings,
    *,
    blocks: bool,
) -> ClientTimes:
    """Time a GET of ``s3://bucket/key`` (this process's CPU; a one-byte range, so that
    the timing moves next to nothing), and with ``blocks`` also decoding it and running
    each frozen block on it here, with ``runtime`` (the object and the frozen blocks are
    read for that: on another machine than the gateway only; the object's body is timed
    where it arrives, a first sample of the link).

    Raises:
        planner.PlannerError: The object could not be read, decoded or run.
    """
    try:
        request_ms = measure_request_ms(s3, bucket, key, runs=4, byte_range="bytes=0-0")
        if not blocks:
            return ClientTimes(request_ms)
        data, wire = read_timed(s3.get_object(Bucket=bucket, Key=key)["Body"])
        decode_s = math.inf
        for _ in range(3):  # the best of three: the first pays for lazy imports
            started = time.thread_time()
            samples = decode_object(data, manifest.preprocess, key=key)
            decode_s = min(decode_s, (time.thread_time() - started) / max(1, len(samples)))
        inputs = np.stack([sample.array for sample in samples[:MEASURE_SAMPLES]])
        block_ms, zeros = run_client_blocks(
            registry, manifest, batch_size=MEASURE_SAMPLES, runs=2, settings=runtime, inputs=inputs
        )
    except (ClientError, BotoCoreError, ModelError, ValueError) as exc:
        raise planner.PlannerError(f"cannot time s3://{bucket}/{key} here: {exc}") from exc
    return ClientTimes(request_ms, block_ms, 1000.0 * decode_s, wire, zeros)


def wire_bytes(manifest: Manifest, split: int, dtype: str) -> int:
    """Bytes of one sample's features at ``split`` on the wire in ``dtype``."""
    shape = manifest.input.shape if split == 0 else manifest.blocks[split - 1].output_shape
    return int(math.prod(shape)) * protocol.WIRE_ITEMSIZE[dtype]


def fewest_bytes(manifest: Manifest, freeze: int, dtype: str, why: str) -> SplitChoice:
    """The split in ``0..min(freeze, manifest.freeze)`` sending the fewest bytes."""
    last = min(freeze, manifest.freeze)
    split = min(range(last + 1), key=lambda k: (wire_bytes(manifest, k, dtype), -k))
    size = wire_bytes(manifest, split, dtype)
    where = "the input" if split == 0 else f"block {manifest.blocks[split - 1].name}"
    return SplitChoice(
        split,
        f"split {split} sends the fewest bytes per sample ({size:,} B, the output of {where}); "
        f"the planner was not used: {why}",
        "fewest-bytes",
    )


def parse_bandwidth(bandwidth: float | str | None) -> float | None:
    """Bits per second from ``1e8`` or ``"100mbit"`` (``None`` stays ``None``).

    Raises:
        ValueError: Not a positive bandwidth.
    """
    if bandwidth is None:
        return None
    value = protocol.parse_bandwidth(bandwidth) if isinstance(bandwidth, str) else bandwidth
    if not 0 < value < math.inf:
        raise ValueError(f"bandwidth must be positive and finite, not {bandwidth!r}")
    return float(value)


def choose_split(
    manifest: Manifest,
    freeze: int,
    dtype: str,
    *,
    endpoints: Sequence[str],
    bandwidth: Bandwidth | None,
    raw_bytes: float | None,
    dataset_size: int,
    batch_size: int,
    auth: GatewayAuth | None = None,
    measure: Callable[[bool], ClientTimes] | None = None,
    probe: bool = False,
    readers_in_turn: int | None = None,
    encoding: str = "zeros",
) -> SplitChoice:
    """Ask the planner for the split; fall back to :func:`fewest_bytes`.

    Args:
        manifest: The model.
        freeze: The dataset's freeze point.
        dtype: The wire dtype.
        endpoints: The gateways, to read the model's profile from: the first that
            answers (they share one registry and run the same blocks).
        bandwidth: The figure to start from (remembered or a hint); without one, and
            without ``probe``, the one ``measure`` took reading an object (when it read
            one large enough to time), else the split sending the fewest bytes, until the
            job's own responses measure the link.
        raw_bytes: Mean bytes of one raw object, when known.
        dataset_size: Samples per epoch.
        batch_size: Objects per request.
        auth: Signs the requests to the gateways' control plane (see :func:`gateway_auth`).
        measure: Times the client side here (see :func:`measure_client`), called with
            whether the blocks and decoding need timing (not on one machine); without
            it, or when it fails (said in the reason), the manifest's figures are used.
        probe: Measure the bandwidth now with the gateway's probe (about
            :data:`PROBE_SECONDS` of the link), in place of ``bandwidth``.
        readers_in_turn: Readers that each wait for a batch before computing on it
            (``hapi.planner.Profile.readers_in_turn``; ``None``: requests go ahead of
            the compute).
        encoding: The answers' encoding: with ``zeros``, a split is priced at the bytes
            left once the zero values ``measure`` saw are left out (the manifest's count
            on the export's photos where ``measure`` ran no blocks).
    """
    if freeze != manifest.freeze:
        return fewest_bytes(manifest, freeze, dtype, f"it plans for freeze {manifest.freeze}")
    if not endpoints:
        return fewest_bytes(manifest, freeze, dtype, "no gateway to ask")
    shared = all(same_host(endpoint) for endpoint in endpoints)
    view: planner.GatewayProfile | None = None
    try:
        view, bandwidth = _ask(endpoints, manifest, bandwidth, auth, probe=probe)
    except ProbeError as exc:  # not a hapi gateway, or one without the model
        if bandwidth is None:
            return fewest_bytes(manifest, freeze, dtype, str(exc))
    times, unmeasured = _measured(measure, blocks=not shared)
    client_figures = {} if times is None else times.profile_args(encoding)
    if encoding == "zeros":  # where nothing counted them here: the export's photos' zeros
        client_figures.setdefault("zeros", manifest.zeros)
    if bandwidth is None and times is not None:
        bandwidth = times.bandwidth()
    profile = planner.profile_from_manifest(
        manifest,
        wire_dtype=dtype,
        raw_bytes=raw_bytes or planner.DEFAULT_RAW_BYTES,
        shared_compute=shared,
        **client_figures,
    )
    profile = replace(profile, readers_in_turn=readers_in_turn)
    basis = Basis(profile if view is None else view.apply(profile), batch_size, dataset_size)
    if bandwidth is None:
        start = fewest_bytes(manifest, freeze, dtype, _UNMEASURED)
        return replace(start, reason=start.reason + unmeasured, basis=basis)
    try:
        plan = basis.plan(manifest, bandwidth.bits_per_second)
    except planner.PlannerError as exc:  # no feasible split
        return fewest_bytes(manifest, freeze, dtype, str(exc))
    return SplitChoice(
        plan.split,
        f"{plan.reason()} {_SOURCE_WORDS[bandwidth.source]}{unmeasured}",
        "planner",
        plan,
        True,
        planner.SplitKeeper(plan),
        planner.Trial.start(plan),
        bandwidth.source,
        basis,
    )


_UNMEASURED = (
    "no bandwidth is known for this gateway yet (none remembered, no hint), so the job "
    "starts here and the planner decides once its own responses have measured the link"
)
_SOURCE_WORDS = {
    "measured": "The bandwidth was measured now.",
    "remembered": "The bandwidth is an earlier job's, remembered for this gateway.",
    "hint": "The bandwidth is a hint (bandwidth= or HAPI_BANDWIDTH).",
    "sampled": (
        "The bandwidth was timed on the one object read to time this client, until the "
        "job's own responses measure the link."
    ),
}


def with_readers(choice: SplitChoice, readers: int) -> SplitChoice:
    """``choice`` planned from here on for ``readers`` readers in turn (the processes a
    map-style dataset's log has shown: its DataLoader workers, or the process itself)."""
    basis, plan = choice.basis, choice.plan
    if basis is None or basis.profile.readers_in_turn == readers:
        return choice
    basis = replace(basis, profile=replace(basis.profile, readers_in_turn=readers))
    if plan is not None:
        plan = replace(plan, profile=replace(plan.profile, readers_in_turn=readers))
    return replace(choice, basis=basis, plan=plan)


def learned(
    choice: SplitChoice,
    manifest: Manifest,
    bandwidth_bps: float,
    when: str,
    *,
    readers: int = 1,
) -> SplitChoice:
    """``choice`` once the job's own responses have measured the link at
    ``bandwidth_bps`` (``when`` says after what): the planner's proposal at that figure
    goes through the keeper's hysteresis, so the split changes only for a gain of more
    than 10% proposed twice in a row, and only when it repays the blocks each of
    ``readers`` processes would fetch. A choice the planner cannot revise (a given split,
    no gateway's view) is returned as it is."""
    basis = choice.basis
    if basis is None or not choice.measured_bandwidth:
        return choice
    try:
        proposed = basis.plan(manifest, bandwidth_bps)
    except planner.PlannerError as exc:
        logger.info("%s: no plan at the measured bandwidth: %s", manifest.ref, exc)
        return choice
    keeper = choice.keeper or planner.SplitKeeper(_started_at(proposed, choice.split))
    kept = keeper.update(proposed, readers=readers)
    measured = replace(choice, plan=kept, keeper=keeper, bandwidth_source="measured")
    if kept.split == choice.split:
        if choice.policy != "fewest-bytes":  # the reason stands: the split did not change
            return measured
        return replace(measured, reason=f"{kept.reason()} Measured {when}: {keeper.why}")
    return replace(
        measured,
        split=kept.split,
        policy="replanned",
        trial=None,
        reason=f"re-planned {when}: {keeper.why} {kept.reason()}",
    )


def _started_at(proposed: planner.Plan, split: int | None) -> planner.Plan:
    """``proposed`` as if it had kept ``split``, the split a job started at unmeasured."""
    if split == proposed.split:
        return proposed
    label = "none" if split is None else str(split)
    return replace(proposed, split=split, note=f"Started at split {label}, unmeasured.")


def _measured(
    measure: Callable[[bool], ClientTimes] | None, *, blocks: bool
) -> tuple[ClientTimes | None, str]:
    """The client's measured figures, and what the reason must add when they could not
    be measured (the manifest's figures are used then)."""
    if measure is None:
        return None, ""
    try:
        return measure(blocks), ""
    except planner.PlannerError as exc:
        logger.warning("planning with the manifest's client figures: %s", exc)
        return None, f" (client figures from the manifest: {exc})"


def _ask(
    endpoints: Sequence[str],
    manifest: Manifest,
    bandwidth: Bandwidth | None,
    auth: GatewayAuth | None,
    *,
    probe: bool,
) -> tuple[planner.GatewayProfile, Bandwidth | None]:
    """The gateway's view of the model from the first endpoint that answers, and the
    bandwidth: ``bandwidth`` as given, or probed there when ``probe``.

    Raises:
        ProbeError: No endpoint answered (the last one's error).
    """
    failure: ProbeError | None = None
    for endpoint in endpoints:
        try:
            view = fetch_gateway_profile(endpoint, manifest.ref, auth=auth)
            if not probe:
                return view, bandwidth
            bits = probe_bandwidth(endpoint, seconds=PROBE_SECONDS, auth=auth)
            return view, Bandwidth(bits, "measured")
        except ProbeError as exc:
            failure = exc
    assert failure is not None  # endpoints is not empty
    raise failure


def gateway_auth(s3: Any) -> GatewayAuth | None:
    """A signer for the gateways' control plane with the credentials and region of ``s3``
    (a boto3 client), so the planner's probes are signed like the client's S3 calls."""
    signer = getattr(s3, "_request_signer", None)  # botocore keeps no public handle on it
    credentials = getattr(signer, "_credentials", None)
    if credentials is None:
        return None
    return GatewayAuth(credentials, s3.meta.region_name or "us-east-1")


def replanned(
    choice: SplitChoice, manifest: Manifest, stats: EpochStats, *, readers: int = 1
) -> SplitChoice | None:
    """A new choice when an epoch's measurements call for another split and the gain
    persists (hysteresis), or a near tie's trial moves on; else ``None`` (the keeper
    remembers the pending proposal). A choice whose bandwidth was never measured (an
    epoch too short for the link estimate to settle) learns it from the epoch's figure.
    ``readers``: the processes reading for the job, each of which fetches the blocks a
    move makes it run."""
    trial = choice.trial
    if trial is not None and not trial.done and stats.samples:
        return _trial_step(choice, trial, manifest, stats, readers)
    bits = stats.bandwidth_bps if stats.mode == "pushdown" else None
    if choice.bandwidth_source != "measured" and choice.basis is not None and bits:
        new = learned(choice, manifest, bits, f"in epoch {stats.epoch}", readers=readers)
        return None if new is choice else new
    return _replanned(choice, manifest, stats, readers)


def with_trial(choice: SplitChoice, epochs: bool) -> SplitChoice:
    """``choice`` for a dataset that runs epochs (its reason then says how a near tie
    will be timed) or not (a map-style dataset, which cannot time it: of the two, the one
    that sends fewer bytes a sample is kept, untried).

    The profile cannot tell a near tie's two apart (they are predicted within
    :data:`hapi.planner.NEAR_TIE`), and a tie between raw objects and a split is where a
    prediction misses most (raw reads in DataLoader workers ran 10-30% slower than
    predicted in the head to head); the fewer bytes leave more of a shared link to the
    job's neighbours, and give the gateway's cache features to keep."""
    trial = choice.trial
    if trial is None:
        return choice
    if epochs:
        return replace(choice, reason=f"{choice.reason} {trial.why()}")
    untried = replace(choice, trial=None)
    plan, rival = choice.plan, trial.rival
    if plan is None or rival.bytes_per_sample >= plan.chosen.bytes_per_sample:
        return untried
    gap = rival.epoch_s / plan.chosen.epoch_s - 1.0
    kept = replace(plan, split=rival.split, note="")
    taken, pick = planner.split_label(rival.split), planner.split_label(plan.split)
    reason = (
        f"{plan.reason()} Split {taken} is predicted within {gap:.1%} of it and sends "
        f"{protocol.format_bytes(rival.bytes_per_sample)} a sample instead of "
        f"{protocol.format_bytes(plan.chosen.bytes_per_sample)}: a near tie a map-style "
        f"dataset cannot time, so it reads split {taken}, the fewer bytes, rather than "
        f"split {pick}."
    )
    return replace(
        untried, split=rival.split, reason=reason, plan=kept, keeper=planner.SplitKeeper(kept)
    )


def resumed_at(choice: SplitChoice, split: int | None) -> SplitChoice:
    """``choice`` continuing at ``split``, the split a saved job was using when its state
    was saved: the rest of the epoch is computed as the job would have computed it (and
    finds what it kept in the local cache, whose entries are the split's), whatever this
    build's own planning picked. Epochs re-plan from there as in any job; a near tie's
    trial, which times whole epochs from the pick, is off when the split moves."""
    if split == choice.split:
        return choice
    plan = choice.plan
    kept = None if plan is None else replace(plan, split=split, note="")
    planned = planner.split_label(choice.split)
    return replace(
        choice,
        split=split,
        reason=f"resumed at split {planner.split_label(split)}, the split the job was using "
        f"when its state was saved (this build planned split {planned}: {choice.reason})",
        policy="resumed",
        plan=kept,
        keeper=None if kept is None else planner.SplitKeeper(kept),
        trial=None,
    )


def _trial_step(
    choice: SplitChoice, trial: planner.Trial, manifest: Manifest, stats: EpochStats, readers: int
) -> SplitChoice:
    """The choice after one epoch of a trial: its next split, or the one it keeps. A
    first epoch that left the plan's assumptions so far that a third split is predicted
    clearly faster than the pick ends the trial: the tie no longer matters, and
    re-planning decides. So does an epoch that did not run the trial's split (the
    gateway failed and the dataset fell back to raw objects): it timed nothing."""
    if stats.split != trial.next_split():
        return replace(
            choice,
            trial=None,
            reason=f"{choice.reason} Epoch {stats.epoch} ran split {stats.split}, not the "
            f"trial's {trial.next_split()}, so the trial is off.",
        )
    if not trial.seconds_per_sample and _beyond_the_tie(choice, trial, manifest, stats):
        ended = replace(
            choice,
            trial=None,
            reason=f"{choice.reason} Epoch {stats.epoch} left the plan's assumptions so far "
            "that another split is predicted faster than both, so the trial is off and "
            "re-planning decides.",
        )
        return _replanned(ended, manifest, stats, readers) or ended
    trial.record(stats.split, stats.seconds, stats.samples)
    if not trial.done:
        reason = f"trial after epoch {stats.epoch}: {trial.why()}"
        return replace(choice, split=trial.next_split(), reason=reason, policy="trial")
    kept = trial.kept()
    return replace(
        choice,
        split=kept.split,
        reason=f"trial over after epoch {stats.epoch}: {trial.why()}",
        policy="trial",
        plan=kept,
        keeper=planner.SplitKeeper(kept),
    )


def _measurement(choice: SplitChoice, stats: EpochStats) -> planner.Measurement:
    return planner.Measurement(
        bandwidth_bps=stats.bandwidth_bps if choice.measured_bandwidth else None,
        storage_ms_per_sample=stats.storage_ms_per_sample,
    )


def _beyond_the_tie(
    choice: SplitChoice, trial: planner.Trial, manifest: Manifest, stats: EpochStats
) -> bool:
    """Whether a pushdown epoch's measurements left ``choice``'s plan by more than 25%
    and, planned again with them, a split other than the pick and its rival is predicted
    faster than the pick by more than a change needs (the keeper's minimum gain)."""
    plan, keeper = choice.plan, choice.keeper
    if plan is None or keeper is None or stats.mode != "pushdown":
        return False
    measured = _measurement(choice, stats)
    if not planner.needs_replan(plan, measured):
        return False
    proposed = planner.replan(manifest, plan, measured, min_gain=keeper.min_gain)
    return proposed.split not in trial.schedule


def _replanned(
    choice: SplitChoice, manifest: Manifest, stats: EpochStats, readers: int
) -> SplitChoice | None:
    plan, keeper = choice.plan, choice.keeper
    if plan is None or keeper is None or stats.mode != "pushdown" or not stats.samples:
        return None
    measured = _measurement(choice, stats)
    if not planner.needs_replan(plan, measured):
        keeper.update(plan)  # the plan holds: a pending change starts over
        return None
    proposed = planner.replan(manifest, plan, measured, min_gain=0.0)
    kept = keeper.update(proposed, readers=readers)
    if kept.split == choice.split:
        logger.info("%s after epoch %d: %s", manifest.ref, stats.epoch, keeper.why)
        return None
    reason = f"re-planned after epoch {stats.epoch}: {keeper.why} {kept.reason()}"
    source = "measured" if measured.bandwidth_bps else choice.bandwidth_source
    return replace(
        choice,
        split=kept.split,
        reason=reason,
        policy="replanned",
        plan=kept,
        keeper=keeper,
        trial=None,
        bandwidth_source=source,
    )
