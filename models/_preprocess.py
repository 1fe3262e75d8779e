"""Preprocessing presets: PIL image in, ``float32`` CHW array out.

The gateway (storage side) and the SDK (training side) both call :func:`preprocess`
with the preset a manifest names, so a sample's features are the same wherever its
frozen layers ran. Only Pillow and numpy are used: every step is either a Pillow
operation or an IEEE-exact float32 elementwise operation, so the output is identical
on every machine with the same Pillow version.

The resize and crop arithmetic follows torchvision's ``Resize(int)`` and
``CenterCrop`` so that features match what a torchvision input pipeline would give.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from ._errors import InvalidModelSpec

_ORIENTATION = 0x0112  # the EXIF tag
_INTERPOLATION = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}


DECODERS = ("pil", "dali-cpu", "dali-gpu")
"""Every decoder a preset may name; ``pil`` (Pillow) is the reference."""


@dataclass(frozen=True, kw_only=True)
class Preset:
    """How an image becomes a model input.

    Args:
        name: Registry name of the preset.
        resize: Length of the shorter side after resizing (aspect ratio kept).
        crop: Side of the square center crop taken after resizing.
        mean: Per-channel mean subtracted after scaling pixels to ``[0, 1]``.
        std: Per-channel standard deviation divided by after subtracting the mean.
        interpolation: ``bilinear``, ``bicubic`` or ``nearest``.
        layout: Always ``NCHW`` (one sample is ``CHW``).
        dtype: Always ``float32``.
        decoder: What decodes and resamples: ``pil`` (Pillow, the reference), or
            ``dali-cpu`` / ``dali-gpu`` (NVIDIA DALI, whose pixels differ slightly; see
            ``hapi.models.DaliDecoder``). A manifest records ``pil``; a gateway decoding
            another way serves the preset with its own decoder, so cache keys differ.
    """

    name: str
    resize: int
    crop: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bilinear"
    layout: str = "NCHW"
    dtype: str = "float32"
    decoder: str = "pil"

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise InvalidModelSpec(
                f"preset {self.name}: unknown decoder {self.decoder!r}; known: "
                + ", ".join(DECODERS)
            )
        if not 0 < self.crop <= self.resize:
            raise InvalidModelSpec(f"preset {self.name}: need 0 < crop <= resize")
        if self.interpolation not in _INTERPOLATION:
            raise InvalidModelSpec(
                f"preset {self.name}: interpolation must be one of {sorted(_INTERPOLATION)}"
            )
        if self.layout != "NCHW" or self.dtype != "float32":
            raise InvalidModelSpec(f"preset {self.name}: only NCHW float32 is supported")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise InvalidModelSpec(f"preset {self.name}: mean and std need 3 values, std > 0")

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """Shape of one preprocessed sample, ``(3, crop, crop)``."""
        return (3, self.crop, self.crop)

    def to_dict(self) -> dict[str, Any]:
        """The preset as a JSON-ready mapping (as stored in manifests)."""
        data = asdict(self)
        data["mean"], data["std"] = list(self.mean), list(self.std)
        if self.decoder == "pil":  # the reference: manifests and cache keys from before
            del data["decoder"]  # any decoder was named stay as they were
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Preset:
        """Rebuild a preset from :meth:`to_dict`'s output.

        Raises:
            InvalidModelSpec: A field is missing or invalid.
        """
        try:
            fields = dict(data)
            mean, std = fields.pop("mean"), fields.pop("std")
            return cls(mean=(mean[0], mean[1], mean[2]), std=(std[0], std[1], std[2]), **fields)
        except (KeyError, TypeError, IndexError) as exc:
            raise InvalidModelSpec(f"invalid preprocessing preset: {exc}") from exc


_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)

PRESETS: Mapping[str, Preset] = {
    "imagenet": Preset(
        name="imagenet", resize=256, crop=224, mean=_IMAGENET_MEAN, std=_IMAGENET_STD
    ),
    # TensorFlow's EfficientNet-Lite checkpoints were trained on (pixel - 127) / 128.
    "efficientnet-lite": Preset(
        name="efficientnet-lite",
        resize=256,
        crop=224,
        mean=(127 / 255, 127 / 255, 127 / 255),
        std=(128 / 255, 128 / 255, 128 / 255),
    ),
}


def get_preset(name: str) -> Preset:
    """Look a preset up by name.

    Raises:
        InvalidModelSpec: Unknown name; the message lists the known ones.
    """
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise InvalidModelSpec(f"unknown preprocessing preset {name!r}; known: {known}") from None


def _resized_size(width: int, height: int, short: int) -> tuple[int, int]:
    # torchvision.transforms.functional._compute_resized_output_size for an int size.
    if width <= height:
        return short, int(short * height / width)
    return int(short * width / height), short


def preprocess(image: Image.Image, preset: Preset, *, out: np.ndarray | None = None) -> np.ndarray:
    """Turn one image into a model input sample.

    Args:
        image: Any PIL image; EXIF orientation is applied, then it is converted to RGB.
        preset: The preset a manifest names.
        out: Where to write it (a C-contiguous ``float32`` array of
            ``preset.sample_shape``, e.g. a row of a batch); a new array by default.

    Returns:
        A C-contiguous ``float32`` array of shape ``preset.sample_shape`` (``out``, when
        given).
    """
    return normalize(center_crop(oriented_rgb(image), preset), preset, out=out)


def oriented_rgb(image: Image.Image) -> Image.Image:
    """``image`` with its EXIF orientation applied, in RGB."""
    if image.getexif().get(_ORIENTATION, 1) != 1:  # else exif_transpose only copies
        image = ImageOps.exif_transpose(image)
    if image.mode != "RGB":
        image = image.convert("RGB")
    return image


def oriented_size(image: Image.Image) -> tuple[int, int]:
    """``(width, height)`` once the EXIF orientation is applied, from what opening the
    image read (never its pixels: Pillow's ``getexif`` loads a PNG whole to look for an
    eXIf chunk after the pixels, so a PNG's EXIF is taken from the chunks before them)."""
    width, height = image.size
    if image.format == "PNG":
        exif = Image.Exif()
        raw = image.info.get("exif")
        if raw:
            exif.load(raw)
    else:
        exif = image.getexif()
    if exif.get(_ORIENTATION, 1) in (5, 6, 7, 8):  # a quarter turn
        return height, width
    return width, height


def center_crop(image: Image.Image, preset: Preset) -> Image.Image:
    """torchvision's ``Resize(preset.resize)`` then ``CenterCrop(preset.crop)``."""
    width, height = _resized_size(image.width, image.height, preset.resize)
    image = image.resize((width, height), _INTERPOLATION[preset.interpolation])
    left = round((width - preset.crop) / 2.0)
    top = round((height - preset.crop) / 2.0)
    return image.crop((left, top, left + preset.crop, top + preset.crop))


def resized_crop(image: Image.Image, box: tuple[int, int, int, int], preset: Preset) -> Image.Image:
    """torchvision's ``resized_crop`` of a PIL image: ``box`` is ``(top, left, height,
    width)``, resized to the preset's input size."""
    top, left, height, width = box
    image = image.crop((left, top, left + width, top + height))
    return image.resize((preset.crop, preset.crop), _INTERPOLATION[preset.interpolation])


def normalize(image: Image.Image, preset: Preset, *, out: np.ndarray | None = None) -> np.ndarray:
    """torchvision's ``ToTensor`` then ``Normalize(mean, std)`` of an RGB image of the
    preset's input size, as a ``float32`` CHW array (into ``out`` when given)."""
    pixels = np.asarray(image)  # HWC uint8
    if out is None:
        out = np.empty(preset.sample_shape, np.float32)
    for channel, table in enumerate(_normalized(preset.mean, preset.std)):
        # (x / 255 - mean) / std for each of the 256 values a pixel can take, computed
        # once in float32, then looked up: the same bits as computing it per pixel.
        np.take(table, pixels[:, :, channel], out=out[channel])
    return out


@functools.lru_cache(maxsize=32)
def _normalized(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    """Per channel, the normalized float32 value of each 8-bit pixel value."""
    values = np.arange(256, dtype=np.float32) / np.float32(255.0)
    return tuple(
        (values - np.float32(m)) / np.float32(s)
        for m, s in zip(
            np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32), strict=True
        )
    )


def preprocess_batch(images: Iterable[Image.Image], preset: Preset) -> np.ndarray:
    """Preprocess several images into one ``NCHW`` batch (see :func:`preprocess`)."""
    samples = [preprocess(image, preset) for image in images]
    if not samples:
        return np.zeros((0, *preset.sample_shape), dtype=np.float32)
    return np.stack(samples)
