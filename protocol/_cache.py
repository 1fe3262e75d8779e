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

An entry is safetensors: tensor ``features`` ``[N, ...]`` in the wire dtype, ``labels``
when the object carried them, and ``__metadata__`` with the samples' ``keys`` (and
per-sample metadata), kept without its zero words where that is smaller (``_zeros``'s
``compact_entry``: a ReLU's features in about half the bytes). Each entry has a path, ``features/<first two hex>/<sha256>.safetensors``
(:func:`entry_path`), but entries are written in *packs*: one object of a bucket of the
store (default ``hapi-cache``) holding the entries of one *context* (the cache key's inputs
but the object: the bucket, the preset, the blocks, the dtype, the view) that were computed
together, at ``packs/<first two hex>/<context>/<milliseconds>-<nonce>.pack``
(:func:`pack_path`; listing a context's prefix finds its packs, oldest first). A store
spends most of a small PUT's cost on the request, not its bytes (SeaweedFS: about 2 ms of
CPU a PUT, 10 ns a byte), so a pack of 64 entries costs it about what one entry did.

A pack is ``PACK_MAGIC``, the index's length (8 bytes, little-endian), the index (JSON:
each member's entry path, offset after the index, length and SHA-256), then the members'
bytes. A reader takes the index from the pack's head and a member with a ranged GET,
checking the member's bytes against the index's SHA-256 (the gateway also checks a MAC
over the pack's path and its index). An S3 PUT of a whole body is atomic, so a pack is
never partial; a reader that cannot parse one treats its entries as misses. Entries
written one per object at their entry path (the layout before packs) are still listed,
measured and pruned, never read.

Least-recently-used eviction works on the packs' ``LastModified``: a hit on a pack not
touched for a while rewrites its metadata in place (a copy onto itself), so the oldest
``LastModified`` is the least recently used pack. This module is the contract shared by
the gateway (which reads and writes packs) and ``hapi cache`` (which lists and prunes
them); it imports nothing of hapi.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

DEFAULT_CACHE_BUCKET = "hapi-cache"
ENTRY_PREFIX = "features/"
ENTRY_SUFFIX = ".safetensors"
PACK_PREFIX = "packs/"
PACK_SUFFIX = ".pack"
PACK_MAGIC = b"HAPIPAK1"
PACK_HEAD = len(PACK_MAGIC) + 8  # the magic and the index's length
MAX_PACK_INDEX = 16 * 1024**2  # an index longer than this is not a pack's
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
    return _digest({"object": asdict(identity)}, blocks, preprocess, dtype, view)


def context_digest(
    bucket: str,
    *,
    blocks: Sequence[str],
    preprocess: Mapping[str, Any],
    dtype: str,
    view: Mapping[str, Any] | None = None,
) -> str:
    """The hex SHA-256 naming a context: what the cache keys of ``bucket``'s objects
    through ``blocks`` share (:func:`cache_key`'s inputs but the object's own)."""
    return _digest({"bucket": bucket}, blocks, preprocess, dtype, view)


def _digest(
    what: dict[str, Any],
    blocks: Sequence[str],
    preprocess: Mapping[str, Any],
    dtype: str,
    view: Mapping[str, Any] | None,
) -> str:
    """The hex SHA-256 of ``what`` beside the inputs every key shares (canonical JSON)."""
    material = {
        **what,
        "v": KEY_VERSION,
        "preprocess": dict(preprocess),
        "blocks": list(blocks),
        "split": len(blocks),
        "dtype": dtype,
    }
    if view is not None:
        material["view"] = dict(view)
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(text.encode()).hexdigest()


def pack_prefix(context: str) -> str:
    """The prefix under which the packs of ``context`` (see :func:`context_digest`) lie."""
    return f"{PACK_PREFIX}{context[:2]}/{context}/"


def pack_path(context: str, *, stamp_ms: int, nonce: str) -> str:
    """The object key of a pack of ``context`` written at ``stamp_ms`` (milliseconds since
    the epoch: a context's packs list oldest first), ``nonce`` telling writers apart."""
    return f"{pack_prefix(context)}{stamp_ms:013d}-{nonce}{PACK_SUFFIX}"


def is_pack(key: str) -> bool:
    """Whether an object key in the cache bucket is a pack."""
    return key.startswith(PACK_PREFIX) and key.endswith(PACK_SUFFIX)


@dataclass(frozen=True)
class PackMember:
    """Where one entry lies in its pack: ``[offset, offset + length)`` of the pack's
    bytes, whose SHA-256 is ``sha256`` (hex)."""

    path: str
    offset: int
    length: int
    sha256: str


def encode_pack(entries: Sequence[tuple[str, bytes]]) -> tuple[bytes, bytes]:
    """A pack of ``entries`` (entry path, entry bytes), and its index as stored in it
    (what a MAC of the pack covers)."""
    rows, offset = [], 0
    for path, body in entries:
        rows.append([path, offset, len(body), hashlib.sha256(body).hexdigest()])
        offset += len(body)
    index = json.dumps({"entries": rows}, separators=(",", ":")).encode()
    head = PACK_MAGIC + struct.pack("<Q", len(index))
    return b"".join([head, index, *(body for _, body in entries)]), index


def pack_index_length(head: bytes) -> int:
    """The length of the index that follows a pack's first :data:`PACK_HEAD` bytes.

    Raises:
        ValueError: ``head`` is not the start of a pack.
    """
    if len(head) < PACK_HEAD or not head.startswith(PACK_MAGIC):
        raise ValueError("not a feature cache pack")
    (length,) = struct.unpack_from("<Q", head, len(PACK_MAGIC))
    if length > MAX_PACK_INDEX:
        raise ValueError(f"a pack index of {length} bytes is over {MAX_PACK_INDEX}")
    return int(length)


def parse_pack_index(index: bytes) -> dict[str, PackMember]:
    """A pack's members by entry path, their offsets counted from the pack's start.

    Raises:
        ValueError: ``index`` is not a pack's index.
    """
    try:
        rows = json.loads(index)["entries"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a pack index: {exc}") from exc
    start = PACK_HEAD + len(index)
    members: dict[str, PackMember] = {}
    if not isinstance(rows, list):
        raise ValueError("not a pack index: its entries are not a list")
    for row in rows:
        if not (
            isinstance(row, list)
            and len(row) == 4
            and isinstance(row[0], str)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in row[1:3])
            and isinstance(row[3], str)
        ):
            raise ValueError(f"not a pack index: a member reads {row!r}")
        path, offset, length, digest = row
        members.setdefault(path, PackMember(path, start + offset, length, digest))
    return members


def entry_path(digest: str) -> str:
    """The object key of the entry named ``digest``."""
    return f"{ENTRY_PREFIX}{digest[:2]}/{digest}{ENTRY_SUFFIX}"


def is_entry(key: str) -> bool:
    """Whether an object key in the cache bucket is an entry."""
    return key.startswith(ENTRY_PREFIX) and key.endswith(ENTRY_SUFFIX)


@dataclass(frozen=True)
class CacheEntry:
    """One object of the cache (a pack, or an entry of its own) as a listing shows it."""

    key: str
    size: int
    last_used: datetime


CACHE_PREFIXES = (PACK_PREFIX, ENTRY_PREFIX)
"""What a listing of the cache's objects covers: packs, and entries written one by one."""


def is_cached(key: str) -> bool:
    """Whether an object key in the cache bucket is a pack or an entry of its own."""
    return is_pack(key) or is_entry(key)


def listed_entries(contents: Iterable[Mapping[str, Any]]) -> Iterator[CacheEntry]:
    """The cache's objects (packs, and entries of their own) among one page of an S3
    listing of the cache bucket (``Contents``, as boto3's ``list_objects_v2`` gives it), in
    its order; other objects are left out.

    The listing itself is the caller's (``hapi cache``, the benchmarks): this layer does
    no I/O. List each of :data:`CACHE_PREFIXES`.
    """
    for item in contents:
        if is_cached(item["Key"]):
            yield CacheEntry(item["Key"], int(item["Size"]), item["LastModified"])


def eviction_order(entries: Sequence[CacheEntry], max_bytes: int) -> list[CacheEntry]:
    """The objects to delete, least recently used first, so the rest fit ``max_bytes``."""
    total = sum(entry.size for entry in entries)
    doomed: list[CacheEntry] = []
    for entry in sorted(entries, key=lambda e: (e.last_used, e.key)):
        if total <= max_bytes:
            break
        doomed.append(entry)
        total -= entry.size
    return doomed
