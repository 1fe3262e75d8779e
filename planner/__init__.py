"""hapi.planner: which split of a model makes an epoch fastest, and why.

Plan from a manifest's own profile::

    from hapi import planner, protocol
    profile = planner.profile_from_manifest(manifest, raw_bytes=110_000)
    chosen = planner.plan(manifest, profile, protocol.parse_bandwidth("100mbit"))
    print(chosen.explain())

Measure instead of assuming: :func:`measure_client_blocks`, :func:`measure_decode_ms` and
:func:`measure_request_ms` time the client side here; :func:`gateway_view` turns what a
running gateway says (the SDK asks it) into a :class:`GatewayProfile` that prices a profile. After a run, :func:`needs_replan`
says whether what was measured left the plan's assumptions by more than 25%, and a
:class:`Trial` times a pick against a candidate predicted within 5% of it.

The planner does no I/O of its own beyond timing local runs: it takes figures and returns
plans. ``hapi plan`` (in :mod:`hapi.sdk`, which reads the registry and asks the gateway)
prints them with :func:`print_plan`.
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
from ._errors import InvalidInput, NoFeasibleSplit, PlannerError
from ._explain import print_plan
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
from ._view import GatewayProfile, gateway_view

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
    "GatewayProfile",
    "InvalidInput",
    "Measurement",
    "NoFeasibleSplit",
    "Plan",
    "PlannerError",
    "Profile",
    "SplitKeeper",
    "Trial",
    "drift",
    "gain_over",
    "gateway_view",
    "measure_client_blocks",
    "measure_decode_ms",
    "measure_request_ms",
    "near_rival",
    "needs_replan",
    "plan",
    "plot_plan",
    "print_plan",
    "profile_from_manifest",
    "replan",
]
