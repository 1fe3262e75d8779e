"""hapi.planner: which split of a model makes an epoch fastest, and why.

Plan from a manifest's own profile::

    from hapi import planner, protocol
    from hapi import protocol
    profile = planner.profile_from_manifest(manifest, raw_bytes=110_000)
    chosen = planner.plan(manifest, profile, protocol.parse_bandwidth("100mbit"))
    print(chosen.explain())

Measure instead of assuming: :func:`measure_client_blocks`, :func:`measure_decode_ms` and
:func:`measure_request_ms` time the client side here, :func:`probe_bandwidth` and
:func:`fetch_gateway_profile` ask a running gateway. After a run, :func:`needs_replan`
says whether what was measured left the plan's assumptions by more than 25%, and a
:class:`Trial` times a pick against a candidate predicted within 5% of it.

The command line is ``hapi plan`` (:data:`hapi.planner._cli.plan`).
"""

from __future__ import annotations

from ._cost import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BYTE_MARGIN,
    DEFAULT_DATASET_SIZE,
    DEFAULT_MIN_GAIN,
    DEFAULT_REPLAN_THRESHOLD,
    DEFAULT_WINDOW,
    SHARED_BYTE_MARGIN,
    Candidate,
    Measurement,
    Plan,
    Profile,
    SplitKeeper,
    drift,
    gain_over,
    needs_replan,
    plan,
    replan,
)
from ._errors import InvalidInput, NoFeasibleSplit, PlannerError, ProbeError
from ._gateway import GatewayAuth, GatewayProfile, fetch_gateway_profile, probe_bandwidth
from ._host import same_host
from ._plot import plot_plan
from ._profile import (
    DEFAULT_DECODE_MS,
    DEFAULT_RAW_BYTES,
    measure_client_blocks,
    measure_decode_ms,
    measure_request_ms,
    profile_from_manifest,
)
from ._trial import NEAR_TIE, Trial, near_rival

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_BYTE_MARGIN",
    "DEFAULT_DATASET_SIZE",
    "DEFAULT_DECODE_MS",
    "DEFAULT_MIN_GAIN",
    "DEFAULT_RAW_BYTES",
    "DEFAULT_REPLAN_THRESHOLD",
    "DEFAULT_WINDOW",
    "NEAR_TIE",
    "SHARED_BYTE_MARGIN",
    "Candidate",
    "GatewayAuth",
    "GatewayProfile",
    "InvalidInput",
    "Measurement",
    "NoFeasibleSplit",
    "Plan",
    "PlannerError",
    "ProbeError",
    "Profile",
    "SplitKeeper",
    "Trial",
    "drift",
    "fetch_gateway_profile",
    "gain_over",
    "measure_client_blocks",
    "measure_decode_ms",
    "measure_request_ms",
    "near_rival",
    "needs_replan",
    "plan",
    "plot_plan",
    "probe_bandwidth",
    "profile_from_manifest",
    "replan",
    "same_host",
]
