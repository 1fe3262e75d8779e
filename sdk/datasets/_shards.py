"""How many samples each WebDataset shard holds, read from its tar headers alone.

Dealing an epoch's samples equally to ranks and workers, and saving a position inside a
shard, needs every shard's sample count before any shard is read (MosaicML Streaming and
LitData keep an index file for the same reason). A tar has no index, but each member's
512-byte header says how far the next one is: the shard is read as a seekable file whose
reads are ranged GETs of :data:`WINDOW` bytes, so ``tarfile`` hops from header to header
and member bodies cross the network only where they are small enough to share a window
with the next header. Shards are counted :data:`INDEX_THREADS` at a time, once, when the
dataset is built.

A sample is counted as the gateway and ``hapi.models`` list one: members grouped by
basename up to the first dot, each group with an image member one sample.
"""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hapi.models import IMAGE_EXTENSIONS, shard_member

from ..client._errors import UnprocessableObject
from ._compute import read_object

INDEX_THREADS = 8
WINDOW = 64 * 1024


class _Ranged:
    """A read-only, seekable view of an object whose reads are ranged GETs, one window
    of :data:`WINDOW` bytes at a time (what ``tarfile`` needs to list members)."""

    def __init__(self, s3: Any, bucket: str, key: str, size: int) -> None:
        self._s3, self._bucket, self._key, self._size = s3, bucket, key, size
        self._at = 0
        self._window = (0, b"")

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._at, 2: self._size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def read(self, size: int = -1) -> bytes:
        stop = self._size if size < 0 else min(self._size, self._at + size)
        if stop <= self._at:
            return b""
        first, data = self._window
        if not first <= self._at or stop > first + len(data):
            end = max(stop, min(self._size, self._at + WINDOW))
            data = read_object(self._s3, self._bucket, self._key, self._at, end)
            first = self._at
            self._window = (first, data)
        out = data[self._at - first : stop - first]
        self._at += len(out)
        return out


def count_samples(s3: Any, bucket: str, key: str, size: int | None = None) -> int:
    """The samples of one shard, from its tar headers.

    Raises:
        RequestError: A read failed.
        UnprocessableObject: Not a readable tar.
    """
    if size is None:
        size = int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
    groups: dict[str, bool] = {}
    try:
        with tarfile.open(fileobj=_Ranged(s3, bucket, key, size), mode="r:") as archive:  # type: ignore[call-overload]
            for member in archive:
                part = shard_member(member)
                if part is not None:  # grouped exactly as the gateway groups them
                    name, extension = part
                    groups[name] = groups.get(name, False) or extension in IMAGE_EXTENSIONS
    except (tarfile.TarError, OSError) as exc:
        raise UnprocessableObject(
            "UnprocessableObject", f"not a readable tar shard ({exc})", bucket=bucket, key=key
        ) from exc
    return sum(groups.values())


def count_shards(
    s3: Any, bucket: str, keys: Sequence[str], sizes: Sequence[int] | None
) -> tuple[int, ...]:
    """Samples per shard, in order (:data:`INDEX_THREADS` shards at a time)."""
    known: Sequence[int | None] = sizes if sizes is not None else [None] * len(keys)
    with ThreadPoolExecutor(min(INDEX_THREADS, max(1, len(keys)))) as pool:
        return tuple(
            pool.map(lambda pair: count_samples(s3, bucket, *pair), zip(keys, known, strict=True))
        )
