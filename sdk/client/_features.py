"""What a gateway sends back for one object or a batch: :class:`Features`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import RequestError
from ._wire import WireSpan


@dataclass(frozen=True)
class Features:
    """What a gateway sent back for one object or a batch of objects.

    Args:
        features: ``float32`` array ``[N, ...]``: the output of blocks ``[0, split)`` for
            every sample (a shard contributes one row per sample), read-only.
        labels: ``int64`` array ``[N]`` (``-1`` where a sample has none), or ``None``.
        keys: The sample keys in row order: the object key, or ``key#member`` for a
            sample of a shard.
        errors: Per-object failures of a batch, by key.
        model: ``NAME@VERSION`` the gateway used.
        split: The split the gateway ran.
        dtype: The wire dtype (features are widened to float32 on arrival).
        nbytes: Bytes of the response body as it crossed the wire (encoded, when it was).
        server_timing: The gateway's ``Server-Timing`` entries, in milliseconds.
        endpoint: The endpoint that answered.
        cache: The gateway's feature cache answer: ``hit``, ``miss`` or ``bypass``.
        views: With ``augment=``, each row's view as the gateway drew it: ``{"view",
            "box": [top, left, height, width] or None, "flip", "jitter": [[name,
            factor], ...]}`` (torchvision's parameters); ``None`` without.
        wire: When the body was on the wire, as the client received it: one span per
            response (a batch sent in parts has one per part); empty where not timed.
    """

    features: np.ndarray
    labels: np.ndarray | None
    keys: tuple[str, ...]
    errors: Mapping[str, RequestError] = field(default_factory=dict)
    model: str = ""
    split: int = 0
    dtype: str = "float32"
    nbytes: int = 0
    server_timing: Mapping[str, float] = field(default_factory=dict)
    endpoint: str = ""
    cache: str = ""
    views: tuple[dict[str, Any], ...] | None = None
    wire: tuple[WireSpan, ...] = ()

    def raise_for_errors(self) -> None:
        """Raise the first per-object error of a batch, if any."""
        for error in self.errors.values():
            raise error
