"""``hapi bench``: the two-tier benchmark testbed.

The storage tier (the embedded SeaweedFS store and the hapi gateway) runs in a network
namespace joined to the client tier by a veth pair shaped with ``tc tbf``; each tier is
pinned to its own CPU core. For each model and bandwidth it measures the raw-object
baseline, every split (bounded by the link where it cannot win) and the planner's pick,
and reports speedup, planner regret, pipeline efficiency and bytes saved.

``bench`` is the click command; ``python -m hapi_bench`` runs it alone.
"""

from __future__ import annotations

from ._cli import bench

__all__ = ["bench"]
