"""``hapi bench``: the two-tier benchmark testbed.

The storage tier (the embedded SeaweedFS store and the hapi gateway) runs in a network
namespace joined to the client tier by a veth pair shaped with ``tc tbf``; each tier is
pinned to its own CPU core. For each model and bandwidth it measures the raw-object
baseline, every split (bounded by the link where it cannot win) and the planner's pick,
and reports speedup, planner regret, pipeline efficiency and bytes saved.

Public names: ``bench``, the click command of the testbed (``hapi bench``, registered in
the ``hapi.commands`` entry points; ``python -m hapi_bench`` runs it alone), and ``main``,
the ``hapi-bench`` console script: ``hapi-bench testbed`` (the same command) and the
micro-benchmarks ``hapi-bench proxy``, ``pushdown``, ``device`` and ``load``
(``hapi-bench NAME --help`` for each one's options).
"""

from __future__ import annotations

from hapi_bench._cli import bench
from hapi_bench._commands import main

__all__ = ["bench", "main"]
