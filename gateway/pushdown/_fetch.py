"""Pushdown's step 1: fetch a request's objects and list their samples.

The objects of one request are bounded together by ``max_object_bytes`` and their samples
by ``max_request_samples``; listing reads each image's header (in the decode pool) but no
pixels. A batch keeps per-key failures, so the keys that can be served still are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import httpx

from hapi.models import (
    Manifest,
    PendingSample,
    TooManySamples,
    UndecodableObject,
    list_samples,
)
from hapi.protocol import Augmentation, ObjectIdentity

from .._errors import (
    InvalidRequest,
    S3Error,
    ServiceUnavailable,
    UnprocessableObject,
)
from .._exchange import Incoming
from .._settings import GatewaySettings
from .._store import StoreClient, backend_error
from ._cache import identity_from
from ._locality import FetchMeter

__all__ = ["Listed", "Listing", "ObjectLister"]

_FETCH_CONCURRENCY = 32
Listed = Callable[[str, list[PendingSample]], None]
"""What runs after a key's samples are listed, in the same pool job."""


@dataclass
class Listing:
    """What step 1 found for one request."""

    samples: dict[str, list[PendingSample]] = field(default_factory=dict)
    errors: dict[str, S3Error] = field(default_factory=dict)
    identities: dict[str, ObjectIdentity] = field(default_factory=dict)  # as fetched
    held: int = 0  # object bytes fetched
    counted: int = 0  # samples listed
    fetch_ms: float = 0.0


class ObjectLister:
    """Fetches the objects of pushdown requests and lists their samples.

    Args:
        settings: Gateway settings (limits).
        decode_pool: Worker threads where objects are listed.
        fetches: Counts object fetches by placement.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        decode_pool: Executor,
        fetches: FetchMeter,
    ) -> None:
        self._settings = settings
        self._decode_pool = decode_pool
        self._fetches = fetches

    async def list_all(
        self,
        store: StoreClient,
        bucket: str,
        keys: Sequence[str],
        manifest: Manifest,
        batch: bool,
        augment: Augmentation | None = None,
        then: Listed | None = None,
    ) -> Listing:
        """Fetch ``keys`` through ``store`` (acting as the caller's identity) and list their
        samples (each with its view of ``augment`` drawn, when given); per-key failures of a
        batch are kept in the listing's ``errors``, every other failure is raised.

        ``then(key, samples)`` runs in the pool job that listed a key, after it (images are
        decoded there); what it raises fails that key as listing would."""
        listing = Listing()
        limit = asyncio.Semaphore(_FETCH_CONCURRENCY)

        async def one(key: str) -> None:
            async with limit:
                started = time.perf_counter()
                data = await self._fetch(store, bucket, key, listing, batch)
                listing.fetch_ms = max(listing.fetch_ms, (time.perf_counter() - started) * 1000)
            try:
                listing.samples[key] = await self._list(
                    data, bucket, key, manifest, listing, augment, then
                )
            except S3Error:
                listing.held -= len(data)  # a failed key's bytes are dropped now
                raise

        outcomes = (
            [await _outcome(one(keys[0]))]  # a single GET's one key: no task to gather
            if len(keys) == 1
            else await asyncio.gather(*(one(k) for k in keys), return_exceptions=True)
        )
        for key, outcome in zip(keys, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                continue
            if batch and isinstance(outcome, S3Error) and not isinstance(outcome, InvalidRequest):
                listing.errors[key] = outcome
            else:
                raise outcome
        return listing

    async def _fetch(
        self, store: StoreClient, bucket: str, key: str, listing: Listing, batch: bool
    ) -> bytes:
        # Where the object is (this node or another) is looked up while it is read, and
        # counted once both are done; the fetch never waits for the lookup.
        located = self._fetches.locate(bucket, key)
        data = await self._read(store, bucket, key, listing, batch)
        self._fetches.fetched(located, len(data))
        return data

    async def _read(
        self, store: StoreClient, bucket: str, key: str, listing: Listing, batch: bool
    ) -> bytes:
        # The whole object is needed before listing can start (image headers and tar
        # indexes want random access); the objects of a request are capped together.
        try:
            async with store.stream(bucket, key) as reply:
                if reply.status != 200:
                    raise backend_error(reply.status, await reply.read(), f"/{bucket}/{key}")
                fields = reply.fields()
                identity = identity_from(bucket, key, fields)
                if identity is not None:
                    listing.identities[key] = identity
                declared = int(fields.get("content-length", "0"))
                return await self._read_capped(reply, declared, bucket, key, listing, batch)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"the backend store cannot be reached: {exc!r}", retry_after=1
            ) from exc

    async def _read_capped(
        self, reply: Incoming, declared: int, bucket: str, key: str, listing: Listing, batch: bool
    ) -> bytes:
        self._hold(declared, bucket, key, listing, batch)
        parts, size = [], 0
        async for chunk in reply.body:
            size += len(chunk)
            if size > declared:  # no or a wrong length: hold what arrives, as it arrives
                self._hold(size - max(declared, size - len(chunk)), bucket, key, listing, batch)
            parts.append(chunk)
        return b"".join(parts)

    def _hold(self, size: int, bucket: str, key: str, listing: Listing, batch: bool) -> None:
        limit = self._settings.max_object_bytes
        listing.held += size
        if listing.held <= limit:
            return
        if batch and listing.held - size > 0:
            raise InvalidRequest(
                f"the objects of this batch total more than {limit} bytes, the limit of one "
                "pushdown request (HAPI_MAX_OBJECT_BYTES); ask for fewer keys per batch",
                resource=f"/{bucket}",
            )
        listing.held -= size  # refused unread
        raise UnprocessableObject(
            f"object is over the pushdown limit of {limit} bytes (HAPI_MAX_OBJECT_BYTES)",
            resource=f"/{bucket}/{key}",
        )

    async def _list(
        self,
        data: bytes,
        bucket: str,
        key: str,
        manifest: Manifest,
        listing: Listing,
        augment: Augmentation | None,
        then: Listed | None,
    ) -> list[PendingSample]:
        cap = self._settings.max_request_samples

        def listed() -> list[PendingSample]:
            found = list_samples(
                data,
                key=key,
                max_samples=max(0, cap - listing.counted),
                max_pixels=self._settings.max_image_pixels,
                augment=augment,
            )
            if then is not None:
                then(key, found)
            return found

        try:
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(self._decode_pool, listed)
        except TooManySamples as exc:
            raise _too_many(cap, bucket, key) from exc
        except UndecodableObject as exc:
            raise UnprocessableObject(
                f"{exc} (model {manifest.ref} needs an image or a tar shard)",
                resource=f"/{bucket}/{key}",
            ) from exc
        listing.counted += len(found)
        if listing.counted > cap:
            raise _too_many(cap, bucket, key)
        return found


async def _outcome(work: Awaitable[None]) -> BaseException | None:
    """What ``asyncio.gather(..., return_exceptions=True)`` gives of one awaitable."""
    try:
        await work
    except Exception as exc:
        return exc
    return None


def _too_many(cap: int, bucket: str, key: str) -> InvalidRequest:
    return InvalidRequest(
        f"more than {cap} samples in one pushdown request (HAPI_MAX_REQUEST_SAMPLES); "
        "ask for fewer keys or smaller shards",
        resource=f"/{bucket}/{key}",
    )
