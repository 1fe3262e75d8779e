"""Pushdown through the feature cache: split a computed batch per object, look objects
up, and put cached and computed features back together in key order."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import numpy as np

from hapi.models import Manifest, ObjectIdentity, Sample

from ._cache import Cached, FeatureCache, encode_entry


async def lookup_all(
    cache: FeatureCache,
    bucket: str,
    keys: Sequence[str],
    manifest: Manifest,
    split: int,
    dtype: str,
    mode: str,
    *,
    signed: bool = True,
) -> dict[str, Cached]:
    """The cached entries of ``keys`` (none when ``mode`` is ``refresh``); the objects'
    identities come from HEADs signed as the caller's GETs would be."""
    if mode != "use":
        return {}

    async def one(key: str) -> Cached | None:
        identity = await cache.identify(bucket, key, signed=signed)
        if identity is None:
            return None
        return await cache.lookup(identity, manifest, split, dtype)

    found = await asyncio.gather(*(one(key) for key in keys))
    return {key: hit for key, hit in zip(keys, found, strict=True) if hit is not None}


def per_key(
    keys: Sequence[str],
    features: np.ndarray,
    samples: Sequence[Sample],
    counts: Mapping[str, int],
) -> dict[str, Cached]:
    """Slice a computed result (samples in ``keys`` order; keys that failed have no
    count and no samples) into one part per object key."""
    parts: dict[str, Cached] = {}
    start = 0
    for key in keys:
        if key not in counts:
            continue
        count = counts[key]
        mine = samples[start : start + count]
        labels = (
            np.array([-1 if s.label is None else s.label for s in mine], dtype=np.int64)
            if any(s.label is not None for s in mine)
            else None
        )
        meta = [s.meta for s in mine] if any(s.meta for s in mine) else None
        rows = features[start : start + count]
        parts[key] = Cached(rows, labels, [s.key for s in mine], meta, 0)
        start += count
    return parts


def store_all(
    cache: FeatureCache,
    manifest: Manifest,
    split: int,
    dtype: str,
    parts: Mapping[str, Cached],
    identities: Mapping[str, ObjectIdentity],
) -> None:
    """Queue an entry per computed object whose fetched identity is known."""
    for key, part in parts.items():
        identity = identities.get(key)
        if identity is None:
            continue
        entry = encode_entry(part.features, dtype, part.labels, part.keys, part.samples_meta)
        cache.store(identity, manifest, split, dtype, entry)


def merge(
    keys: Sequence[str], parts: Mapping[str, Cached], empty_shape: tuple[int, ...]
) -> tuple[np.ndarray, list[Sample]]:
    """Features and samples of ``keys`` in order (keys without a part contribute none)."""
    arrays: list[np.ndarray] = []
    samples: list[Sample] = []
    nothing = np.zeros(0, np.float32)
    for key in keys:
        part = parts.get(key)
        if part is None:
            continue
        arrays.append(np.asarray(part.features, np.float32))
        for index, name in enumerate(part.keys):
            label = None if part.labels is None else int(part.labels[index])
            meta = part.samples_meta[index] if part.samples_meta else {}
            samples.append(
                Sample(key=name, array=nothing, label=None if label == -1 else label, meta=meta)
            )
    if not arrays:
        return np.zeros((0, *empty_shape), np.float32), samples
    return np.concatenate(arrays), samples
