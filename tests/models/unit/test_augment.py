"""Augmented views are torchvision's pixels: the drawn parameters, applied with
torchvision's functional transforms to the same decoded image, give the same input."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data as samples
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

from hapi.models import decode_object
from hapi.models.testing import PRESETS
from hapi.protocol import Augmentation, AugmentPolicy, ViewParams

POLICY = AugmentPolicy.parse(
    "crop(scale=0.08:1,ratio=0.75:1.3333);flip(p=0.5);"
    "jitter(brightness=0.4,contrast=0.4,saturation=0.4,hue=0.1)"
)
_ADJUST = {
    "brightness": F.adjust_brightness,
    "contrast": F.adjust_contrast,
    "saturation": F.adjust_saturation,
    "hue": F.adjust_hue,
}


def torchvision_input(image: Image.Image, view: ViewParams, preset) -> np.ndarray:
    """``view`` applied with torchvision.transforms.functional, then ToTensor and Normalize."""
    size = [preset.crop, preset.crop]
    if view.box is None:
        image = F.center_crop(F.resize(image, preset.resize), size)
    else:
        image = F.resized_crop(image, *view.box, size, InterpolationMode.BILINEAR)
    if view.flip:
        image = F.hflip(image)
    for name, factor in zip(view.order, view.factors, strict=True):
        image = _ADJUST[name](image, factor)
    tensor: torch.Tensor = F.normalize(F.to_tensor(image), list(preset.mean), list(preset.std))
    return tensor.numpy()


def _jpeg(array: np.ndarray, orientation: int = 1) -> bytes:
    image, buf = Image.fromarray(array), io.BytesIO()
    exif = image.getexif()
    exif[0x0112] = orientation
    image.save(buf, "JPEG", quality=90, exif=exif)
    return buf.getvalue()


@pytest.mark.parametrize("orientation", [1, 6])  # as stored, and a quarter turn by EXIF
@pytest.mark.parametrize("spec", [POLICY.spec(), "flip(p=1);jitter(hue=0.5)"])
def test_views_are_torchvisions_pixels(orientation: int, spec: str) -> None:
    preset = PRESETS["imagenet"]
    blob = _jpeg(samples.chelsea(), orientation)
    oriented = Image.open(io.BytesIO(blob))
    oriented = (
        Image.Image.transpose(oriented, Image.Transpose.ROTATE_270)
        if orientation == 6
        else oriented
    )
    oriented = oriented.convert("RGB")
    policy = AugmentPolicy.parse(spec)
    for epoch in range(4):
        augment = Augmentation(policy=policy, seed=5, epoch=epoch, bucket="data")
        [sample] = decode_object(blob, preset, key="cat.jpg", augment=augment)
        view = augment.draw("cat.jpg", oriented.size)
        np.testing.assert_array_equal(sample.array, torchvision_input(oriented, view, preset))


def test_a_shards_samples_each_draw_their_own_view() -> None:
    import tarfile

    preset = PRESETS["imagenet"]
    blob, buf = _jpeg(samples.coffee()), io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("a.jpg", "b.jpg"):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    augment = Augmentation(policy=POLICY, seed=1, bucket="data")
    first, second = decode_object(buf.getvalue(), preset, key="s.tar", augment=augment)
    assert not np.array_equal(first.array, second.array)  # the same image, two views
    image = Image.open(io.BytesIO(blob)).convert("RGB")
    view = augment.draw("s.tar#b", image.size)
    np.testing.assert_array_equal(second.array, torchvision_input(image, view, preset))
