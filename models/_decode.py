"""Objects to model inputs: images (JPEG, PNG, WebP) and WebDataset tar shards.

The gateway (pushdown) and the SDK (local fallback) both call :func:`decode_object`, so
a sample is preprocessed identically on either side of the network.

A shard follows the WebDataset convention: members are grouped by basename up to the
first dot (``dir/0001.jpg`` and ``dir/0001.cls`` form sample ``dir/0001``); the image
member becomes the input, ``.cls`` an integer label, ``.txt`` and ``.json`` metadata.
"""

from __future__ import annotations

import io
import json
import tarfile
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from ._errors import ModelError
from ._preprocess import Preset, preprocess

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp"})
DEFAULT_MAX_PIXELS = 64_000_000  # a 8000 x 8000 photo; decompression bombs are far larger


class UndecodableObject(ModelError, ValueError):
    """An object is not a decodable image or shard, or exceeds the pixel limit.

    Args:
        key: The object (or ``shard#member``) at fault.
        reason: What is wrong with it.
    """

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Sample:
    """One model input decoded from an object."""

    key: str
    array: np.ndarray
    label: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def is_tar(data: bytes) -> bool:
    """Whether bytes look like a (ustar or GNU) tar archive."""
    return len(data) >= 262 and data[257:262] == b"ustar"


def decode_object(
    data: bytes, preset: Preset, *, key: str, max_pixels: int = DEFAULT_MAX_PIXELS
) -> list[Sample]:
    """Decode one object into samples: one for an image, one per image member of a shard.

    Raises:
        UndecodableObject: Not an image or tar, an image over ``max_pixels``, or a shard
            without any image member.
    """
    if is_tar(data):
        return decode_shard(data, preset, key=key, max_pixels=max_pixels)
    return [Sample(key, decode_image(data, preset, key=key, max_pixels=max_pixels))]


def decode_image(
    data: bytes, preset: Preset, *, key: str, max_pixels: int = DEFAULT_MAX_PIXELS
) -> np.ndarray:
    """Decode and preprocess one image; the size is checked before pixels are decoded.

    Raises:
        UndecodableObject: Not a JPEG/PNG/WebP (or other Pillow format), corrupt, or
            larger than ``max_pixels``.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))  # reads the header only
            width, height = image.size
            if width * height > max_pixels:
                raise UndecodableObject(
                    key, f"image of {width}x{height} pixels exceeds the limit of {max_pixels}"
                )
            image.load()
            return preprocess(image, preset)
    except UndecodableObject:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise UndecodableObject(
            key, f"image exceeds the limit on pixels, refused undecoded ({exc})"
        ) from exc
    except UnidentifiedImageError as exc:
        raise UndecodableObject(
            key, "not a decodable image: unknown format, or not an image"
        ) from exc
    except (OSError, ValueError, SyntaxError) as exc:
        raise UndecodableObject(key, f"corrupt image data ({exc})") from exc


def decode_shard(
    data: bytes, preset: Preset, *, key: str, max_pixels: int = DEFAULT_MAX_PIXELS
) -> list[Sample]:
    """Decode every sample of a WebDataset tar shard, in member order.

    Raises:
        UndecodableObject: A corrupt archive or image member, or no image member at all.
    """
    groups = _group_members(data, key)
    samples = []
    for name, members in groups.items():
        image_ext = next((ext for ext in members if ext in IMAGE_EXTENSIONS), None)
        if image_ext is None:
            continue
        array = decode_image(
            members[image_ext], preset, key=f"{key}#{name}.{image_ext}", max_pixels=max_pixels
        )
        samples.append(Sample(f"{key}#{name}", array, _label(members, key, name), _meta(members)))
    if not samples:
        raise UndecodableObject(key, "tar shard has no image member (.jpg, .jpeg, .png, .webp)")
    return samples


def _group_members(data: bytes, key: str) -> dict[str, dict[str, bytes]]:
    groups: dict[str, dict[str, bytes]] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                folder, _, base = member.name.rpartition("/")
                stem, _, ext = base.partition(".")
                extracted = archive.extractfile(member)
                if extracted is not None and ext:
                    name = f"{folder}/{stem}" if folder else stem
                    groups.setdefault(name, {})[ext.lower()] = extracted.read()
    except (tarfile.TarError, OSError) as exc:
        raise UndecodableObject(key, f"corrupt tar shard ({exc})") from exc
    return groups


def _label(members: dict[str, bytes], key: str, name: str) -> int | None:
    raw = members.get("cls")
    if raw is None:
        return None
    try:
        return int(raw.decode().strip())
    except (UnicodeDecodeError, ValueError) as exc:
        raise UndecodableObject(f"{key}#{name}.cls", "label is not an integer") from exc


def _meta(members: dict[str, bytes]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if "txt" in members:
        meta["txt"] = members["txt"].decode(errors="replace")
    if "json" in members:
        try:
            meta["json"] = json.loads(members["json"])
        except (json.JSONDecodeError, UnicodeDecodeError):
            meta["json"] = members["json"].decode(errors="replace")
    return meta
