"""Augmented views: torchvision's training transforms on a PIL image, with drawn parameters.

The parameters come from :func:`hapi.protocol.draw_view` (a pure function of the seed, the
sample and the view); this module applies them exactly as torchvision's functional
transforms do on a PIL image (``resized_crop``, ``hflip``, ``adjust_brightness``,
``adjust_contrast``, ``adjust_saturation``, ``adjust_hue``), so that a view's pixels are
torchvision's to the bit and its features equal theirs to float32 rounding. Only Pillow
and numpy are used.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PIL import Image, ImageEnhance

from hapi.protocol import ViewParams

from ._preprocess import Preset, center_crop, normalize, oriented_rgb, resized_crop


def _brightness(image: Image.Image, factor: float) -> Image.Image:
    return ImageEnhance.Brightness(image).enhance(factor)


def _contrast(image: Image.Image, factor: float) -> Image.Image:
    return ImageEnhance.Contrast(image).enhance(factor)


def _saturation(image: Image.Image, factor: float) -> Image.Image:
    return ImageEnhance.Color(image).enhance(factor)


def _hue(image: Image.Image, shift: float) -> Image.Image:
    # torchvision's _functional_pil.adjust_hue: the H channel shifted with uint8 wrap-around.
    hue, saturation, value = image.convert("HSV").split()
    channel = np.array(hue, dtype=np.uint8)
    channel += np.int32(shift * 255).astype(np.uint8)
    shifted = Image.fromarray(channel, "L")
    return Image.merge("HSV", (shifted, saturation, value)).convert(image.mode)


_ADJUST: dict[str, Callable[[Image.Image, float], Image.Image]] = {
    "brightness": _brightness,
    "contrast": _contrast,
    "saturation": _saturation,
    "hue": _hue,
}


def apply_view(image: Image.Image, preset: Preset, view: ViewParams) -> Image.Image:
    """An RGB image (EXIF orientation applied) through ``view``'s crop (or the preset's
    resize and centre crop), flip and colour adjustments, in that order."""
    if view.box is None:
        image = center_crop(image, preset)
    else:
        image = resized_crop(image, view.box, preset)
    if view.flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    for name, factor in zip(view.order, view.factors, strict=True):
        image = _ADJUST[name](image, factor)
    return image


def preprocess_view(
    image: Image.Image, preset: Preset, view: ViewParams, *, out: np.ndarray | None = None
) -> np.ndarray:
    """:func:`hapi.models.preprocess` with an augmented view in place of the centre crop."""
    return normalize(apply_view(oriented_rgb(image), preset, view), preset, out=out)
