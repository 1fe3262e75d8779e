"""A batch sent in parts (one per gateway beside its objects), answered as one.

:func:`merge` puts the parts' rows back in the order of the batch's keys, so a caller sees
exactly what one gateway would have sent for the whole batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ._errors import RequestError
from ._features import Features


def merge(keys: list[str], parts: list[list[str]], replies: list[Features]) -> Features:
    """The answers of a batch's parts as one answer, rows in the order of ``keys``."""
    rows: dict[str, tuple[Features, list[int]]] = {}
    for part, reply in zip(parts, replies, strict=True):
        for key, indices in rows_of(part, reply.keys).items():
            rows[key] = (reply, indices)
    order = [rows[key] for key in keys if key in rows]
    labelled = any(reply.labels is not None for reply in replies)
    features = np.concatenate([reply.features[i] for reply, i in order] or [replies[0].features])
    features.flags.writeable = False
    labels = None
    if labelled:
        labels = np.concatenate(
            [
                reply.labels[i] if reply.labels is not None else np.full(len(i), -1)
                for reply, i in order
            ]
            or [np.empty(0, dtype=np.int64)]
        ).astype(np.int64)
    timing: dict[str, float] = {}
    for reply in replies:
        for name, ms in reply.server_timing.items():
            timing[name] = max(ms, timing.get(name, 0.0))  # the parts ran side by side
    caches = {reply.cache for reply in replies}
    first = replies[0]
    return dataclasses.replace(
        first,
        features=features,
        labels=labels,
        keys=tuple(sample for reply, i in order for sample in (reply.keys[j] for j in i)),
        errors={k: v for reply in replies for k, v in reply.errors.items()},
        nbytes=sum(reply.nbytes for reply in replies),
        server_timing=timing,
        endpoint=",".join(dict.fromkeys(reply.endpoint for reply in replies)),
        cache="miss" if "miss" in caches else first.cache,
        wire=tuple(span for reply in replies for span in reply.wire),
        views=None
        if first.views is None
        else tuple(reply.views[j] for reply, i in order if reply.views is not None for j in i),
    )


def rows_of(requested: Sequence[str], samples: Sequence[str]) -> dict[str, list[int]]:
    """Each requested key's rows: its own, or its shard's ``key#member`` samples, in order."""
    rows: dict[str, list[int]] = {}
    for row, owner in enumerate(owners_of(requested, samples)):
        rows.setdefault(owner, []).append(row)
    return rows


def owners_of(requested: Sequence[str], samples: Sequence[str]) -> list[str]:
    """The object key of each sample key (``key`` itself, or ``key#member`` of a shard),
    samples coming in the order of the keys requested.

    Raises:
        RequestError: A sample of no requested key (``InvalidResponse``).
    """
    owners: list[str] = []
    position = 0
    for sample in samples:
        while position < len(requested) and not (
            sample == requested[position] or sample.startswith(requested[position] + "#")
        ):
            position += 1
        if position == len(requested):
            raise RequestError(
                "InvalidResponse",
                f"the gateway returned an unrequested sample {sample!r}",
                bucket="",
            )
        owners.append(requested[position])
    return owners
