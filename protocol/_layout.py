"""Where the registry keeps what (DESIGN.md, "Registry layout"), for every reader of it.

::

    blocks/sha256/<hex>.onnx          immutable, shared between models
    models/<name>/<version>.json      a manifest, written after all of its blocks
    models/<name>/latest              the current version, as decimal text

``hapi.models.Registry`` reads and writes it with boto3; the gateway reads it with its own
async client. Both go through these functions, so the layout is written down once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DEFAULT_REGISTRY_BUCKET = "hapi-models"
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
