"""Reading the registry, written once for blocking and async callers: the steps, no I/O.

A read is a generator: it yields what it needs from the store, a :class:`Get` (an object's
bytes, ``None`` when it is missing) or a :class:`List` (the keys under a prefix), is sent
each answer, and returns its result. :meth:`RegistryReads.run` drives it with blocking
calls (:class:`hapi.models.Registry`, boto3), :meth:`RegistryReads.arun` with coroutines
(the gateway's registry, over its async store client). Parsing and validation (names,
references, the ``latest`` pointer, manifests, block ranges) happen here only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from hapi.protocol import (
    block_key,
    latest_key,
    manifest_key,
    model_prefix,
    parse_latest,
    parse_manifest_key,
)

from ._errors import InvalidModelSpec, NoSuchModel
from ._manifest import Manifest
from ._names import check_name, parse_ref

T = TypeVar("T")


@dataclass(frozen=True)
class Get:
    """Need the bytes of object ``key`` (answer ``None`` when it does not exist)."""

    key: str


@dataclass(frozen=True)
class List:
    """Need every key under ``prefix`` (answer an empty list when there is none)."""

    prefix: str


Steps = Generator[Get | List, Any, T]


class RegistryReads:
    """The registry's reads as steps without I/O (see the module's docstring).

    Both registries, the blocking :class:`hapi.models.Registry` and the gateway's async
    one, read through these, so a manifest is found, parsed and checked one way.
    """

    @staticmethod
    def manifest(ref: str) -> Steps[Manifest]:
        """The manifest of ``NAME`` (latest version) or ``NAME@VERSION``.

        Raises:
            NoSuchModel: No such model or version.
            InvalidModelSpec: ``ref`` is not a valid reference.
        """
        name, version = parse_ref(ref)
        if version is None:
            version = parse_latest((yield Get(latest_key(name))))
        if version is None:  # a writer died between manifest and pointer
            versions = yield from RegistryReads.versions(name)
            if not versions:
                raise NoSuchModel(name)
            version = versions[-1]
        data = yield Get(manifest_key(name, version))
        if data is None:
            raise NoSuchModel(ref)
        return Manifest.from_json(data)

    @staticmethod
    def versions(name: str) -> Steps[list[int]]:
        """The stored versions of ``name``, ascending (empty if none)."""
        keys: Iterable[str] = yield List(model_prefix(check_name(name)))
        found = (parse_manifest_key(key) for key in keys)
        return sorted(parsed[1] for parsed in found if parsed and parsed[0] == name)

    @staticmethod
    def block_keys(manifest: Manifest, start: int, stop: int) -> list[str]:
        """The keys of blocks ``[start, stop)``.

        Raises:
            InvalidModelSpec: The range is empty or outside the model.
        """
        if not 0 <= start < stop <= len(manifest.blocks):
            raise InvalidModelSpec(
                f"block range [{start}, {stop}) is empty or outside {manifest.ref}, "
                f"which has {len(manifest.blocks)} blocks"
            )
        return [block_key(block.hash) for block in manifest.blocks[start:stop]]

    @staticmethod
    def run(
        steps: Steps[T], get: Callable[[str], bytes | None], keys: Callable[[str], Iterable[str]]
    ) -> T:
        """Drive ``steps`` with blocking ``get(key)`` and ``keys(prefix)``."""
        answer: Any = None
        try:
            while True:
                step = steps.send(answer)
                answer = get(step.key) if isinstance(step, Get) else list(keys(step.prefix))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    @staticmethod
    async def arun(
        steps: Steps[T],
        get: Callable[[str], Awaitable[bytes | None]],
        keys: Callable[[str], Awaitable[list[str]]],
    ) -> T:
        """Drive ``steps`` with coroutines ``get(key)`` and ``keys(prefix)``."""
        answer: Any = None
        try:
            while True:
                step = steps.send(answer)
                answer = await (get(step.key) if isinstance(step, Get) else keys(step.prefix))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
