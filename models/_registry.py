"""The content-addressed model registry, kept in a bucket of the S3 store itself.

Layout (DESIGN.md, "Registry layout")::

    blocks/sha256/<hex>.onnx          immutable, shared between models
    models/<name>/<version>.json      a manifest, written after all of its blocks
    models/<name>/latest              the current version, as decimal text

(the keys are built and parsed in :mod:`._layout`, which the gateway's async reader uses
too).
Versions are integers per name, 1 for the first, then one more than the highest that
exists. A manifest is created with ``If-None-Match: *``, so two writers never replace
each other's version; the loser retries with the next number. Readers go through
``latest``, which is written only after the manifest and its blocks, so a reader never
sees a partial model. When the newest version is removed its number may be given out
again: caches should key on block hashes (which is also what lets tenants share a
session), not on ``NAME@VERSION`` alone.

The boto3 S3 client is injected: the registry works the same against SeaweedFS, MinIO,
AWS S3, or the hapi gateway in front of any of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import onnx
from botocore.exceptions import BotoCoreError, ClientError

from hapi.protocol import (
    DEFAULT_REGISTRY_BUCKET,
    MODELS_PREFIX,
    block_key,
    latest_key,
    manifest_key,
    model_names,
    parse_manifest_key,
)

from ._errors import InvalidModelSpec, NoSuchModel, RegistryError, VersionConflict
from ._layout import assemble_blocks, check_block
from ._manifest import ExportedBlock, ExportedModel, Manifest
from ._names import check_name, parse_ref
from ._onnx import sha256
from ._reading import RegistryReads, Steps

_MISSING = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}
_REGISTER_ATTEMPTS = 5
_FETCH_THREADS = 4
T = TypeVar("T")


@dataclass(frozen=True)
class Lineage:
    """Where a model version sits in its family tree (all entries are ``NAME@VERSION``).

    Args:
        model: The version asked about.
        parent: Its direct parent, if any (it may have been removed since).
        ancestors: Parent, grandparent, ... as far as manifests still exist.
        descendants: Every version derived from it, directly or not, breadth first.
    """

    model: str
    parent: str | None
    ancestors: tuple[str, ...]
    descendants: tuple[str, ...]


@dataclass(frozen=True)
class Removal:
    """What :meth:`Registry.remove` deleted."""

    removed: tuple[str, ...]
    deleted_blocks: tuple[str, ...]
    freed_bytes: int


def _manifest(name: str, version: int, model: ExportedModel, parent: str | None) -> Manifest:
    return Manifest(
        name=name,
        version=version,
        family=model.family,
        freeze=model.freeze,
        preprocess=model.preprocess,
        input=model.input,
        blocks=tuple(block.info for block in model.blocks),
        parent=parent,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        exporter=model.exporter,
        weights=model.weights,
        source=model.source,
    )


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class RegistryReader(Protocol):
    """What serving needs of a registry (:class:`Registry` is one; tests pass others)."""

    def get_manifest(self, ref: str) -> Manifest:
        """The manifest of ``NAME`` (latest) or ``NAME@VERSION``; raises NoSuchModel."""
        ...

    def list_models(self) -> list[Manifest]:
        """The latest manifest of every model."""
        ...

    def load_blocks(self, manifest: Manifest, start: int, stop: int) -> onnx.ModelProto:
        """Blocks ``[start, stop)`` of ``manifest`` composed into one graph."""
        ...


class Registry:
    """Models as ONNX blocks in an S3 bucket.

    Args:
        client: A boto3 S3 client (the seam: any endpoint, any credentials).
        bucket: The registry bucket; created on first :meth:`register`.
    """

    def __init__(self, client: Any, bucket: str = DEFAULT_REGISTRY_BUCKET) -> None:
        self._client = client
        self.bucket = bucket

    # -- store primitives: every botocore error is translated here -------------------

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except ClientError as exc:
            message = exc.response.get("Error", {}).get("Message", "")
            raise RegistryError(f"{what}: {_code(exc)} {message}".strip()) from exc
        except BotoCoreError as exc:
            raise RegistryError(f"{what}: {exc}") from exc

    def _get(self, key: str) -> bytes | None:
        with self._errors(f"cannot read s3://{self.bucket}/{key}"):
            try:
                response = self._client.get_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    return None
                raise
            return bytes(response["Body"].read())

    def _exists(self, key: str) -> bool:
        with self._errors(f"cannot stat s3://{self.bucket}/{key}"):
            try:
                self._client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if _code(exc) in _MISSING:
                    return False
                raise
            return True

    def _put(self, key: str, body: bytes, *, create_only: bool = False) -> None:
        extra = {"IfNoneMatch": "*"} if create_only else {}
        with self._errors(f"cannot write s3://{self.bucket}/{key}"):
            try:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=body, **extra)
            except ClientError as exc:
                if create_only and _code(exc) in {"PreconditionFailed", "412"}:
                    raise VersionConflict(f"{key} already exists") from exc
                raise

    def _delete(self, key: str) -> None:
        with self._errors(f"cannot delete s3://{self.bucket}/{key}"):
            self._client.delete_object(Bucket=self.bucket, Key=key)

    def _keys(self, prefix: str) -> Iterator[str]:
        with self._errors(f"cannot list s3://{self.bucket}/{prefix}"):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            try:
                for page in pages:
                    yield from (item["Key"] for item in page.get("Contents", []))
            except ClientError as exc:
                if _code(exc) not in _MISSING:
                    raise

    def ensure_bucket(self) -> None:
        """Create the registry bucket if it does not exist yet."""
        with self._errors(f"cannot create bucket {self.bucket}"):
            try:
                self._client.head_bucket(Bucket=self.bucket)
                return
            except ClientError as exc:
                if _code(exc) not in _MISSING:
                    raise
            arguments: dict[str, Any] = {"Bucket": self.bucket}
            region = self._client.meta.region_name
            if region not in (None, "us-east-1"):  # AWS wants the region of all but one
                arguments["CreateBucketConfiguration"] = {"LocationConstraint": region}
            try:
                self._client.create_bucket(**arguments)
            except ClientError as exc:
                if _code(exc) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                    raise

    # -- writing ----------------------------------------------------------------------

    def has_block(self, digest: str) -> bool:
        """Whether ``blocks/sha256/<digest>.onnx`` is stored."""
        return self._exists(block_key(digest))

    def _upload(self, blocks: Sequence[ExportedBlock]) -> None:
        for digest, data in {b.info.hash: b.data for b in blocks}.items():
            if not self.has_block(digest):
                self._put(block_key(digest), data)

    def register(self, name: str, model: ExportedModel, *, parent: str | None = None) -> Manifest:
        """Store an exported model as the next version of ``name``.

        Blocks already stored (by any model) are not uploaded again, so a model derived
        from another costs only the bytes of the blocks that changed. When the latest
        version of ``name`` already holds the same content (blocks, freeze, preprocessing,
        parent, weights' origin), that version is returned and nothing new is written.

        Args:
            name: Model name (see :func:`check_name`).
            model: The output of :func:`hapi.models.export_model`.
            parent: ``NAME`` or ``NAME@VERSION`` of the model this one derives from.

        Returns:
            The manifest as stored.

        Raises:
            InvalidModelSpec: Invalid name, or a block whose bytes do not match its hash.
            NoSuchModel: ``parent`` does not exist.
            RegistryError: The store failed.
        """
        check_name(name)
        parent_ref = self.get_manifest(parent).ref if parent else None
        for index, block in enumerate(model.blocks):
            if sha256(block.data) != block.info.hash:
                raise InvalidModelSpec(f"block {index} of {name}: bytes do not match its hash")
        if (existing := self._identical_latest(name, model, parent_ref)) is not None:
            self._upload(model.blocks)  # a concurrent remove() may have collected one
            return existing
        self.ensure_bucket()
        self._upload(model.blocks)
        manifest = self._create_manifest(name, model, parent_ref)
        # A concurrent remove() may have collected a shared block after the check above;
        # put it back before anyone is pointed at this version.
        self._upload(model.blocks)
        self._put(latest_key(name), str(max(self.versions(name))).encode())
        return manifest

    def _identical_latest(
        self, name: str, model: ExportedModel, parent: str | None
    ) -> Manifest | None:
        try:
            latest = self.get_manifest(name)
        except NoSuchModel:
            return None
        return latest if latest.same_content(_manifest(name, 1, model, parent)) else None

    def _create_manifest(self, name: str, model: ExportedModel, parent: str | None) -> Manifest:
        for _ in range(_REGISTER_ATTEMPTS):
            manifest = _manifest(name, max(self.versions(name), default=0) + 1, model, parent)
            try:
                key = manifest_key(name, manifest.version)
                self._put(key, manifest.to_json().encode(), create_only=True)
                return manifest
            except VersionConflict:
                continue
        raise VersionConflict(
            f"{name}: gave up after {_REGISTER_ATTEMPTS} concurrent registrations"
        )

    # -- reading ----------------------------------------------------------------------

    def versions(self, name: str) -> list[int]:
        """The stored versions of ``name``, ascending (empty if none)."""
        return self._read(RegistryReads.versions(name))

    def get_manifest(self, ref: str) -> Manifest:
        """The manifest of ``NAME`` (latest version) or ``NAME@VERSION``.

        Raises:
            NoSuchModel: No such model or version.
            InvalidModelSpec: ``ref`` is not a valid reference.
            RegistryError: The store failed or holds an unreadable manifest.
        """
        return self._read(RegistryReads.manifest(ref))

    def _read(self, steps: Steps[T]) -> T:
        return RegistryReads.run(steps, self._get, self._keys)

    def list_models(self) -> list[Manifest]:
        """The latest manifest of every model, sorted by name."""
        names = model_names(self._keys(MODELS_PREFIX))
        manifests = []
        for name in names:
            try:
                manifests.append(self.get_manifest(name))
            except NoSuchModel:  # removed while we listed
                continue
        return manifests

    def _all_manifests(self) -> list[Manifest]:
        manifests = []
        for key in self._keys(MODELS_PREFIX):
            data = self._get(key) if parse_manifest_key(key) else None
            if data is not None:
                manifests.append(Manifest.from_json(data))
        return manifests

    def lineage(self, ref: str) -> Lineage:
        """Parent, ancestors and descendants of a model version.

        Raises:
            NoSuchModel: ``ref`` does not exist.
        """
        manifest = self.get_manifest(ref)
        ancestors: list[str] = []
        current = manifest.parent
        while current is not None and current not in ancestors:
            try:
                parent = self.get_manifest(current).parent
            except NoSuchModel:
                break
            ancestors.append(current)
            current = parent
        children: dict[str, list[str]] = {}
        for other in sorted(self._all_manifests(), key=lambda m: (m.name, m.version)):
            if other.parent is not None:
                children.setdefault(other.parent, []).append(other.ref)
        descendants: list[str] = []
        queue = deque([manifest.ref])
        while queue:
            for child in children.get(queue.popleft(), []):
                if child not in descendants:
                    descendants.append(child)
                    queue.append(child)
        return Lineage(manifest.ref, manifest.parent, tuple(ancestors), tuple(descendants))

    def common_prefix(self, a: str | Manifest, b: str | Manifest) -> int:
        """How many leading blocks two models share (identical hashes, in order).

        One storage-side session over blocks ``[0, n)`` can serve tenants of both.
        """
        first = a if isinstance(a, Manifest) else self.get_manifest(a)
        second = b if isinstance(b, Manifest) else self.get_manifest(b)
        shared = 0
        for x, y in zip(first.hashes, second.hashes, strict=False):
            if x != y:
                break
            shared += 1
        return shared

    def fetch_block(self, manifest: Manifest, index: int) -> bytes:
        """The verified bytes of block ``index`` of ``manifest``.

        Raises:
            CorruptBlock: The stored bytes are missing or do not hash to the manifest's digest.
        """
        return check_block(manifest, index, self._get(block_key(manifest.blocks[index].hash)))

    def load_blocks(
        self, manifest: Manifest, start: int = 0, stop: int | None = None
    ) -> onnx.ModelProto:
        """Fetch blocks ``[start, stop)`` only, verify them, and compose one graph.

        The graph's input is ``input`` and its output ``output``, both with a dynamic
        batch dimension; feed it to :func:`hapi.models.create_session`.

        Raises:
            InvalidModelSpec: The range is empty or outside the model.
            CorruptBlock: A block fails verification; nothing is composed.
        """
        stop = len(manifest.blocks) if stop is None else stop
        RegistryReads.block_keys(manifest, start, stop)  # checks the range first
        indices = range(start, stop)
        with ThreadPoolExecutor(_FETCH_THREADS) as pool:
            blobs = list(pool.map(lambda i: self.fetch_block(manifest, i), indices))
        return assemble_blocks(manifest, start, blobs)

    # -- removing ---------------------------------------------------------------------

    def remove(self, ref: str) -> Removal:
        """Remove one version (``NAME@VERSION``) or every version (``NAME``) of a model.

        ``latest`` is moved first, then the manifests go, then every block of theirs
        that no remaining manifest references.

        Raises:
            NoSuchModel: Nothing to remove.
        """
        name, version = parse_ref(ref)
        existing = self.versions(name)
        targets = existing if version is None else [version]
        if not existing or not set(targets) <= set(existing):
            raise NoSuchModel(ref)
        doomed = [self.get_manifest(f"{name}@{v}") for v in targets]
        remaining = sorted(set(existing) - set(targets))
        if remaining:
            self._put(latest_key(name), str(remaining[-1]).encode())
        else:
            self._delete(latest_key(name))
        for manifest in doomed:
            self._delete(manifest_key(name, manifest.version))
        referenced = {digest for m in self._all_manifests() for digest in m.hashes}
        sizes = {block.hash: block.size for m in doomed for block in m.blocks}
        unreferenced = sorted(digest for digest in sizes if digest not in referenced)
        for digest in unreferenced:
            self._delete(block_key(digest))
        return Removal(
            removed=tuple(m.ref for m in doomed),
            deleted_blocks=tuple(unreferenced),
            freed_bytes=sum(sizes[d] for d in unreferenced),
        )
