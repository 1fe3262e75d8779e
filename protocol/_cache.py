"""The feature cache's layout: what an entry is keyed by, where it lives, what it holds.

Frozen blocks give the same output for the same input, so features are cached by content.
An entry's key hashes everything the features are computed from:

- the object's identity: bucket, key, ETag (and version id when the store has one) and
  size, so an overwritten object misses;
- the preprocessing preset (every field of it);
- the content hashes of blocks ``[0, split)``: two models sharing a frozen prefix share
  entries, and a changed block misses;
- the wire dtype;
- for an augmented view (``x-hapi-augment`` with ``x-hapi-views``), the policy's canonical
  spec, the seed and the view index, so views never mix with each other or with the
  preset's features.

Entries are safetensors objects in a bucket of the store (default ``hapi-cache``) at
``features/<first two hex>/<sha256>.safetensors``: tensor ``features`` ``[N, ...]`` in the
wire dtype, ``labels`` when the object carried them, and ``__metadata__`` with the samples'
``keys`` (and per-sample metadata). An S3 PUT of a whole body is atomic, so an entry is
never partial; a reader that cannot parse one treats it as a miss.

Least-recently-used eviction works on the entries' ``LastModified``: a hit on an entry not
touched for a while rewrites its metadata in place (a copy onto itself), so the oldest
``LastModified`` is the least recently used entry. This module is the contract shared by
the gateway (which reads and writes entries) and ``hapi cache`` (which lists and prunes
them); it imports nothing of hapi.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

DEFAULT_CACHE_BUCKET = "hapi-cache"
ENTRY_PREFIX = "features/"
ENTRY_SUFFIX = ".safetensors"
KEY_VERSION = 1  # bump when the key's inputs change, so old entries miss


@dataclass(frozen=True, kw_only=True)
class ObjectIdentity:
    """What identifies one stored object's content.

    Args:
        bucket: The object's bucket.
        key: The object's key.
        etag: Its ETag, quotes stripped.
        size: Its size in bytes.
        version_id: Its version id, when the store versions the bucket.
    """

    bucket: str
    key: str
    etag: str
    size: int
    version_id: str | None = None


def cache_key(
    identity: ObjectIdentity,
    *,
    blocks: Sequence[str],
    preprocess: Mapping[str, Any],
    dtype: str,
    view: Mapping[str, Any] | None = None,
) -> str:
    """The hex SHA-256 naming the entry of ``identity``'s features after ``blocks``.

    Args:
        identity: The object.
        blocks: The content hashes of the blocks the features went through, ``[0, split)``.
        preprocess: The preprocessing preset, as a manifest records it.
        dtype: The wire dtype.
        view: For an augmented view, ``{"augment": spec, "seed": seed, "view": index}``;
            ``None`` for the preset's own features (whose keys are as before views).

    Models whose blocks ``[0, split)`` have the same hashes and the same preprocessing
    get the same key, whatever their names and versions.
    """
    material = {
        "v": KEY_VERSION,
        "object": asdict(identity),
        "preprocess": dict(preprocess),
        "blocks": list(blocks),
        "split": len(blocks),
        "dtype": dtype,
    }
    if view is not None:
        material["view"] = dict(view)
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(text.encode()).hexdigest()


def entry_path(digest: str) -> str:
    """The object key of the entry named ``digest``."""
    return f"{ENTRY_PREFIX}{digest[:2]}/{digest}{ENTRY_SUFFIX}"


def is_entry(key: str) -> bool:
    """Whether an object key in the cache bucket is an entry."""
    return key.startswith(ENTRY_PREFIX) and key.endswith(ENTRY_SUFFIX)


@dataclass(frozen=True)
class CacheEntry:
    """One entry as a listing shows it."""

    key: str
    size: int
    last_used: datetime


def listed_entries(contents: Iterable[Mapping[str, Any]]) -> Iterator[CacheEntry]:
    """The entries among one page of an S3 listing of the cache bucket (``Contents``, as
    boto3's ``list_objects_v2`` gives it), in its order; other objects are left out.

    The listing itself is the caller's (``hapi cache``, the benchmarks): this layer does
    no I/O. List with ``Prefix=ENTRY_PREFIX``.
    """
    for item in contents:
        if is_entry(item["Key"]):
            yield CacheEntry(item["Key"], int(item["Size"]), item["LastModified"])


def eviction_order(entries: Sequence[CacheEntry], max_bytes: int) -> list[CacheEntry]:
    """The entries to delete, least recently used first, so the rest fit ``max_bytes``."""
    total = sum(entry.size for entry in entries)
    doomed: list[CacheEntry] = []
    for entry in sorted(entries, key=lambda e: (e.last_used, e.key)):
        if total <= max_bytes:
            break
        doomed.append(entry)
        total -= entry.size
    return doomed
