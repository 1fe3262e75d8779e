"""Bounds per identity: what one key may hold at once, so that no key starves the others.

The request rate (``identity_requests_per_s``) is metered in pushdown; these count work in
progress: pass-through requests at the store (of the shared upstream pool) and pushdown
requests being served. Going over answers 503 ``SlowDown`` with ``Retry-After`` at once; it
never waits, so it never holds up another identity.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ._errors import SlowDown
from ._metrics import Metrics


class InFlight:
    """How much of one kind of work each identity has in progress, against a bound.

    Args:
        limit: The most one identity may have at once (0: no bound).
        bound: Its name in ``/metrics`` (``hapi_identity_limited_total{bound=...}``).
        setting: The variable that sets it, named in the refusal.
        metrics: Where refusals are counted.
    """

    def __init__(
        self, limit: int, *, bound: str, setting: str, metrics: Metrics | None = None
    ) -> None:
        self._limit = limit
        self._bound = bound
        self._setting = setting
        self._metrics = metrics
        self._counts: dict[str, int] = {}

    def in_progress(self, identity: str) -> int:
        return self._counts.get(identity, 0)

    @contextlib.contextmanager
    def hold(self, identity: str) -> Iterator[None]:
        """Count one piece of ``identity``'s work for the duration of the block.

        Raises:
            SlowDown: The identity already has its bound's worth in progress.
        """
        count = self._counts.get(identity, 0)
        if self._limit and count >= self._limit:
            if self._metrics is not None:
                self._metrics.identity_limited.labels(identity, self._bound).inc()
            raise SlowDown(
                f"{identity} already has {count} {self._bound} requests in progress, the most "
                f"one identity may ({self._setting}); retry shortly.",
                retry_after=1,
            )
        self._counts[identity] = count + 1
        try:
            yield
        finally:
            left = self._counts[identity] - 1
            if left:
                self._counts[identity] = left
            else:
                del self._counts[identity]
