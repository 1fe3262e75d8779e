"""hapi.cli: the ``hapi`` console script, ``hapi up`` and ``hapi store``.

The top of the layering beside ``hapi.bench``: it may import every package but the bench,
and nothing imports it. Each package contributes its own subcommands as ``hapi.commands``
entry points (``serve``, ``models``, ``plan``, ``demo``, ``bench``), so this package loads
them by name instead of importing them.
"""

from __future__ import annotations

from ._main import cli, main

__all__ = ["cli", "main"]
