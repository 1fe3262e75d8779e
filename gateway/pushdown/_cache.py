"""The feature cache, as the gateway uses it: look entries up, write them in the background.

The layout (keys, paths, eviction order) is ``hapi.models``' contract; this module does
the I/O with the gateway's own upstream client and backend credentials. Nothing here may
fail a request: a cache bucket that is missing, full or unreadable degrades to computing,
with one warning per kind of failure. Writes go through a bounded queue drained by one
background task; a full queue skips the write rather than delay an answer. A hit on an
entry not touched for ``cache_touch_s`` is refreshed in the background (a copy onto
itself), so ``LastModified`` tracks last use for least-recently-used eviction, which a
background task applies when ``cache_max_bytes`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlencode
from xml.etree import ElementTree

import httpx
import numpy as np

from hapi.models import Manifest
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

from .._metrics import Metrics
from .._settings import GatewaySettings
from ..edge._addressing import object_path
from ..edge._sigv4 import UNSIGNED_PAYLOAD, sign_request

logger = logging.getLogger("hapi.gateway.cache")
_S3 = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@dataclass(frozen=True)
class Cached:
    """One entry's content: features (float32 arrays of the wire dtype's values), labels,
    the samples' keys and per-sample metadata."""

    features: np.ndarray
    labels: np.ndarray | None
    keys: list[str]
    samples_meta: list[dict[str, Any]] | None
    nbytes: int


class FeatureCache:
    """Entries in the cache bucket, read and written through the upstream client.

    Args:
        settings: Gateway settings (backend, credentials, the cache's bucket and limits).
        client: Getter of the upstream HTTP client.
        metrics: Where hits, misses, bytes and writes are counted.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        client: Callable[[], httpx.AsyncClient],
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self._client = client
        self._metrics = metrics
        self._queue: asyncio.Queue[tuple[str, Callable[[], Any]]] = asyncio.Queue(
            maxsize=max(1, settings.cache_write_queue)
        )
        self._warned: set[str] = set()
        self._bucket_checked = False
        self.enabled = settings.cache_enabled
        self.skipped_writes = 0

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
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def drain(self) -> None:
        """Wait until every queued write is done (tests, shutdown)."""
        await self._queue.join()

    # -- reads -------------------------------------------------------------------------

    async def identify(
        self, bucket: str, key: str, *, signed: bool = True
    ) -> ObjectIdentity | None:
        """The object's identity from a HEAD, signed the way the caller's own GET would be
        (unsigned for an anonymous caller, so the store judges whether it may read the
        object before any cached features are served); ``None`` when the HEAD fails, so
        the caller's own GET reports the error exactly as without the cache."""
        url = self._settings.backend_url + object_path(bucket, key)
        headers = self._signed("HEAD", url) if signed else {}
        try:
            reply = await self._client().head(url, headers=headers)
        except httpx.TransportError:
            return None
        if reply.status_code != 200:
            return None
        return identity_from(bucket, key, reply.headers)

    async def lookup(
        self, identity: ObjectIdentity, manifest: Manifest, split: int, dtype: str
    ) -> Cached | None:
        """The cached features, or ``None`` on a miss (or when the cache cannot be read)."""
        if not self.enabled:
            return None
        path = entry_path(_key(identity, manifest, split, dtype))
        url = self._entry_url(path)
        try:
            reply = await self._client().get(url, headers=self._signed("GET", url))
        except httpx.TransportError as exc:
            self._warn("read", f"the feature cache cannot be read ({exc!r}); computing instead")
            return None
        if reply.status_code == 404:
            self._count(manifest, "miss")
            return None
        if reply.status_code != 200:
            self._warn("read", f"the feature cache answered HTTP {reply.status_code}; computing")
            self._count(manifest, "miss")
            return None
        cached = _parse(reply.content)
        if cached is None:
            self._warn("corrupt", f"an unreadable cache entry {path} was ignored")
            self._count(manifest, "miss")
            return None
        self._count(manifest, "hit", cached.nbytes)
        self._maybe_touch(path, reply.headers.get("last-modified"))
        return cached

    # -- writes ------------------------------------------------------------------------

    def store(
        self,
        identity: ObjectIdentity,
        manifest: Manifest,
        split: int,
        dtype: str,
        entry: bytes,
    ) -> bool:
        """Queue ``entry`` (safetensors, see :func:`encode_entry`) for writing; ``False``
        when the queue is full and the write was skipped."""
        if not self.enabled:
            return False
        path = entry_path(_key(identity, manifest, split, dtype))
        model = manifest.name
        if not self._enqueue(path, lambda: self._put(path, entry, model)):
            self.skipped_writes += 1
            self._count_write(model, "skipped")
            return False
        return True

    def _enqueue(self, path: str, job: Callable[[], Any]) -> bool:
        try:
            self._queue.put_nowait((path, job))
        except asyncio.QueueFull:
            return False
        if self._metrics is not None:
            self._metrics.cache_writes_pending.inc()
        return True

    async def _writer(self) -> None:
        while True:
            _path, job = await self._queue.get()
            try:
                await job()
            except Exception as exc:  # a failed write never reaches a request
                self._warn("write", f"a feature cache write failed: {exc!r}")
            finally:
                self._queue.task_done()
                if self._metrics is not None:
                    self._metrics.cache_writes_pending.dec()

    async def _put(self, path: str, body: bytes, model: str) -> None:
        await self._ensure_bucket()
        url = self._entry_url(path)
        digest = hashlib.sha256(body).hexdigest()
        headers = self._signed(
            "PUT",
            url,
            {"content-type": "application/octet-stream", "content-length": str(len(body))},
            digest,
        )
        reply = await self._client().put(url, headers=headers, content=body)
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
        url = f"{self._settings.backend_url}/{quote(self._settings.cache_bucket)}"
        reply = await self._client().head(url, headers=self._signed("HEAD", url))
        if reply.status_code == 404:
            created = await self._client().put(url, headers=self._signed("PUT", url))
            if created.status_code not in (200, 409):
                raise RuntimeError(
                    f"cannot create the cache bucket {self._settings.cache_bucket!r}: "
                    f"HTTP {created.status_code}"
                )
        self._bucket_checked = True

    def _maybe_touch(self, path: str, last_modified: str | None) -> None:
        if last_modified is None:
            return
        try:
            age = (datetime.now(UTC) - parsedate_to_datetime(last_modified)).total_seconds()
        except (TypeError, ValueError):
            return
        if age < self._settings.cache_touch_s:
            return
        self._enqueue(path, lambda: self._touch(path))  # a full queue skips the record

    async def _touch(self, path: str) -> None:
        url = self._entry_url(path)
        source = f"/{self._settings.cache_bucket}/{path}"
        headers = self._signed(
            "PUT",
            url,
            {"x-amz-copy-source": quote(source), "x-amz-metadata-directive": "REPLACE"},
        )
        await self._client().put(url, headers=headers)

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
            url = self._entry_url(entry.key)
            await self._client().delete(url, headers=self._signed("DELETE", url))
        return len(doomed)

    async def _entries(self) -> AsyncIterator[CacheEntry]:
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": ENTRY_PREFIX}
            if token:
                query["continuation-token"] = token
            url = f"{self._settings.backend_url}/{quote(self._settings.cache_bucket)}?" + urlencode(
                sorted(query.items()), quote_via=quote
            )
            reply = await self._client().get(url, headers=self._signed("GET", url))
            if reply.status_code != 200:
                return
            root = ElementTree.fromstring(reply.content)
            for item in root.iter(f"{_S3}Contents"):
                key = item.findtext(f"{_S3}Key") or ""
                if is_entry(key):
                    stamp = item.findtext(f"{_S3}LastModified") or ""
                    used = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
                    yield CacheEntry(key, int(item.findtext(f"{_S3}Size") or 0), used)
            token = root.findtext(f"{_S3}NextContinuationToken")
            if root.findtext(f"{_S3}IsTruncated") != "true" or not token:
                return

    # -- helpers -----------------------------------------------------------------------

    def _entry_url(self, path: str) -> str:
        return self._settings.backend_url + object_path(self._settings.cache_bucket, path)

    def _signed(
        self,
        method: str,
        url: str,
        headers: dict[str, str] | None = None,
        payload_sha256: str | None = None,
    ) -> dict[str, str]:
        return sign_request(
            method=method,
            url=url,
            headers=headers or {},
            credentials=self._settings.backend_credentials,
            region=self._settings.region,
            payload_sha256=payload_sha256 or UNSIGNED_PAYLOAD,
        )

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning(message)

    def _count(self, manifest: Manifest, result: str, nbytes: int = 0) -> None:
        if self._metrics is not None:
            self._metrics.cache_lookups.labels(manifest.name, result).inc()
            if nbytes:
                self._metrics.cache_bytes.labels(manifest.name, "read").inc(nbytes)

    def _count_write(self, model: str, outcome: str, nbytes: int = 0) -> None:
        if self._metrics is not None:
            self._metrics.cache_writes.labels(model, outcome).inc()
            if nbytes:
                self._metrics.cache_bytes.labels(model, "written").inc(nbytes)


def identity_from(bucket: str, key: str, headers: httpx.Headers) -> ObjectIdentity | None:
    """An object's identity from a GET or HEAD response's headers (``None`` without an
    ETag: such an object cannot be cached safely)."""
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
) -> bytes:
    """One object's features as a cache entry (safetensors in the wire dtype)."""
    meta = {"keys": json.dumps(keys)}
    if samples_meta is not None:
        meta["samples"] = json.dumps(samples_meta)
    return bytes(encode_features(features, dtype=dtype, labels=labels, metadata=meta))


def _parse(body: bytes) -> Cached | None:
    try:
        tensors, meta = decode_features(body)
        keys = json.loads(meta.get("keys", "[]"))
        samples = json.loads(meta["samples"]) if "samples" in meta else None
        features = tensors["features"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(keys, list) or len(keys) != len(features):
        return None
    return Cached(features, tensors.get("labels"), keys, samples, len(body))


def _key(identity: ObjectIdentity, manifest: Manifest, split: int, dtype: str) -> str:
    """The cache key of ``identity``'s features through ``manifest``'s blocks ``[0, split)``."""
    return cache_key(
        identity,
        blocks=manifest.hashes[:split],
        preprocess=manifest.preprocess.to_dict(),
        dtype=dtype,
    )
