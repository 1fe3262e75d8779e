"""The feature cache, as the gateway uses it: look entries up, write them in the background.

The layout (keys, paths, packs, eviction order) is ``hapi.protocol``'s contract; this
module does the I/O with the gateway's own store identity. Entries are written in packs,
one object for the entries of one context that waited in the queue together (at most
``PACK_ENTRIES`` of them and ``PACK_BYTES``): a store's PUT costs it mostly per request, so
a cold epoch's writes cost it a pack's request, not an entry's. Each pack carries a MAC
over its path and its index (the ``x-amz-meta-hapi-mac`` header) under a key every gateway
of a store shares and no client holds, and the index holds each entry's SHA-256: a pack
without a valid MAC (forged through the gateway, written directly into the store, or
another context's pack copied over) is never read, and an entry whose bytes do not match
its index is a miss counted as ``rejected``, never served. Nothing here may fail a
request: a cache bucket that is missing, full or unreadable degrades to computing, with
one warning per kind of failure.

A lookup finds its entry in the index of its context's packs, kept in memory: an entry
not in it is a miss at no cost to the store, unless the index was listed more than
``INDEX_TTL_S`` ago; then the context's packs are listed again (one listing, shared by the
lookups waiting on it) and the heads of the packs not seen before are read. A hit is one
ranged GET of the entry's bytes, or none at all when the pack is one this gateway wrote and
still holds in memory (``cache_memory_bytes`` of them, the least recently written dropped
first) and the store was seen holding it less than ``INDEX_TTL_S`` ago: an older copy's
next hit reads its entry from the store, which shows the pack still there (or gone: then
it leaves memory and the index), so a pack deleted behind this gateway is served from
memory for at most that long, as a pack written by another is found within it. The
indexes hold at most ``INDEXED`` entries together (the least recently used contexts go
first, to be listed again when asked for).

Writes go through a bounded queue drained by one
background task; a full queue skips the write rather than delay an answer. A queued
write waits while pushdown requests are being served (``cache_write_defer_s`` at most,
and not once the queue is three quarters full), so a cold epoch's entry writes take the
storage side's idle time instead of its cores, and are packed together; meanwhile the
queued entry answers this gateway's lookups, so an epoch that follows at once does not
compute it again.

A cold cache costs what no cache costs. A lookup is a HEAD of the object as the caller
before the object's own GET (and a listing of its context's packs at most every
``INDEX_TTL_S``), for nothing when the entries are not there. So the gateway counts misses
per *context* (a bucket, a model's
blocks to the split, the dtype, the augmented view): after ``COLD_AFTER`` misses in a row
with no hit, the context is cold, and only one object in ``cache_cold_probe`` is looked
up; the others are fetched at once, as without the cache (their GET as the caller gives
the identity their entries are written under). A probe that hits warms the context
again, so entries another gateway wrote are found within a few objects; an object this
gateway computed recently is always looked up (its entry may be waiting in the queue),
so the epoch that follows a cold one is served from the cache from its first request,
until one of them misses (its entry was evicted or the cache emptied): then the bucket's
objects computed here are forgotten.
A hit in a
pack not touched for ``cache_touch_s`` refreshes it in the background (a copy onto
itself), so ``LastModified`` tracks last use for least-recently-used eviction of whole
packs, which a background task applies when ``cache_max_bytes`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, NamedTuple
from urllib.parse import quote

import httpx
import numpy as np

from hapi.models import Manifest, Preset
from hapi.protocol import (
    CACHE_PREFIXES,
    PACK_HEAD,
    WIRE_ITEMSIZE,
    CacheEntry,
    ObjectIdentity,
    PackMember,
    cache_key,
    compact_entry,
    context_digest,
    decode_features,
    encode_features,
    encode_pack,
    entry_path,
    eviction_order,
    expand_entry,
    is_cached,
    is_pack,
    pack_index_length,
    pack_path,
    pack_prefix,
    parse_pack_index,
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
PACK_ENTRIES = 256  # entries at most in one pack
PACK_BYTES = 16 * 1024**2  # and bytes (a single entry over it makes a pack of its own)
INDEX_TTL_S = 2.0  # a context's packs are listed again, on a miss, after this long
INDEXED = 1 << 20  # entries the indexes of the contexts' packs hold together
HEAD_READ = 64 * 1024  # bytes of a pack read for its index at first (more if it is longer)
INDEX_READS = 8  # pack heads read at once while a context's packs are listed


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
    """A write waiting in the queue: an entry's (its model, path, bytes and context, the
    identity it counts against), or a touch (``run``)."""

    model: str | None
    run: Callable[[], Any] | None = None
    owner: str = ""
    queued_at: float = field(default_factory=time.monotonic)
    path: str = ""  # an entry write's path (its bytes answer lookups while it waits)
    entry: bytes = b""
    context: _Context | None = None

    @property
    def size(self) -> int:
        """The bytes it holds (an entry's; none for a touch)."""
        return len(self.entry)


@dataclass(slots=True)
class _Pack:
    """A pack as an index knows it: its entries' paths, its MAC, when it was last used."""

    paths: list[str]
    mac: str
    last_used: datetime | None
    seen: float = field(default_factory=time.monotonic)  # when this gateway learnt of it


class _PackGone(Exception):
    """A pack the index names is no longer in the store."""


@dataclass(slots=True)
class _Held:
    """A pack this gateway wrote, in memory, and when the store was last seen holding it."""

    body: bytes
    seen: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Index:
    """The entries of one context's packs, as far as this gateway has listed them."""

    digest: str  # the context's (see hapi.protocol.context_digest)
    members: dict[str, tuple[str, PackMember]] = field(default_factory=dict)  # by entry path
    packs: dict[str, _Pack] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)  # packs whose MAC or index failed
    listed_at: float = -math.inf
    listing: asyncio.Task[bool] | None = None

    @property
    def prefix(self) -> str:
        """Where the context's packs lie."""
        return pack_prefix(self.digest)

    def add(self, key: str, pack: _Pack, members: Mapping[str, PackMember]) -> int:
        """Add a pack; returns how many entries the index gained."""
        self.packs[key] = pack
        before = len(self.members)
        for path, member in members.items():
            self.members[path] = (key, member)
        return len(self.members) - before

    def forget(self, key: str) -> int:
        """Drop a pack (deleted, or found gone); returns how many entries went with it."""
        pack = self.packs.pop(key, None)
        if pack is None:
            return 0
        gone = [path for path in pack.paths if self.members.get(path, ("",))[0] == key]
        for path in gone:
            del self.members[path]
        return len(gone)


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
        self._indexes: OrderedDict[Hashable, _Index] = OrderedDict()  # by context
        self._indexed = 0  # entries the indexes hold together
        self._resident: OrderedDict[str, _Held] = OrderedDict()  # packs written here, by key
        self.resident_bytes = 0  # bounded by cache_memory_bytes
        if metrics is not None:
            metrics.cache_memory.set_function(lambda: float(self.resident_bytes))

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
        index = self._index(context)
        located = index.members.get(path)
        if located is None and time.monotonic() - index.listed_at >= INDEX_TTL_S:
            if not await self._relist(index):
                self._count(manifest, "miss")  # the store's trouble, not the entry's: no streak
                return None
            located = index.members.get(path)
        if located is None:
            return self._outcome(manifest, context, identity, "miss")
        return await self._read(manifest, context, identity, index, *located)

    async def _read(
        self,
        manifest: Manifest,
        context: Hashable,
        identity: ObjectIdentity,
        index: _Index,
        key: str,
        member: PackMember,
    ) -> Cached | None:
        """One entry's bytes from its pack (from memory, or a ranged GET), checked against
        the index."""
        try:
            body = await self._entry_bytes(manifest, index, key, member)
        except _PackGone:
            return self._outcome(manifest, context, identity, "miss")
        if body is None:  # the store's trouble, not the entry's: counted, no streak
            return None
        if len(body) != member.length or hashlib.sha256(body).hexdigest() != member.sha256:
            self._warn("rejected", f"a cache entry not as its pack's index says was ignored: {key}")
            return self._outcome(manifest, context, identity, "rejected")
        cached = _parse(body)
        if cached is None:
            self._warn("corrupt", f"an unreadable cache entry in {key} was ignored")
            return self._outcome(manifest, context, identity, "miss")
        self._maybe_touch(key, index.packs.get(key))
        return self._outcome(manifest, context, identity, "hit", cached)

    async def _entry_bytes(
        self, manifest: Manifest, index: _Index, key: str, member: PackMember
    ) -> bytes | None:
        """An entry's bytes: from this gateway's copy of its pack while the store was seen
        holding it less than ``INDEX_TTL_S`` ago, else a ranged GET (which sees it again);
        ``None`` when the store could not answer (warned; a failed status counted a miss).

        Raises:
            _PackGone: The store no longer holds the pack (it left the index and memory).
        """
        last = member.offset + member.length - 1
        held = self._resident.get(key)
        if held is not None and time.monotonic() - held.seen < INDEX_TTL_S:
            return held.body[member.offset : last + 1]
        try:
            reply = await self._store.request(
                "GET", self._bucket, key, headers={"range": f"bytes={member.offset}-{last}"}
            )
        except httpx.TransportError as exc:
            self._warn("read", f"the feature cache cannot be read ({exc!r}); computing instead")
            return None
        if reply.status_code == 404:  # evicted, or the cache emptied
            self._forget_in(index, key)
            raise _PackGone(key)
        if reply.status_code not in (200, 206):
            self._warn("read", f"the feature cache answered HTTP {reply.status_code}; computing")
            self._count(manifest, "miss")
            return None
        if held is not None:  # the store still holds it
            held.seen = time.monotonic()
        if reply.status_code == 206:
            return reply.content
        return reply.content[member.offset : last + 1]

    def _index(self, context: Hashable) -> _Index:
        """The index of ``context``'s packs (a new, unlisted one the first time), the most
        recently used; the least recently used go while the indexes hold over ``INDEXED``."""
        index = self._indexes.get(context)
        if index is None:
            assert isinstance(context, _Context)
            index = self._indexes[context] = _Index(_context_digest(context))
        self._indexes.move_to_end(context)
        while self._indexed > INDEXED and len(self._indexes) > 1:
            _, dropped = self._indexes.popitem(last=False)
            self._indexed -= len(dropped.members)
        return index

    async def _relist(self, index: _Index) -> bool:
        """List the context's packs again (the lookups asking at once share one listing);
        ``False`` when the store could not be listed."""
        if index.listing is None:
            index.listing = asyncio.ensure_future(self._list_packs(index))
        return await asyncio.shield(index.listing)

    async def _list_packs(self, index: _Index) -> bool:
        started = time.monotonic()
        try:
            listed = {
                item.key: item.last_modified
                async for item in self._store.list_objects(self._bucket, index.prefix)
                if is_pack(item.key)
            }
            for key in [k for k, p in index.packs.items() if k not in listed and p.seen < started]:
                self._forget_in(index, key)  # deleted since (a pack written here while the
                # listing ran may be missing from it: kept)
            for key, used in listed.items():
                if key in index.packs:
                    index.packs[key].last_used = used
            unread = [k for k in listed if k not in index.packs and k not in index.refused]
            limit = asyncio.Semaphore(INDEX_READS)

            async def head(key: str) -> None:
                async with limit:
                    found = await self._pack_head(key, index.refused)
                if found is None:
                    return
                mac, members = found
                pack = _Pack(list(members), mac, listed[key])
                self._indexed += index.add(key, pack, members)

            await asyncio.gather(*(head(key) for key in unread))
            return True
        except (BackendError, httpx.TransportError) as exc:
            self._warn("read", f"the feature cache cannot be listed ({exc!r}); computing instead")
            return False
        finally:
            index.listed_at = time.monotonic()
            index.listing = None

    async def _pack_head(
        self, key: str, refused: set[str]
    ) -> tuple[str, dict[str, PackMember]] | None:
        """A pack's MAC and members, from its head; ``None`` when it is gone or could not
        be read now (the next listing tries again), or (with a warning, and the pack added
        to ``refused``, never read again) when its MAC does not hold or it is no pack."""
        reply = await self._store.request(
            "GET", self._bucket, key, headers={"range": f"bytes=0-{HEAD_READ - 1}"}
        )
        if reply.status_code not in (200, 206):
            if reply.status_code != 404:
                self._warn("read", f"a cache pack's head answered HTTP {reply.status_code}")
            return None
        head, mac = reply.content, reply.headers.get(MAC_HEADER, "")
        try:
            end = PACK_HEAD + pack_index_length(head)
            if len(head) < end:
                more = await self._store.request(
                    "GET", self._bucket, key, headers={"range": f"bytes={len(head)}-{end - 1}"}
                )
                if more.status_code != 206 or more.headers.get(MAC_HEADER, "") != mac:
                    return None  # rewritten meanwhile: read it on the next listing
                head += more.content
            raw = head[PACK_HEAD:end]
            if not hmac.compare_digest(mac, self._mac(key, hashlib.sha256(raw).digest())):
                self._warn("forged", f"a cache pack without a valid MAC was ignored: {key}")
                refused.add(key)
                return None
            return mac, parse_pack_index(raw)
        except ValueError as exc:
            self._warn("corrupt", f"an unreadable cache pack {key} was ignored: {exc}")
            refused.add(key)
            return None

    def _forget(self, key: str) -> None:
        """A pack is gone: its entries leave every index, and its bytes memory."""
        for index in self._indexes.values():
            self._indexed -= index.forget(key)
        self._unhold(key)

    def _forget_in(self, index: _Index, key: str) -> None:
        """A pack of ``index``'s context is gone: its entries leave the index, and its
        bytes memory."""
        self._indexed -= index.forget(key)
        self._unhold(key)

    def _hold(self, key: str, body: bytes) -> None:
        """Keep a pack written here in memory, dropping the least recently written
        beyond ``cache_memory_bytes``."""
        limit = self._settings.cache_memory_bytes
        if len(body) > limit:
            return
        self._resident[key] = _Held(body)
        self.resident_bytes += len(body)
        while self.resident_bytes > limit:
            self._unhold(next(iter(self._resident)))

    def _unhold(self, key: str) -> None:
        held = self._resident.pop(key, None)
        if held is not None:
            self.resident_bytes -= len(held.body)

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

    def _mac(self, key: str, digest: bytes) -> str:
        """The MAC of a pack: its path (so its context) and its index's SHA-256 ``digest``
        (the index names each entry's path and SHA-256)."""
        message = b"hapi cache pack\n" + key.encode() + b"\n" + digest
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
        context = _context(identity.bucket, manifest, split, dtype, view)
        job = _Job(model, owner=owner, path=path, entry=entry, context=context)
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
            jobs = [job]
            try:
                await self._when_idle(job)
                if job.run is None:  # an entry: packed with the others waiting behind it
                    jobs += self._waiting_behind(job)
                    await self._write_packs([j for j in jobs if j.run is None])
                for touch in jobs:
                    if touch.run is not None:
                        await touch.run()
            except Exception as exc:  # a failed write never reaches a request
                self._warn("write", f"a feature cache write failed: {exc!r}")
            finally:
                for done in jobs:
                    self._done(done)

    def _waiting_behind(self, first: _Job) -> list[_Job]:
        """The jobs queued now, taken out of the queue while the entries among them fit a
        pack beside ``first`` (``PACK_ENTRIES``, ``PACK_BYTES``)."""
        taken, entries, size = [], 1, first.size
        while not self._queue.empty() and entries < PACK_ENTRIES and size < PACK_BYTES:
            job = self._queue.get_nowait()
            taken.append(job)
            if job.run is None:
                entries, size = entries + 1, size + job.size
        return taken

    async def _write_packs(self, jobs: Sequence[_Job]) -> None:
        """One pack a context, of the entries ``jobs`` write, each pack at most
        ``PACK_BYTES`` (an entry over it alone); a pack that fails counts its entries as
        failed, and the others are still written."""
        try:
            await self._ensure_bucket()
        except Exception as exc:
            self._failed(jobs, repr(exc))
            return
        for context, members in _packs(jobs):
            try:
                await self._put(context, members)
            except Exception as exc:
                self._failed(members, repr(exc))

    async def _put(self, context: _Context, jobs: Sequence[_Job]) -> None:
        index = self._index(context)
        body, listed = encode_pack([(job.path, job.entry) for job in jobs])
        stamp = int(time.time() * 1000)
        key = pack_path(index.digest, stamp_ms=stamp, nonce=secrets.token_hex(4))
        mac = self._mac(key, hashlib.sha256(listed).digest())
        headers = {
            "content-type": "application/octet-stream",
            "content-length": str(len(body)),
            MAC_HEADER: mac,
        }
        # The payload goes unsigned (UNSIGNED-PAYLOAD): neither side hashes the whole pack
        # again, and what it holds is checked where it is read, every entry against the
        # index's SHA-256 and the index against the MAC.
        reply = await self._store.request("PUT", self._bucket, key, headers=headers, content=body)
        if reply.status_code != 200:
            if reply.status_code == 404:  # the bucket went away: create it on the next write
                self._bucket_checked = False
            self._failed(jobs, f"HTTP {reply.status_code}")
            return
        members = parse_pack_index(listed)
        self._indexed += index.add(key, _Pack(list(members), mac, datetime.now(UTC)), members)
        self._hold(key, body)
        for job in jobs:
            self._count_write(job.model or "", "written", len(job.entry))

    def _failed(self, jobs: Sequence[_Job], reason: str) -> None:
        for job in jobs:
            self._count_write(job.model or "", "failed")
        self._warn("write", f"a feature cache write failed: {reason}")

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

    def _maybe_touch(self, key: str, pack: _Pack | None) -> None:
        if pack is None or pack.last_used is None:
            return
        now = datetime.now(UTC)
        if (now - pack.last_used).total_seconds() < self._settings.cache_touch_s:
            return
        if self._enqueue(_Job(None, lambda: self._touch(key, pack.mac))):  # full: skipped
            pack.last_used = now

    async def _touch(self, key: str, mac: str) -> None:
        source = f"/{self._bucket}/{key}"
        headers = {
            "x-amz-copy-source": quote(source),
            "x-amz-metadata-directive": "REPLACE",
            MAC_HEADER: mac,  # replaced metadata keeps the pack's MAC
        }
        reply = await self._store.request("PUT", self._bucket, key, headers=headers)
        if reply.status_code == 404:  # deleted meanwhile (another gateway, or the CLI)
            self._forget(key)

    # -- eviction ----------------------------------------------------------------------

    async def _evictor(self) -> None:
        while True:
            await asyncio.sleep(self._settings.cache_prune_interval_s)
            try:
                await self.evict()
            except Exception as exc:
                self._warn("evict", f"feature cache eviction failed: {exc!r}")

    async def evict(self) -> int:
        """Delete least-recently-used packs until the rest fit ``cache_max_bytes``;
        returns how many were deleted."""
        entries = [entry async for entry in self._entries()]
        doomed = eviction_order(entries, self._settings.cache_max_bytes)
        for entry in doomed:
            await self._store.request("DELETE", self._bucket, entry.key)
            self._forget(entry.key)
        return len(doomed)

    async def _entries(self) -> AsyncIterator[CacheEntry]:
        """Every pack (and entry of its own), from the store's listing (none when the
        listing fails: eviction waits for the next round)."""
        try:
            for prefix in CACHE_PREFIXES:
                async for item in self._store.list_objects(self._bucket, prefix):
                    if is_cached(item.key) and item.last_modified is not None:
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


class _Context(NamedTuple):
    """What a lookup's entry shares with its neighbours' but for the object: its bucket and
    the cache key's other inputs (models that share blocks to the split share it too)."""

    bucket: str
    blocks: tuple[str, ...]
    preset: Preset
    dtype: str
    augmented: str | None  # the view, as canonical JSON


def _packs(jobs: Sequence[_Job]) -> list[tuple[_Context, list[_Job]]]:
    """``jobs`` (entry writes) grouped into packs: by context, in order, a new pack where
    the next entry would take the pack over ``PACK_BYTES``."""
    packs: list[tuple[_Context, list[_Job]]] = []
    open_packs: dict[_Context, tuple[list[_Job], int]] = {}  # the pack filling, its bytes
    for job in jobs:
        assert job.context is not None
        members, size = open_packs.get(job.context, ([], 0))
        if members and size + job.size > PACK_BYTES:
            members, size = [], 0
        if not members:
            packs.append((job.context, members))
        members.append(job)
        open_packs[job.context] = (members, size + job.size)
    return packs


def _context_digest(context: _Context) -> str:
    """The digest naming ``context``'s packs (:func:`hapi.protocol.context_digest`)."""
    return context_digest(
        context.bucket,
        blocks=context.blocks,
        preprocess=_preset(context.preset),
        dtype=context.dtype,
        view=None if context.augmented is None else json.loads(context.augmented),
    )


def _context(
    bucket: str, manifest: Manifest, split: int, dtype: str, view: Mapping[str, Any] | None
) -> _Context:
    augmented = None if view is None else json.dumps(view, sort_keys=True)
    return _Context(bucket, tuple(manifest.hashes[:split]), manifest.preprocess, dtype, augmented)


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
    """One object's features as a cache entry: safetensors in the wire dtype, kept
    without its zero words where that is smaller (:func:`hapi.protocol.compact_entry`)."""
    meta = {"keys": json.dumps(keys)}
    if samples_meta is not None:
        meta["samples"] = json.dumps(samples_meta)
    if views is not None:
        meta["views"] = json.dumps(views)
    body = bytes(encode_features(features, dtype=dtype, labels=labels, metadata=meta))
    return compact_entry(body, WIRE_ITEMSIZE[dtype])


def _parse(body: bytes) -> Cached | None:
    try:
        tensors, meta = decode_features(expand_entry(body))
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
