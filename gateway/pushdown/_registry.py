"""The gateway's own reads of the model registry: async, over the upstream client.

Manifests and blocks are GETs on the registry bucket through the gateway's one store
client (:class:`hapi.gateway._store.StoreClient`), so no thread waits on a blocking client.
The layout is ``hapi.protocol``'s contract, and the reads' steps (parsing, validation)
are :class:`hapi.models.RegistryReads`, shared with the blocking registry; this module does
only the I/O, and reports failures as ``hapi.models``' errors (``NoSuchModel``, ``RegistryError``) exactly as
:class:`hapi.models.Registry` does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator, Iterator
from typing import Any, Protocol, TypeVar

import httpx

from hapi.models import Manifest, NoSuchModel, RegistryError, RegistryReads
from hapi.protocol import MODELS_PREFIX, model_names

from .._errors import BackendError
from .._store import StoreClient, backend_error

__all__ = ["AsyncRegistry", "StoreRegistry"]

_LIST_CONCURRENCY = 8  # manifests read at once when listing every model
T = TypeVar("T")


class AsyncRegistry(Protocol):
    """What serving needs of the registry (:class:`StoreRegistry` is one; tests pass an
    in-memory one)."""

    async def get_manifest(self, ref: str) -> Manifest:
        """The manifest of ``NAME`` (latest) or ``NAME@VERSION``; raises NoSuchModel."""
        ...

    async def list_models(self) -> list[Manifest]:
        """The latest manifest of every model."""
        ...

    async def fetch_blocks(self, manifest: Manifest, start: int, stop: int) -> list[bytes | None]:
        """The stored bytes of blocks ``[start, stop)`` (``None`` for a missing one),
        unverified: :func:`hapi.models.assemble_blocks` checks and composes them."""
        ...


class StoreRegistry:
    """The registry bucket of the backend, read with the backend's credentials.

    Args:
        store: The gateway's store client (its settings name the registry bucket).
    """

    def __init__(self, store: StoreClient) -> None:
        self._store = store
        self.bucket = store.settings.registry_bucket

    async def get_manifest(self, ref: str) -> Manifest:
        """The manifest of ``NAME`` (latest version) or ``NAME@VERSION``.

        Raises:
            NoSuchModel: No such model or version.
            InvalidModelSpec: ``ref`` is not a valid reference.
            RegistryError: The store failed or holds an unreadable manifest.
        """
        return await self._read(RegistryReads.manifest(ref))

    async def list_models(self) -> list[Manifest]:
        """The latest manifest of every model, sorted by name."""
        names = model_names(await self._keys(MODELS_PREFIX))
        limit = asyncio.Semaphore(_LIST_CONCURRENCY)  # leave the pool to the data plane

        async def one(name: str) -> Manifest:
            async with limit:
                return await self.get_manifest(name)

        found = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
        manifests = []
        for outcome in found:
            if isinstance(outcome, Manifest):
                manifests.append(outcome)
            elif not isinstance(outcome, NoSuchModel):  # removed while we listed: skipped
                raise outcome
        return manifests

    async def fetch_blocks(self, manifest: Manifest, start: int, stop: int) -> list[bytes | None]:
        """The stored bytes of blocks ``[start, stop)``, fetched together.

        Raises:
            InvalidModelSpec: The range is empty or outside the model.
            RegistryError: The store failed.
        """
        keys = RegistryReads.block_keys(manifest, start, stop)
        return list(await asyncio.gather(*(self._get(key) for key in keys)))

    async def versions(self, name: str) -> list[int]:
        """The stored versions of ``name``, ascending (empty if none)."""
        return await self._read(RegistryReads.versions(name))

    async def _read(self, steps: Generator[Any, Any, T]) -> T:
        return await RegistryReads.arun(steps, self._get, self._keys)

    # -- store primitives: every HTTP failure becomes a RegistryError here --------------

    async def _get(self, key: str) -> bytes | None:
        """The object's bytes; ``None`` when it (or the bucket) does not exist."""
        with _registry_errors(f"cannot read s3://{self.bucket}/{key}"):
            reply = await self._store.request("GET", self.bucket, key)
            if reply.status_code == 404:
                return None
            if reply.status_code != 200:
                raise backend_error(reply.status_code, reply.content, f"/{self.bucket}/{key}")
            return reply.content

    async def _keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (none when the bucket does not exist)."""
        with _registry_errors(f"cannot list s3://{self.bucket}/{prefix}"):
            return [item.key async for item in self._store.list_objects(self.bucket, prefix)]


@contextlib.contextmanager
def _registry_errors(what: str) -> Iterator[None]:
    """The store's failures as the registry's own error (``Code Message``, as botocore's
    errors read)."""
    try:
        yield
    except httpx.HTTPError as exc:
        raise RegistryError(f"{what}: {exc!r}") from exc
    except BackendError as exc:
        raise RegistryError(f"{what}: {exc.code} {exc}") from exc
