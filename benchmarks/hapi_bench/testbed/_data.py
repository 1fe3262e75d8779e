"""The dataset: ImageNet-like JPEGs made from scikit-image's sample photos.

Each image is a random crop (aspect 3:4 to 4:3) of one photo, flipped half the time and
scaled so its sides fall within 224-500 px, saved as JPEG at quality 90; its class is the
photo it came from. The same images are uploaded twice: as single objects in class
folders (``images/<class>/<n>.jpg``, the ImageFolder convention) and as WebDataset tar
shards (``shards/shard-<n>.tar`` holding ``<class>/<n>.jpg`` and ``<class>/<n>.cls``).
"""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from PIL import Image

MIN_SIDE, MAX_SIDE = 224, 500
QUALITY = 90
CLASSES = ("cat", "astronaut", "coffee", "rocket")  # hapi.models.sample_images(), in order


@dataclass(frozen=True)
class Sample:
    """One generated image."""

    key: str
    label: int
    data: bytes


def _class_name(index: int) -> str:
    return CLASSES[index] if index < len(CLASSES) else f"class{index}"


def augment(photo: Image.Image, rng: random.Random) -> Image.Image:
    """A random crop, flip and scale of ``photo`` with both sides in 224-500 px."""
    width, height = photo.size
    aspect = rng.uniform(3 / 4, 4 / 3)
    crop_w = rng.randint(min(width, height) // 2, min(width, height))
    crop_h = min(height, max(1, round(crop_w / aspect)))
    left, top = rng.randint(0, width - crop_w), rng.randint(0, height - crop_h)
    crop = photo.crop((left, top, left + crop_w, top + crop_h))
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    short = rng.randint(MIN_SIDE, MAX_SIDE)
    scale = short / min(crop.size)
    size = tuple(min(MAX_SIDE, max(MIN_SIDE, round(side * scale))) for side in crop.size)
    return crop.resize((size[0], size[1]), Image.Resampling.BILINEAR)


def generate(count: int, photos: Sequence[Image.Image], *, seed: int = 0) -> list[Sample]:
    """``count`` JPEGs in class folders, round-robin over ``photos`` (deterministic)."""
    if count < 1 or not photos:
        raise ValueError("need at least one image and one photo")
    rng = random.Random(seed)
    samples = []
    for index in range(count):
        label = index % len(photos)
        buffer = io.BytesIO()
        augment(photos[label].convert("RGB"), rng).save(buffer, "JPEG", quality=QUALITY)
        key = f"images/{_class_name(label)}/{index:05d}.jpg"
        samples.append(Sample(key, label, buffer.getvalue()))
    return samples


def shards(samples: Sequence[Sample], per_shard: int = 64) -> list[tuple[str, bytes]]:
    """WebDataset tar shards of ``samples``: ``(key, tar bytes)`` each."""
    out = []
    for number, start in enumerate(range(0, len(samples), per_shard)):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for sample in samples[start : start + per_shard]:
                stem = sample.key.removeprefix("images/").removesuffix(".jpg")
                _add(tar, f"{stem}.jpg", sample.data)
                _add(tar, f"{stem}.cls", str(sample.label).encode())
        out.append((f"shards/shard-{number:04d}.tar", buffer.getvalue()))
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def upload(s3: Any, bucket: str, samples: Sequence[Sample], *, per_shard: int = 64) -> int:
    """Create ``bucket`` and upload ``samples`` as objects and as shards; returns bytes sent."""
    s3.create_bucket(Bucket=bucket)
    objects = [(s.key, s.data) for s in samples] + shards(samples, per_shard)
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(lambda item: s3.put_object(Bucket=bucket, Key=item[0], Body=item[1]), objects)
        )
    return sum(len(data) for _, data in objects)


def mean_bytes(samples: Sequence[Sample]) -> float:
    """Mean object size."""
    return sum(len(s.data) for s in samples) / len(samples)
