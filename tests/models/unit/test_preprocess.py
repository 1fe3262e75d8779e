"""Preprocessing presets: deterministic, torchvision-equivalent, torch-free."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torchvision import transforms

from hapi.models import InvalidModelSpec, Preset, preprocess, preprocess_batch
from hapi.models.testing import PRESETS, get_preset


def _torchvision_pipeline(preset: Preset) -> transforms.Compose:
    return transforms.Compose(
        [
            transforms.Resize(preset.resize, interpolation=transforms.InterpolationMode.BILINEAR),
            transforms.CenterCrop(preset.crop),
            transforms.ToTensor(),
            transforms.Normalize(preset.mean, preset.std),
        ]
    )


@pytest.mark.parametrize("preset_name", sorted(PRESETS))
def test_matches_torchvision_on_real_photos(preset_name: str, photos: list[Image.Image]) -> None:
    preset = get_preset(preset_name)
    pipeline = _torchvision_pipeline(preset)
    for photo in photos:
        ours = preprocess(photo, preset)
        theirs = pipeline(photo).numpy()
        assert ours.shape == theirs.shape == (3, 224, 224)
        assert ours.dtype == np.float32 and ours.flags.c_contiguous
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


def test_deterministic_and_batched(photos: list[Image.Image]) -> None:
    preset = get_preset("imagenet")
    batch = preprocess_batch(photos, preset)
    assert batch.shape == (len(photos), 3, 224, 224)
    again = preprocess_batch(photos, preset)
    assert batch.tobytes() == again.tobytes()
    assert preprocess_batch([], preset).shape == (0, 3, 224, 224)


def test_any_mode_becomes_rgb(photos: list[Image.Image]) -> None:
    preset = get_preset("imagenet")
    gray = preprocess(photos[0].convert("L"), preset)
    rgba = preprocess(photos[0].convert("RGBA"), preset)
    rgb = preprocess(photos[0], preset)
    assert gray.shape == rgba.shape == (3, 224, 224)
    pixels = gray * np.array(preset.std)[:, None, None] + np.array(preset.mean)[:, None, None]
    np.testing.assert_allclose(pixels[0], pixels[1], atol=1e-6)  # gray: equal channels
    np.testing.assert_allclose(pixels[1], pixels[2], atol=1e-6)
    np.testing.assert_array_equal(rgba, rgb)


def test_small_and_portrait_images_are_resized_up_and_cropped() -> None:
    tall = Image.new("RGB", (20, 90), (255, 0, 0))
    out = preprocess(tall, get_preset("imagenet"))
    assert out.shape == (3, 224, 224)
    expected_red = (1.0 - 0.485) / 0.229
    np.testing.assert_allclose(out[0], expected_red, rtol=1e-6)


def test_round_trip_and_validation() -> None:
    preset = get_preset("efficientnet-lite")
    assert Preset.from_dict(preset.to_dict()) == preset
    with pytest.raises(ValueError, match="imagenet"):
        get_preset("nope")
    with pytest.raises(InvalidModelSpec, match="crop <= resize"):
        Preset(name="x", resize=100, crop=224, mean=(0, 0, 0), std=(1, 1, 1))
    with pytest.raises(InvalidModelSpec, match="invalid preprocessing preset"):
        Preset.from_dict({"name": "x"})


def test_torch_free_numpy_output_feeds_torch() -> None:
    sample = preprocess(Image.new("RGB", (300, 256)), get_preset("imagenet"))
    assert torch.from_numpy(sample).shape == (3, 224, 224)


def _per_pixel(image: Image.Image, preset: Preset) -> np.ndarray:
    """The arithmetic spelled out per pixel, as preprocess once did it."""
    image = ImageOps.exif_transpose(image).convert("RGB")
    short = preset.resize
    w, h = image.size
    size = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = round((size[0] - preset.crop) / 2.0), round((size[1] - preset.crop) / 2.0)
    image = image.crop((left, top, left + preset.crop, top + preset.crop))
    pixels = np.asarray(image, dtype=np.float32) / np.float32(255.0)
    mean, std = np.asarray(preset.mean, np.float32), np.asarray(preset.std, np.float32)
    return np.ascontiguousarray(((pixels - mean) / std).transpose(2, 0, 1))


@pytest.mark.parametrize("preset_name", sorted(PRESETS))
def test_the_lookup_gives_the_same_bits_as_per_pixel_arithmetic(
    preset_name: str, photos: list[Image.Image]
) -> None:
    preset = get_preset(preset_name)
    rotated = photos[0].copy()
    exif = rotated.getexif()
    exif[0x0112] = 6  # EXIF orientation: rotate 90 degrees on display
    buf = io.BytesIO()
    rotated.save(buf, "JPEG", exif=exif)
    oriented = Image.open(io.BytesIO(buf.getvalue()))
    for image in [*photos, photos[0].convert("L"), photos[0].convert("RGBA"), oriented]:
        expected = _per_pixel(image, preset)
        row = np.full((2, *preset.sample_shape), np.nan, np.float32)
        assert preprocess(image, preset).tobytes() == expected.tobytes()
        view = row[1]
        assert preprocess(image, preset, out=view) is view
        assert row[1].tobytes() == expected.tobytes() and np.isnan(row[0]).all()
    assert preprocess(oriented, preset).shape == preset.sample_shape
