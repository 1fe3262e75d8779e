"""`hapi plan` (in hapi.sdk) plans the same small real model the planner's tests use."""

from __future__ import annotations

from tests.planner.conftest import planned_model

__all__ = ["planned_model"]
