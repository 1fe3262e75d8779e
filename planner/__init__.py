"""hapi.planner: which split of a model makes an epoch fastest, and why.

Plan from a manifest's own profile::

    from hapi import planner, protocol
    profile = planner.profile_from_manifest(manifest, raw_bytes=110_000)
    chosen = planner.plan(manifest, profile, protocol.parse_bandwidth("100mbit"))
    print(chosen.explain())

Measured figures replace the manifest's: the SDK times the client side
(:func:`hapi.sdk.measure_client_blocks`, ...), and :func:`gateway_view` turns what a
running gateway says (the SDK asks it) into a :class:`GatewayProfile` that prices a
profile. After a run, :func:`needs_replan`
says whether what was measured left the plan's assumptions by more than 25%, and a
:class:`Trial` times a pick against a candidate predicted within 5% of it.

The planner is pure: it takes figures and returns plans, explained as data
(:meth:`Plan.table`, :meth:`Plan.reason`, :meth:`Plan.explain`). It measures nothing and
prints nothing: ``hapi plan`` (in :mod:`hapi.sdk`, which reads the registry, asks the
gateway and times this machine) prints and plots them. Two import-linter contracts keep it
so.
"""

from __future__ import annotations

from ._candidate import Candidate, split_label
from ._cost import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_DATASET_SIZE,
    DEFAULT_MIN_GAIN,
    DEFAULT_REPLAN_THRESHOLD,
    DEFAULT_WINDOW,
    SHARED_BYTE_MARGIN,
    Measurement,
    SplitKeeper,
    drift,
    gain_over,
    needs_replan,
    plan,
    replan,
)
from ._errors import InvalidInput, NoFeasibleSplit, PlannerError
from ._plan import DEFAULT_BYTE_MARGIN, NEAR_TIE, Plan, format_duration, near_rival
from ._profile import DEFAULT_DECODE_MS, DEFAULT_RAW_BYTES, Profile, profile_from_manifest
from ._trial import Trial
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
    "format_duration",
    "gain_over",
    "gateway_view",
    "near_rival",
    "needs_replan",
    "plan",
    "profile_from_manifest",
    "replan",
    "split_label",
]


# Names that left the planner: it measures and prints nothing now. The planner may not
# import the SDK (the layer above it), so these are no aliases; the error says where each went.
_MOVED = {
    "measure_client_blocks": "hapi.sdk.measure_client_blocks",
    "measure_decode_ms": "hapi.sdk.measure_decode_ms",
    "measure_request_ms": "hapi.sdk.measure_request_ms",
    "print_plan": "`hapi plan` (hapi.sdk); the table as data: Plan.table()",
    "plot_plan": "`hapi plan --plot` (hapi.sdk)",
}


def __getattr__(name: str) -> object:
    if name in _MOVED:
        raise AttributeError(f"hapi.planner.{name} moved: use {_MOVED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
