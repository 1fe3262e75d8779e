"""hapi.cli: the ``hapi`` console script, ``hapi up``, ``hapi store`` and ``hapi demo``.

The top of the layering beside the benchmarks (``hapi_bench``, a distribution of their own):
it may import every package but the benchmarks, and nothing imports it. Each package
contributes its own subcommands as ``hapi.commands`` entry points (``serve``, ``models``,
``plan``; ``bench`` from hapi-bench where it is installed), so this package loads them by
name instead of importing them. ``hapi demo`` runs ``hapi.examples`` (the
repository's ``examples/``).
"""

from __future__ import annotations

from ._main import cli, main

__all__ = ["cli", "main"]
