"""The error tree of ``hapi.planner``.

::

    PlannerError                     base of everything raised here
    ├── InvalidInput (ValueError)    bad input: an unparsable bandwidth, a profile that
    │                                does not fit the manifest, a batch size below 1
    └── NoFeasibleSplit              every candidate exceeds a memory budget

Errors of ``hapi.models`` (no such model, a corrupt block) pass through unchanged, so the
CLI translates both trees at its one boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._candidate import Candidate


class PlannerError(Exception):
    """Base class of every error raised by ``hapi.planner``."""


class InvalidInput(PlannerError, ValueError):
    """The caller's input cannot be planned with (the message says how to fix it)."""


class NoFeasibleSplit(PlannerError):
    """No candidate, not even reading raw objects, fits both sides' memory budgets.

    Args:
        message: What does not fit.
        candidates: Every candidate evaluated, each with its reason for being infeasible.
    """

    def __init__(self, message: str, candidates: Sequence[Candidate]) -> None:
        super().__init__(message)
        self.candidates = tuple(candidates)
