"""Where the registry keeps what (DESIGN.md, "Registry layout"), for every reader of it.

::

    blocks/sha256/<hex>.onnx          immutable, shared between models
    models/<name>/<version>.json      a manifest, written after all of its blocks
    models/<name>/latest              the current version, as decimal text

:class:`hapi.models.Registry` reads and writes it with boto3; the gateway reads it with
its own async client. Both go through these functions, so the layout is written down once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import onnx

from ._errors import CorruptBlock
from ._manifest import Manifest
from ._onnx import compose, sha256

MODELS_PREFIX = "models/"
_MANIFEST_KEY = re.compile(r"models/([^/]+)/([1-9][0-9]*)\.json")


def block_key(digest: str) -> str:
    """The key of the block whose SHA-256 is ``digest``."""
    return f"blocks/sha256/{digest}.onnx"


def manifest_key(name: str, version: int) -> str:
    """The key of the manifest of ``name@version``."""
    return f"models/{name}/{version}.json"


def latest_key(name: str) -> str:
    """The key of ``name``'s pointer to its current version."""
    return f"models/{name}/latest"


def model_prefix(name: str) -> str:
    """The prefix under which every key of model ``name`` lies."""
    return f"{MODELS_PREFIX}{name}/"


def parse_manifest_key(key: str) -> tuple[str, int] | None:
    """``(name, version)`` of a manifest's key; ``None`` for any other key."""
    match = _MANIFEST_KEY.fullmatch(key)
    return (match[1], int(match[2])) if match else None


def parse_latest(pointer: bytes | None) -> int | None:
    """The version a ``latest`` pointer names; ``None`` when it is missing or unreadable
    (a writer died between manifest and pointer: the highest manifest is the latest)."""
    if pointer is None or not pointer.strip().isdigit():
        return None
    return int(pointer)


def model_names(keys: Iterable[str]) -> list[str]:
    """The names of the models among keys listed under :data:`MODELS_PREFIX`, sorted."""
    return sorted({key.split("/")[1] for key in keys if key.count("/") == 2})


def check_block(manifest: Manifest, index: int, data: bytes | None) -> bytes:
    """``data`` if it is block ``index`` of ``manifest`` (its bytes hash to the digest).

    Raises:
        CorruptBlock: The block is missing (``None``) or its bytes do not match.
    """
    expected = manifest.blocks[index].hash
    actual = "missing" if data is None else sha256(data)
    if data is None or actual != expected:
        raise CorruptBlock(manifest.ref, index, expected, actual)
    return data


def assemble_blocks(
    manifest: Manifest, start: int, blobs: Sequence[bytes | None]
) -> onnx.ModelProto:
    """Verify the stored bytes of blocks ``[start, start + len(blobs))`` and compose them
    into one graph (input ``input``, output ``output``, dynamic batch dimension).

    Raises:
        CorruptBlock: A block fails verification; nothing is composed.
    """
    verified = [check_block(manifest, start + i, blob) for i, blob in enumerate(blobs)]
    return compose([onnx.load_from_string(blob) for blob in verified])
