"""Objects to model inputs: images (JPEG, PNG, WebP) and WebDataset tar shards.

The gateway (pushdown) and the SDK (local fallback) both call :func:`decode_object`, so
a sample is preprocessed identically on either side of the network.

A shard follows the WebDataset convention: members are grouped by basename up to the
first dot (``dir/0001.jpg`` and ``dir/0001.cls`` form sample ``dir/0001``); the image
member becomes the input, ``.cls`` an integer label, ``.txt`` and ``.json`` metadata.
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from hapi.protocol import Augmentation, ViewParams

from ._augment import preprocess_view
from ._errors import ModelError
from ._preprocess import Preset, oriented_size, preprocess

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp"})
DEFAULT_MAX_PIXELS = 64_000_000  # a 8000 x 8000 photo; decompression bombs are far larger
_MEMBERS_PER_SAMPLE = 16  # a shard with more members than this per allowed sample is refused


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


class TooManySamples(ModelError, ValueError):
    """An object holds more samples (or tar members) than the caller allows.

    Found while listing, before any image is decoded.

    Args:
        key: The object.
        limit: The most samples allowed.
        what: What was counted (``samples`` or ``tar members``).
    """

    def __init__(self, key: str, limit: int, what: str = "samples") -> None:
        super().__init__(f"{key}: more than {limit} {what}")
        self.key = key
        self.limit = limit
        self.what = what


@dataclass(frozen=True)
class PendingSample:
    """One sample found in an object and not decoded yet.

    ``image`` is a view into the object's bytes (no copy), so listing a shard costs
    memory for its member index only; :meth:`decode` turns one sample into a model input.
    """

    key: str
    image: bytes | memoryview
    label: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    member: str = ""  # the image member, for errors (``shard#dir/0001.jpg``)
    view: ViewParams | None = None  # an augmented view in place of the centre crop

    def decode(
        self,
        preset: Preset,
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Decode and preprocess this sample (into ``out``, e.g. a row of a batch, when
        given).

        Raises:
            UndecodableObject: Corrupt image data.
        """
        key = self.member or self.key
        return decode_image(
            self.image, preset, key=key, max_pixels=max_pixels, out=out, view=self.view
        )


def is_tar(data: bytes | memoryview) -> bool:
    """Whether bytes look like a (ustar or GNU) tar archive."""
    return len(data) >= 262 and bytes(data[257:262]) == b"ustar"


def list_samples(
    data: bytes,
    *,
    key: str,
    max_samples: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    augment: Augmentation | None = None,
) -> list[PendingSample]:
    """The samples of one object, counted and checked but not decoded.

    Each image's header is read (format and size, not pixels), so an object that is not an
    image, or an image over ``max_pixels``, is refused here, before any decoding.

    Args:
        data: The object's bytes.
        key: Its name (samples of a shard are named ``key#member``).
        max_samples: Refuse objects with more samples than this, while counting.
        max_pixels: Refuse images with more pixels than this.
        augment: Draw each sample's view of this augmentation (from its key and its
            image's size, known from the header).

    Raises:
        TooManySamples: More than ``max_samples`` samples (or a tar with far more members).
        UndecodableObject: Not an image or tar, an image over ``max_pixels``, or a shard
            without any image member.
    """
    if is_tar(data):
        return _list_shard(data, key, max_samples, max_pixels, augment)
    size = check_image(data, key=key, max_pixels=max_pixels)
    view = None if augment is None else augment.draw(key, size)
    return [PendingSample(key, data, member=key, view=view)]


def decode_object(
    data: bytes,
    preset: Preset,
    *,
    key: str,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    augment: Augmentation | None = None,
) -> list[Sample]:
    """Decode one object into samples: one for an image, one per image member of a shard
    (each sample's view of ``augment`` in place of the centre crop, when given).

    Raises:
        UndecodableObject: Not an image or tar, an image over ``max_pixels``, or a shard
            without any image member.
    """
    pending = list_samples(data, key=key, max_pixels=max_pixels, augment=augment)
    return [
        Sample(p.key, p.decode(preset, max_pixels=max_pixels), p.label, p.meta) for p in pending
    ]


def check_image(
    data: bytes | memoryview, *, key: str, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[int, int]:
    """Read an image's header (format, size) without decoding its pixels; returns its
    ``(width, height)`` once the EXIF orientation is applied.

    Raises:
        UndecodableObject: Not an image Pillow knows, or larger than ``max_pixels``.
    """
    with _image_errors(key), Image.open(io.BytesIO(data)) as image:
        _check_size(image, key, max_pixels)
        return oriented_size(image)
    raise AssertionError("unreachable")  # _image_errors re-raises everything it catches


def decode_image(
    data: bytes | memoryview,
    preset: Preset,
    *,
    key: str,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    out: np.ndarray | None = None,
    view: ViewParams | None = None,
) -> np.ndarray:
    """Decode and preprocess one image (into ``out`` when given; through ``view`` in
    place of the centre crop when given); the size is checked before pixels are decoded.

    Raises:
        UndecodableObject: Not a JPEG/PNG/WebP (or other Pillow format), corrupt, or
            larger than ``max_pixels``.
    """
    with _image_errors(key):
        image = Image.open(io.BytesIO(data))  # reads the header only
        _check_size(image, key, max_pixels)
        image.load()
        if view is not None:
            return preprocess_view(image, preset, view, out=out)
        return preprocess(image, preset, out=out)
    raise AssertionError("unreachable")  # _image_errors re-raises everything it catches


def _check_size(image: Image.Image, key: str, max_pixels: int) -> None:
    width, height = image.size
    if width * height > max_pixels:
        raise UndecodableObject(
            key, f"image of {width}x{height} pixels exceeds the limit of {max_pixels}"
        )


@contextlib.contextmanager
def _image_errors(key: str) -> Iterator[None]:
    """Pillow's many errors as :class:`UndecodableObject`; bomb warnings as errors."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
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
    pending = _list_shard(data, key, None, max_pixels)
    return [
        Sample(p.key, p.decode(preset, max_pixels=max_pixels), p.label, p.meta) for p in pending
    ]


def _list_shard(
    data: bytes,
    key: str,
    max_samples: int | None,
    max_pixels: int,
    augment: Augmentation | None = None,
) -> list[PendingSample]:
    groups = _group_members(data, key, max_samples)
    samples = []
    for name, members in groups.items():
        image_ext = next((ext for ext in members if ext in IMAGE_EXTENSIONS), None)
        if image_ext is None:
            continue
        member = f"{key}#{name}.{image_ext}"
        size = check_image(members[image_ext], key=member, max_pixels=max_pixels)
        sample_key = f"{key}#{name}"
        samples.append(
            PendingSample(
                sample_key,
                members[image_ext],
                _label(members, key, name),
                _meta(members),
                member=member,
                view=None if augment is None else augment.draw(sample_key, size),
            )
        )
    if not samples:
        raise UndecodableObject(key, "tar shard has no image member (.jpg, .jpeg, .png, .webp)")
    return samples


def shard_member(member: tarfile.TarInfo) -> tuple[str, str] | None:
    """The sample a WebDataset tar member belongs to and its extension, lower-cased
    (``a/b/0001.cls`` -> ``("a/b/0001", "cls")``); ``None`` for a member that is part of
    no sample (a folder, a link, a sparse file, a name without an extension). A sample is
    an image when one of its extensions is in :data:`IMAGE_EXTENSIONS`."""
    if not member.isfile() or member.issparse():
        return None
    folder, _, base = member.name.rpartition("/")
    stem, _, extension = base.partition(".")
    if not extension:
        return None
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def _group_members(
    data: bytes, key: str, max_samples: int | None
) -> dict[str, dict[str, memoryview]]:
    """Members by sample name and extension, as views into ``data``; counting samples as
    they are found, so that a shard over ``max_samples`` is refused before it is read on."""
    view = memoryview(data)
    groups: dict[str, dict[str, memoryview]] = {}
    images = 0
    members_limit = None if max_samples is None else _MEMBERS_PER_SAMPLE * max_samples
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for count, member in enumerate(archive, start=1):
                if members_limit is not None and count > members_limit:
                    raise TooManySamples(key, members_limit, "tar members")
                part = shard_member(member)
                if part is None:
                    continue
                name, ext = part
                group = groups.setdefault(name, {})
                if ext in IMAGE_EXTENSIONS and not IMAGE_EXTENSIONS & group.keys():
                    images += 1
                    if max_samples is not None and images > max_samples:
                        raise TooManySamples(key, max_samples)
                start = member.offset_data
                group[ext] = view[start : start + member.size]
    except (tarfile.TarError, OSError) as exc:
        raise UndecodableObject(key, f"corrupt tar shard ({exc})") from exc
    return groups


def _label(members: dict[str, memoryview], key: str, name: str) -> int | None:
    raw = members.get("cls")
    if raw is None:
        return None
    try:
        return int(bytes(raw).decode().strip())
    except (UnicodeDecodeError, ValueError) as exc:
        raise UndecodableObject(f"{key}#{name}.cls", "label is not an integer") from exc


def _meta(members: dict[str, memoryview]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if "txt" in members:
        meta["txt"] = bytes(members["txt"]).decode(errors="replace")
    if "json" in members:
        raw = bytes(members["json"])
        try:
            meta["json"] = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            meta["json"] = raw.decode(errors="replace")
    return meta
