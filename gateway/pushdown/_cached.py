"""Pushdown through the feature cache: look objects up before fetching them, serve the
cached rows in place, and write each computed object's rows as one entry.

A request's samples are listed in key order before anything runs; a cached object
contributes :class:`CachedSample` rows (no fetch, no decode, no inference), the others
the samples listing found. As windows complete, :class:`EntryWriter` gathers each
computed object's rows and queues its entry once the object is complete; an object whose
features would exceed the entry cap is not written (its rows are never held for it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hapi.models import Manifest
from hapi.protocol import ObjectIdentity

from .._store import StoreClient
from ._cache import Cached, FeatureCache, encode_entry

MAX_ENTRY_BYTES = 64 * 1024**2  # an object's features bigger than this are not cached


@dataclass(frozen=True)
class CachedSample:
    """One sample whose features came from the cache."""

    key: str
    row: np.ndarray
    label: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    view: dict[str, Any] | None = None  # the augmented view's parameters, as reported


async def lookup_all(
    cache: FeatureCache,
    caller: StoreClient,
    bucket: str,
    keys: Sequence[str],
    manifest: Manifest,
    split: int,
    dtype: str,
    mode: str,
    view: Mapping[str, Any] | None = None,
) -> dict[str, Cached]:
    """The cached entries of ``keys`` (of an augmented ``view``'s, when given; none when
    ``mode`` is ``refresh``); the objects'
    identities come from HEADs sent as the caller (``caller``: the store client acting as
    its identity), so an entry is served only to a caller the store lets read the object.
    In a cold context only some keys are looked up (:meth:`FeatureCache.worth_asking`)."""
    if mode != "use":
        return {}
    asked = cache.worth_asking(bucket, keys, manifest, split, dtype, view)

    async def one(key: str) -> Cached | None:
        identity = await cache.identify(caller, bucket, key)
        if identity is None:
            return None
        return await cache.lookup(identity, manifest, split, dtype, view)

    found = await asyncio.gather(*(one(key) for key in asked))
    return {key: hit for key, hit in zip(asked, found, strict=True) if hit is not None}


def cached_samples(entry: Cached) -> list[CachedSample]:
    """An entry's rows as samples."""
    return [
        CachedSample(
            key=name,
            row=entry.features[index],
            label=None
            if entry.labels is None or int(entry.labels[index]) < 0
            else int(entry.labels[index]),
            meta=entry.samples_meta[index] if entry.samples_meta else {},
            view=entry.views[index] if entry.views else None,
        )
        for index, name in enumerate(entry.keys)
    ]


def merge_rows(
    window: Sequence[Any], computed: np.ndarray, row_shape: tuple[int, ...]
) -> np.ndarray:
    """A window's rows in order: cached rows in place, ``computed`` for the others."""
    if not any(isinstance(s, CachedSample) for s in window):
        return computed
    rows = np.empty((len(window), *row_shape), np.float32)
    taken = 0
    for index, sample in enumerate(window):
        if isinstance(sample, CachedSample):
            rows[index] = sample.row
        else:
            rows[index] = computed[taken]
            taken += 1
    return rows


class EntryWriter:
    """Gathers computed rows per object and queues an entry when an object is complete.

    Args:
        cache: Where entries go.
        manifest: The model.
        split: The split the rows come from.
        dtype: The wire dtype of the entry (and of the answer).
        owners: The object key of every sample of the answer, in order (``None`` for a
            cached sample).
        identities: The fetched objects' identities (from their GET's headers).
        caller: The identity whose request computed the rows (its cache-write share).
        row_bytes: Bytes of one float32 row.
        view: The augmented view the rows are of (its part of the cache key).
    """

    def __init__(
        self,
        cache: FeatureCache,
        manifest: Manifest,
        split: int,
        dtype: str,
        owners: Sequence[str | None],
        identities: Mapping[str, ObjectIdentity],
        row_bytes: int,
        *,
        caller: str = "",
        view: Mapping[str, Any] | None = None,
    ) -> None:
        self._cache, self._manifest, self._split, self._dtype = cache, manifest, split, dtype
        self._caller = caller
        self._view = view
        self._owners = owners
        self._identities = identities
        counts: dict[str, int] = {}
        for owner in owners:
            if owner is not None:
                counts[owner] = counts.get(owner, 0) + 1
        self._expected = {
            key: n
            for key, n in counts.items()
            if key in identities and n * row_bytes <= MAX_ENTRY_BYTES
        }
        self._rows: dict[str, list[np.ndarray]] = {}
        self._samples: dict[str, list[Any]] = {}
        self._next = 0

    def add(self, window: Sequence[Any], rows: np.ndarray) -> None:
        """Take a window's rows (in answer order)."""
        for index, sample in enumerate(window):
            owner = self._owners[self._next + index]
            if owner is None or owner not in self._expected:
                continue
            self._rows.setdefault(owner, []).append(np.array(rows[index]))
            self._samples.setdefault(owner, []).append(sample)
            if len(self._rows[owner]) == self._expected[owner]:
                self._write(owner)
        self._next += len(window)

    def _write(self, owner: str) -> None:
        rows, samples = self._rows.pop(owner), self._samples.pop(owner)
        labels = (
            np.array([-1 if s.label is None else s.label for s in samples], np.int64)
            if any(s.label is not None for s in samples)
            else None
        )
        meta = [s.meta for s in samples] if any(s.meta for s in samples) else None
        views = [view_dict(s) or {} for s in samples] if self._view is not None else None
        keys = [s.key for s in samples]
        entry = encode_entry(np.stack(rows), self._dtype, labels, keys, meta, views)
        self._cache.store(
            self._identities[owner],
            self._manifest,
            self._split,
            self._dtype,
            entry,
            owner=self._caller,
            view=self._view,
        )


def view_dict(sample: Any) -> dict[str, Any] | None:
    """A sample's augmented view as reported (``None`` for the preset's centre crop)."""
    if isinstance(sample, CachedSample):
        return sample.view
    view = getattr(sample, "view", None)
    return None if view is None else dict(view.to_dict())
