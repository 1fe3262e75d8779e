"""Choosing the split for ``split="auto"``, and re-planning after an epoch.

The planner decides (:func:`hapi.planner.plan`): it predicts each candidate's pipelined
epoch time from the manifest's per-block figures, the gateway's own measurements and the
bandwidth (given, or measured with the gateway's probe). When it cannot (the endpoint is
not a hapi gateway, so nothing can be probed; or the dataset freezes at another point
than the manifest the planner plans for), the policy is the one the manifest alone
supports: send the fewest bytes per sample, at the latest split among equals.

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

from ._errors import ProbeError
from ._host import same_host
from ._measure import measure_client_blocks, measure_request_ms
from ._probe import GatewayAuth, fetch_gateway_profile, probe_bandwidth
from ._stats import EpochStats

logger = logging.getLogger("hapi.sdk")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
PROBE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class SplitChoice:
    """The split a dataset uses, and why.

    Args:
        split: Blocks ``[0, split)`` run on the storage side; ``None`` means no pushdown
            (read raw objects and run every frozen block here).
        reason: One sentence for people.
        policy: ``given``, ``planner``, ``trial`` (a near tie timed, or its outcome),
            ``replanned`` or ``fewest-bytes``.
        plan: The planner's plan, when it decided (``plan.explain()`` has the table).
        measured_bandwidth: Whether the plan's bandwidth was measured (and so may be
            re-measured), rather than given.
        keeper: The hysteresis that re-planning goes through (with the planner only).
        trial: The near tie being timed, when the plan has one (with the planner only).
    """

    split: int | None
    reason: str
    policy: str
    plan: planner.Plan | None = None
    measured_bandwidth: bool = True
    keeper: planner.SplitKeeper | None = None
    trial: planner.Trial | None = None


@dataclass(frozen=True)
class ClientTimes:
    """What the client side costs on this machine, measured on one of the dataset's
    objects (ms; ``block_ms``/``decode_ms`` ``None`` when not measured: on one machine
    the gateway's figures price the client's blocks and decoding)."""

    request_ms: float
    block_ms: tuple[float, ...] | None = None
    decode_ms: float | None = None

    def profile_args(self) -> dict[str, Any]:
        """Keyword arguments of :func:`hapi.planner.profile_from_manifest`."""
        found: dict[str, Any] = {"client_request_ms": self.request_ms}
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
    """Time a GET of ``s3://bucket/key`` (this process's CPU), and with ``blocks`` also
    decoding it and running each frozen block on it here, with ``runtime``.

    Raises:
        planner.PlannerError: The object could not be read, decoded or run.
    """
    try:
        request_ms = measure_request_ms(s3, bucket, key, runs=4)
        if not blocks:
            return ClientTimes(request_ms)
        data = bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        decode_s = math.inf
        for _ in range(3):  # the best of three: the first pays for lazy imports
            started = time.thread_time()
            samples = decode_object(data, manifest.preprocess, key=key)
            decode_s = min(decode_s, (time.thread_time() - started) / max(1, len(samples)))
        inputs = np.stack([sample.array for sample in samples[:MEASURE_SAMPLES]])
        block_ms = measure_client_blocks(
            registry, manifest, batch_size=MEASURE_SAMPLES, runs=2, settings=runtime, inputs=inputs
        )
    except (ClientError, BotoCoreError, ModelError, ValueError) as exc:
        raise planner.PlannerError(f"cannot time s3://{bucket}/{key} here: {exc}") from exc
    return ClientTimes(request_ms, block_ms, 1000.0 * decode_s)


def wire_bytes(manifest: Manifest, split: int, dtype: str) -> int:
    """Bytes of one sample's features at ``split`` on the wire in ``dtype``."""
    shape = manifest.input.shape if split == 0 else manifest.blocks[split - 1].output_shape
    return int(math.prod(shape)) * _ITEMSIZE[dtype]


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
    bandwidth_bps: float | None,
    raw_bytes: float | None,
    dataset_size: int,
    batch_size: int,
    auth: GatewayAuth | None = None,
    measure: Callable[[bool], ClientTimes] | None = None,
) -> SplitChoice:
    """Ask the planner for the split; fall back to :func:`fewest_bytes`.

    Args:
        manifest: The model.
        freeze: The dataset's freeze point.
        dtype: The wire dtype.
        endpoints: The gateways, to probe and to read measurements from: the first that
            answers (they share one registry and run the same blocks).
        bandwidth_bps: The bandwidth to plan for; probed when ``None``.
        raw_bytes: Mean bytes of one raw object, when known.
        dataset_size: Samples per epoch.
        batch_size: Objects per request.
        auth: Signs the requests to the gateways' control plane (see :func:`gateway_auth`).
        measure: Times the client side here (see :func:`measure_client`), called with
            whether the blocks and decoding need timing (not on one machine); without
            it, or when it fails (said in the reason), the manifest's figures are used.
    """
    if freeze != manifest.freeze:
        return fewest_bytes(manifest, freeze, dtype, f"it plans for freeze {manifest.freeze}")
    if not endpoints:
        return fewest_bytes(manifest, freeze, dtype, "no endpoint to probe")
    given = bandwidth_bps is not None
    raw = raw_bytes or planner.DEFAULT_RAW_BYTES
    shared = all(same_host(endpoint) for endpoint in endpoints)
    view: planner.GatewayProfile | None = None
    try:
        view, bandwidth_bps = _probe(endpoints, manifest, bandwidth_bps, auth)
    except ProbeError as exc:  # not a hapi gateway, or one without the model
        if bandwidth_bps is None:
            return fewest_bytes(manifest, freeze, dtype, str(exc))
    times, unmeasured = _measured(measure, blocks=not shared)
    profile = planner.profile_from_manifest(
        manifest, wire_dtype=dtype, raw_bytes=raw, shared_compute=shared, **times
    )
    if view is not None:
        profile = view.apply(profile)
    try:
        plan = planner.plan(
            manifest, profile, bandwidth_bps, batch_size=batch_size, dataset_size=dataset_size
        )
    except planner.PlannerError as exc:  # no feasible split
        return fewest_bytes(manifest, freeze, dtype, str(exc))
    keeper = planner.SplitKeeper(plan)
    trial = planner.Trial.start(plan)
    return SplitChoice(
        plan.split, plan.reason() + unmeasured, "planner", plan, not given, keeper, trial
    )


def _measured(
    measure: Callable[[bool], ClientTimes] | None, *, blocks: bool
) -> tuple[dict[str, Any], str]:
    """The client's measured figures as profile arguments, and what the reason must add
    when they could not be measured (the manifest's figures are used then)."""
    if measure is None:
        return {}, ""
    try:
        return measure(blocks).profile_args(), ""
    except planner.PlannerError as exc:
        logger.warning("planning with the manifest's client figures: %s", exc)
        return {}, f" (client figures from the manifest: {exc})"


def _probe(
    endpoints: Sequence[str],
    manifest: Manifest,
    bandwidth_bps: float | None,
    auth: GatewayAuth | None,
) -> tuple[planner.GatewayProfile, float]:
    """The gateway's view of the model and the bandwidth, from the first endpoint that
    answers.

    Raises:
        ProbeError: No endpoint answered (the last one's error).
    """
    failure: ProbeError | None = None
    for endpoint in endpoints:
        try:
            view = fetch_gateway_profile(endpoint, manifest.ref, auth=auth)
            if bandwidth_bps is None:
                bits = probe_bandwidth(endpoint, bytes=PROBE_BYTES, auth=auth)
                return view, bits
            return view, bandwidth_bps
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


def replanned(choice: SplitChoice, manifest: Manifest, stats: EpochStats) -> SplitChoice | None:
    """A new choice when an epoch's measurements call for another split and the gain
    persists (hysteresis), or a near tie's trial moves on; else ``None`` (the keeper
    remembers the pending proposal)."""
    trial = choice.trial
    if trial is not None and not trial.done and stats.samples:
        return _trial_step(choice, trial, manifest, stats)
    return _replanned(choice, manifest, stats)


def with_trial(choice: SplitChoice, epochs: bool) -> SplitChoice:
    """``choice`` for a dataset that runs epochs (its reason then says how a near tie
    will be timed) or not (a map-style dataset: the plan's pick stands, untried)."""
    trial = choice.trial
    if trial is None:
        return choice
    if not epochs:
        return replace(choice, trial=None)
    return replace(choice, reason=f"{choice.reason} {trial.why()}")


def _trial_step(
    choice: SplitChoice, trial: planner.Trial, manifest: Manifest, stats: EpochStats
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
        return _replanned(ended, manifest, stats) or ended
    trial.record(stats.split, stats.seconds, stats.samples)
    if not trial.done:
        reason = f"trial after epoch {stats.epoch}: {trial.why()}"
        return replace(choice, split=trial.next_split(), reason=reason, policy="trial")
    kept = trial.kept()
    return SplitChoice(
        kept.split,
        f"trial over after epoch {stats.epoch}: {trial.why()}",
        "trial",
        kept,
        choice.measured_bandwidth,
        planner.SplitKeeper(kept),
        trial,
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


def _replanned(choice: SplitChoice, manifest: Manifest, stats: EpochStats) -> SplitChoice | None:
    plan, keeper = choice.plan, choice.keeper
    if plan is None or keeper is None or stats.mode != "pushdown" or not stats.samples:
        return None
    measured = _measurement(choice, stats)
    if not planner.needs_replan(plan, measured):
        keeper.update(plan)  # the plan holds: a pending change starts over
        return None
    proposed = planner.replan(manifest, plan, measured, min_gain=0.0)
    kept = keeper.update(proposed)
    if kept.split == choice.split:
        logger.info("%s after epoch %d: %s", manifest.ref, stats.epoch, keeper.why)
        return None
    reason = f"re-planned after epoch {stats.epoch}: {keeper.why} {kept.reason()}"
    return SplitChoice(kept.split, reason, "replanned", kept, choice.measured_bandwidth, keeper)
