"""The feature cache, as the gateway uses it: look entries up, write them in the background.

The layout (keys, paths, eviction order) is ``hapi.protocol``'s contract; this module does
the I/O with the gateway's own store identity. Each entry carries a MAC over its cache
key and its content (the ``x-amz-meta-hapi-mac`` header) under a key every gateway of a
store shares and no client holds: an entry without a valid one (forged through the
gateway, written directly into the store, or another key's entry copied over) is a miss,
counted as ``rejected``, never served. Nothing here may fail a request: a cache bucket
that is missing, full or unreadable degrades to computing, with one warning per kind of
failure. Writes go through a bounded queue drained by one
background task; a full queue skips the write rather than delay an answer. A queued
write waits while pushdown requests are being served (``cache_write_defer_s`` at most,
and not once the queue is three quarters full), so a cold epoch's entry writes take the
storage side's idle time instead of its cores; meanwhile the queued entry answers this
gateway's lookups, so an epoch that follows at once does not compute it again.

A cold cache costs what no cache costs. A lookup is a HEAD of the object as the caller and
a GET of its entry: two store requests before the object's own GET, for nothing when the
entries are not there. So the gateway counts misses per *context* (a bucket, a model's
blocks to the split, the dtype, the augmented view): after ``COLD_AFTER`` misses in a row
with no hit, the context is cold, and only one object in ``cache_cold_probe`` is looked
up; the others are fetched at once, as without the cache (their GET as the caller gives
the identity their entries are written under). A probe that hits warms the context
again, so entries another gateway wrote are found within a few objects; an object this
gateway computed recently is always looked up (its entry may be waiting in the queue),
so the epoch that follows a cold one is served from the cache from its first request,
until one of them misses (its entry was evicted or the cache emptied): then the bucket's
objects computed here are forgotten.
A hit on an
entry not touched for ``cache_touch_s`` is refreshed in the background (a copy onto
itself), so ``LastModified`` tracks last use for least-recently-used eviction, which a
background task applies when ``cache_max_bytes`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import MappingProxyType
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from hapi.models import Manifest, Preset
from hapi.protocol import (
    ENTRY_PREFIX,
    CacheEntry,
    ObjectIdentity,
    cache_key,
    decode_features,
    encode_features,
    entry_path,
    eviction_order,
    is_entry,
)

from .._errors import BackendError
from .._metrics import Metrics
from .._settings import GatewaySettings
from .._store import StoreClient

logger = logging.getLogger("hapi.gateway.cache")
MAC_HEADER = "x-amz-meta-hapi-mac"
IDLE_POLL_S = 0.02  # how often a deferred write looks whether the requests have ended
COLD_AFTER = 16  # misses in a row, with no hit, after which a context's lookups are sampled
CONTEXTS = 1024  # contexts whose misses are counted (the least recently used go first)
STORED = 65536  # objects this gateway computed recently, which are always looked up
SHUTDOWN_FLUSH_S = 5.0  # the most a stopping gateway spends writing the entries still queued


@dataclass(frozen=True)
class Cached:
    """One entry's content: features (float32 arrays of the wire dtype's values), labels,
    the samples' keys and per-sample metadata."""

    features: np.ndarray
    labels: np.ndarray | None
    keys: list[str]
    samples_meta: list[dict[str, Any]] | None
    nbytes: int
    views: list[dict[str, Any]] | None = None  # each sample's augmented view, as drawn


@dataclass(frozen=True, slots=True)
class _Job:
    """A write waiting in the queue: the model of an entry (None for a touch), the work,
    its bytes and the identity it counts against."""

    model: str | None
    run: Callable[[], Any]
    size: int = 0
    owner: str = ""
    queued_at: float = field(default_factory=time.monotonic)
    path: str = ""  # an entry write's path (its bytes answer lookups while it waits)


class FeatureCache:
    """Entries in the cache bucket, read and written through the upstream client.

    Args:
        settings: Gateway settings (backend, credentials, the cache's bucket and limits).
        store: The gateway's store client.
        metrics: Where hits, misses, bytes and writes are counted.
        busy: Whether pushdown requests are being served now: a queued write waits for
            them to end (``cache_write_defer_s`` at most, and not once the queue is three
            quarters full). ``None``: writes go at once.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        store: StoreClient,
        metrics: Metrics | None = None,
        *,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._bucket = settings.cache_bucket
        self._metrics = metrics
        self._busy = busy
        self.deferred_writes = 0  # writes that waited for the requests being served
        self._pending: dict[str, bytes] = {}  # entries queued for writing, by path
        # (the model of an entry write, None for a touch; the job; its bytes; whose)
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=max(1, settings.cache_write_queue))
        self.queued_bytes = 0  # of every write waiting, bounded by cache_write_queue_bytes
        self._queued_by: dict[str, int] = {}  # per identity, bounded by its own share
        self._warned: set[str] = set()
        self._bucket_checked = False
        self.enabled = settings.cache_enabled
        self.skipped_writes = 0
        self._streaks: OrderedDict[Hashable, _Streak] = OrderedDict()  # misses per context
        self._stored: OrderedDict[tuple[str, str], None] = OrderedDict()  # computed here

    # -- lifecycle ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FeatureCache]:
        """Run the writer (and the evictor, when a size cap is set) until exit."""
        tasks = [asyncio.create_task(self._writer(), name="hapi-cache-writer")]
        if self.enabled and self._settings.cache_max_bytes > 0:
            tasks.append(asyncio.create_task(self._evictor(), name="hapi-cache-evictor"))
        try:
            yield self
        finally:
            self._busy = None  # what waits for idle time is written now, for a moment
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), SHUTDOWN_FLUSH_S)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def drain(self) -> None:
        """Wait until every queued write is done (tests, shutdown)."""
        await self._queue.join()

    # -- reads -------------------------------------------------------------------------

    async def identify(self, caller: StoreClient, bucket: str, key: str) -> ObjectIdentity | None:
        """The object's identity from a HEAD sent as the caller (``caller``: the store
        client acting as its identity, unsigned for an anonymous caller), so the store
        judges whether it may read the object now, before any cached features are served;
        ``None`` when the HEAD fails, so the caller's own GET reports the error exactly as
        without the cache."""
        try:
            reply = await caller.request("HEAD", bucket, key)
        except httpx.TransportError:
            return None
        if reply.status_code != 200:
            return None
        return identity_from(bucket, key, reply.headers)

    def worth_asking(
        self,
        bucket: str,
        keys: Sequence[str],
        manifest: Manifest,
        split: int,
        dtype: str,
        view: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """The ``keys`` to look up: all of them, unless their context is cold (see the
        module's text); then one in ``cache_cold_probe``, and those computed here lately.
        The others count as ``skipped`` lookups."""
        if not self.enabled:
            return []
        streak = self._streaks.get(_context(bucket, manifest, split, dtype, view))
        every = self._settings.cache_cold_probe
        if streak is None or streak.misses < COLD_AFTER or every <= 1:
            return list(keys)
        asked = []
        for key in keys:
            streak.passed += 1
            if streak.passed % every == 0 or (bucket, key) in self._stored:
                asked.append(key)
        if len(asked) < len(keys):
            self._count(manifest, "skipped", times=len(keys) - len(asked))
        return asked

    def _learn(self, context: Hashable, identity: ObjectIdentity, *, hit: bool) -> None:
        if not hit and (identity.bucket, identity.key) in self._stored:
            # An entry written here is gone (evicted, or the cache emptied): so may the
            # others be, and looking them all up would undo what a cold context saves.
            self._stored = OrderedDict(
                (where, None) for where in self._stored if where[0] != identity.bucket
            )
        streak = self._streaks.get(context)
        if streak is None:
            if hit:
                return  # a context that only hits needs no record
            streak = self._streaks[context] = _Streak()
            if len(self._streaks) > CONTEXTS:
                self._streaks.popitem(last=False)
        self._streaks.move_to_end(context)
        streak.misses = 0 if hit else streak.misses + 1

    def cold(
        self,
        bucket: str,
        manifest: Manifest,
        split: int,
        dtype: str,
        view: Mapping[str, Any] | None = None,
    ) -> bool:
        """Whether lookups in this context are sampled now."""
        streak = self._streaks.get(_context(bucket, manifest, split, dtype, view))
        return streak is not None and streak.misses >= COLD_AFTER

    async def lookup(
        self,
        identity: ObjectIdentity,
        manifest: Manifest,
        split: int,
        dtype: str,
        view: Mapping[str, Any] | None = None,
    ) -> Cached | None:
        """The cached features (of an augmented ``view``'s, when given: see
        :func:`hapi.protocol.cache_key`), or ``None`` on a miss (or when the cache cannot be
        read)."""
        if not self.enabled:
            return None
        path = entry_path(_key(identity, manifest, split, dtype, view))
        context = _context(identity.bucket, manifest, split, dtype, view)
        queued = self._pending.get(path)
        if queued is not None:  # computed here and waiting to be written: as good as stored
            found = _parse(queued)
            if found is not None:
                return self._outcome(manifest, context, identity, "hit", found)
        try:
            reply = await self._store.request("GET", self._bucket, path)
        except httpx.TransportError as exc:
            self._warn("read", f"the feature cache cannot be read ({exc!r}); computing instead")
            return None
        if reply.status_code == 404:
            return self._outcome(manifest, context, identity, "miss")
        if reply.status_code != 200:  # the store's trouble, not the entry's: no streak
            self._warn("read", f"the feature cache answered HTTP {reply.status_code}; computing")
            self._count(manifest, "miss")
            return None
        mac = reply.headers.get(MAC_HEADER, "")
        if not hmac.compare_digest(mac, self._mac(path, hashlib.sha256(reply.content).digest())):
            self._warn("rejected", f"a cache entry without a valid MAC was ignored: {path}")
            return self._outcome(manifest, context, identity, "rejected")
        cached = _parse(reply.content)
        if cached is None:
            self._warn("corrupt", f"an unreadable cache entry {path} was ignored")
            return self._outcome(manifest, context, identity, "miss")
        self._maybe_touch(path, mac, reply.headers.get("last-modified"))
        return self._outcome(manifest, context, identity, "hit", cached)

    def _outcome(
        self,
        manifest: Manifest,
        context: Hashable,
        identity: ObjectIdentity,
        result: str,
        found: Cached | None = None,
    ) -> Cached | None:
        """Count a lookup's ``result``, learn from it (see :meth:`worth_asking`), and
        return what it found."""
        self._count(manifest, result, found.nbytes if found is not None else 0)
        self._learn(context, identity, hit=found is not None)
        return found

    def _mac(self, path: str, digest: bytes) -> str:
        """The MAC of an entry: its path (so its cache key) and its content's SHA-256
        ``digest``."""
        message = b"hapi cache entry\n" + path.encode() + b"\n" + digest
        return hmac.new(self._settings.cache_mac_key, message, hashlib.sha256).hexdigest()

    # -- writes ------------------------------------------------------------------------

    def store(
        self,
        identity: ObjectIdentity,
        manifest: Manifest,
        split: int,
        dtype: str,
        entry: bytes,
        *,
        owner: str = "",
        view: Mapping[str, Any] | None = None,
    ) -> bool:
        """Queue ``entry`` (safetensors, see :func:`encode_entry`) for writing; ``False``
        when the write was skipped: the queue is full (in entries or bytes), or ``owner``
        (the identity whose request computed it) has its share of the bytes waiting."""
        if not self.enabled:
            return False
        path = entry_path(_key(identity, manifest, split, dtype, view))
        model = manifest.name
        job = _Job(model, lambda: self._put(path, entry, model), len(entry), owner, path=path)
        if not self._enqueue(job):
            self.skipped_writes += 1
            self._count_write(model, "skipped")
            return False
        self._pending[path] = entry
        self._stored[(identity.bucket, identity.key)] = None
        self._stored.move_to_end((identity.bucket, identity.key))
        if len(self._stored) > STORED:
            self._stored.popitem(last=False)
        return True

    def _enqueue(self, job: _Job) -> bool:
        if self.queued_bytes + job.size > self._settings.cache_write_queue_bytes:
            return False
        share = self._settings.identity_cache_write_bytes
        held = self._queued_by.get(job.owner, 0)
        if job.size and share and held + job.size > share:
            if self._metrics is not None:
                self._metrics.identity_limited.labels(job.owner, "cache_write").inc()
            return False
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            return False
        self.queued_bytes += job.size
        if job.size:
            self._queued_by[job.owner] = held + job.size
        if self._metrics is not None:
            self._metrics.cache_writes_pending.inc()
        return True

    def _done(self, job: _Job) -> None:
        if job.path:
            self._pending.pop(job.path, None)
        self.queued_bytes -= job.size
        if job.size:
            left = self._queued_by[job.owner] - job.size
            if left:
                self._queued_by[job.owner] = left
            else:
                del self._queued_by[job.owner]
        self._queue.task_done()
        if self._metrics is not None:
            self._metrics.cache_writes_pending.dec()

    async def _writer(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                await self._when_idle(job)
                await job.run()
            except Exception as exc:  # a failed write never reaches a request
                if job.model is not None:
                    self._count_write(job.model, "failed")
                self._warn("write", f"a feature cache write failed: {exc!r}")
            finally:
                self._done(job)

    async def _when_idle(self, job: _Job) -> None:
        """Wait while pushdown requests are being served, so that entry writes (a PUT to
        the store each) take the storage side's idle time rather than the cold epoch's:
        until ``cache_write_defer_s`` after the job was queued, or until the queue is
        three quarters full (a full one would skip the next writes)."""
        if not self._waiting():
            return
        self.deferred_writes += 1
        deadline = job.queued_at + self._settings.cache_write_defer_s
        while self._waiting() and time.monotonic() < deadline and not self._nearly_full():
            await asyncio.sleep(IDLE_POLL_S)

    def _waiting(self) -> bool:
        return self._busy is not None and self._busy()  # None once the cache stops

    def _nearly_full(self) -> bool:
        settings = self._settings
        return (
            4 * self._queue.qsize() >= 3 * max(1, settings.cache_write_queue)
            or 4 * self.queued_bytes >= 3 * settings.cache_write_queue_bytes
        )

    async def _put(self, path: str, body: bytes, model: str) -> None:
        await self._ensure_bucket()
        digest = hashlib.sha256(body).digest()  # the MAC's and the signature's, hashed once
        headers = {
            "content-type": "application/octet-stream",
            "content-length": str(len(body)),
            MAC_HEADER: self._mac(path, digest),
        }
        reply = await self._store.request(
            "PUT",
            self._bucket,
            path,
            headers=headers,
            content=body,
            payload_sha256=digest.hex(),
        )
        if reply.status_code != 200:
            if reply.status_code == 404:  # the bucket went away: create it on the next write
                self._bucket_checked = False
            self._count_write(model, "failed")
            self._warn("write", f"the feature cache refused a write: HTTP {reply.status_code}")
            return
        self._count_write(model, "written", len(body))

    async def _ensure_bucket(self) -> None:
        if self._bucket_checked:
            return
        reply = await self._store.request("HEAD", self._bucket)
        if reply.status_code == 404:
            created = await self._store.request("PUT", self._bucket)
            if created.status_code not in (200, 409):
                raise RuntimeError(
                    f"cannot create the cache bucket {self._settings.cache_bucket!r}: "
                    f"HTTP {created.status_code}"
                )
        self._bucket_checked = True

    def _maybe_touch(self, path: str, mac: str, last_modified: str | None) -> None:
        if last_modified is None:
            return
        try:
            age = (datetime.now(UTC) - parsedate_to_datetime(last_modified)).total_seconds()
        except (TypeError, ValueError):
            return
        if age < self._settings.cache_touch_s:
            return
        self._enqueue(_Job(None, lambda: self._touch(path, mac)))  # a full queue skips it

    async def _touch(self, path: str, mac: str) -> None:
        source = f"/{self._bucket}/{path}"
        headers = {
            "x-amz-copy-source": quote(source),
            "x-amz-metadata-directive": "REPLACE",
            MAC_HEADER: mac,  # replaced metadata keeps the entry's MAC
        }
        await self._store.request("PUT", self._bucket, path, headers=headers)

    # -- eviction ----------------------------------------------------------------------

    async def _evictor(self) -> None:
        while True:
            await asyncio.sleep(self._settings.cache_prune_interval_s)
            try:
                await self.evict()
            except Exception as exc:
                self._warn("evict", f"feature cache eviction failed: {exc!r}")

    async def evict(self) -> int:
        """Delete least-recently-used entries until the rest fit ``cache_max_bytes``;
        returns how many were deleted."""
        entries = [entry async for entry in self._entries()]
        doomed = eviction_order(entries, self._settings.cache_max_bytes)
        for entry in doomed:
            await self._store.request("DELETE", self._bucket, entry.key)
        return len(doomed)

    async def _entries(self) -> AsyncIterator[CacheEntry]:
        """Every entry, from the store's listing (none when the listing fails: eviction
        waits for the next round)."""
        try:
            async for item in self._store.list_objects(self._bucket, ENTRY_PREFIX):
                if is_entry(item.key) and item.last_modified is not None:
                    yield CacheEntry(item.key, item.size, item.last_modified)
        except BackendError:
            return

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning(message)

    def _count(self, manifest: Manifest, result: str, nbytes: int = 0, *, times: int = 1) -> None:
        if self._metrics is not None:
            self._metrics.cache_lookups.labels(manifest.name, result).inc(times)
            if nbytes:
                self._metrics.cache_bytes.labels(manifest.name, "read").inc(nbytes)

    def _count_write(self, model: str, outcome: str, nbytes: int = 0) -> None:
        if self._metrics is not None:
            self._metrics.cache_writes.labels(model, outcome).inc()
            if nbytes:
                self._metrics.cache_bytes.labels(model, "written").inc(nbytes)


@dataclass(slots=True)
class _Streak:
    """A context's misses in a row since its last hit, and the objects of it that went
    by since (which of them a cold context probes)."""

    misses: int = 0
    passed: int = 0


def _context(
    bucket: str, manifest: Manifest, split: int, dtype: str, view: Mapping[str, Any] | None
) -> Hashable:
    """What a lookup's entry shares with its neighbours' but for the object: its bucket and
    the cache key's other inputs (models that share blocks to the split share it too)."""
    augmented = None if view is None else json.dumps(view, sort_keys=True)
    return (bucket, manifest.hashes[:split], manifest.preprocess, dtype, augmented)


def identity_from(bucket: str, key: str, headers: Mapping[str, str]) -> ObjectIdentity | None:
    """An object's identity from a GET or HEAD response's headers (by lowercase name, or
    ``httpx.Headers``; ``None`` without an ETag: such an object cannot be cached safely)."""
    etag = headers.get("etag", "").strip('"')
    if not etag:
        return None
    return ObjectIdentity(
        bucket=bucket,
        key=key,
        etag=etag,
        size=int(headers.get("content-length", "0")),
        version_id=headers.get("x-amz-version-id"),
    )


def encode_entry(
    features: np.ndarray,
    dtype: str,
    labels: np.ndarray | None,
    keys: list[str],
    samples_meta: list[dict[str, Any]] | None,
    views: list[dict[str, Any]] | None = None,
) -> bytes:
    """One object's features as a cache entry (safetensors in the wire dtype)."""
    meta = {"keys": json.dumps(keys)}
    if samples_meta is not None:
        meta["samples"] = json.dumps(samples_meta)
    if views is not None:
        meta["views"] = json.dumps(views)
    return bytes(encode_features(features, dtype=dtype, labels=labels, metadata=meta))


def _parse(body: bytes) -> Cached | None:
    try:
        tensors, meta = decode_features(body)
        keys = json.loads(meta.get("keys", "[]"))
        samples = json.loads(meta["samples"]) if "samples" in meta else None
        views = json.loads(meta["views"]) if "views" in meta else None
        features = tensors["features"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(keys, list) or len(keys) != len(features):
        return None
    if views is not None and (not isinstance(views, list) or len(views) != len(keys)):
        return None
    return Cached(features, tensors.get("labels"), keys, samples, len(body), views)


@functools.lru_cache(maxsize=64)
def _preset(preset: Preset) -> Mapping[str, Any]:
    """A preset as the cache key hashes it (built once per preset: a lookup an object)."""
    return MappingProxyType(preset.to_dict())


def _key(
    identity: ObjectIdentity,
    manifest: Manifest,
    split: int,
    dtype: str,
    view: Mapping[str, Any] | None = None,
) -> str:
    """The cache key of ``identity``'s features through ``manifest``'s blocks ``[0, split)``
    (of an augmented ``view``'s, when given)."""
    return cache_key(
        identity,
        blocks=manifest.hashes[:split],
        preprocess=_preset(manifest.preprocess),
        dtype=dtype,
        view=view,
    )
