"""NVIDIA DALI as the decoder: its inputs and features against Pillow's, within the
documented tolerance; a bad image named; the preset carrying the decoder.

DALI's CPU mode (``dali-cpu``) runs on any machine and exercises the same pipeline as the
GPU one; the ``dali-gpu`` cases run where a CUDA GPU is (marked ``gpu``).
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import onnx
import pytest

from hapi import models
from hapi.models import DaliDecoder, InvalidModelSpec, UndecodableObject, cuda_usable, testing
from hapi.models._dali import FEATURE_P99, INPUT_P99, SAMPLE_MEAN

PRESET = testing.get_preset("imagenet")


def _photos() -> list[bytes]:
    """scikit-image's sample photos as JPEGs, whole and as crops of several sizes."""
    blobs = []
    for image in models.sample_images():
        rgb = image.convert("RGB")
        for box in (None, (0, 0, rgb.width // 2, rgb.height), (10, 20, 250, 400)):
            part = rgb if box is None else rgb.crop(box)
            buf = io.BytesIO()
            part.save(buf, "JPEG", quality=90)
            blobs.append(buf.getvalue())
    return blobs


def _pillow(blobs: list[bytes]) -> np.ndarray:
    return np.stack([models.decode_object(b, PRESET, key="x")[0].array for b in blobs])


def _dali(blobs: list[bytes], device: str, batch_size: int = 64) -> np.ndarray:
    decoder = DaliDecoder(PRESET, device=device, batch_size=batch_size)  # type: ignore[arg-type]
    out = np.full((len(blobs), 3, PRESET.crop, PRESET.crop), np.nan, np.float32)
    return decoder.decode(blobs, out, keys=[f"k{i}" for i in range(len(blobs))])


def _assert_within_tolerance(dali: np.ndarray, pillow: np.ndarray) -> None:
    assert not np.isnan(dali).any()
    difference = np.abs(dali - pillow)
    assert np.quantile(difference, 0.99) <= INPUT_P99
    assert np.median(difference) < 1e-3  # most pixels are the same
    means = np.abs(dali.mean(axis=(1, 2, 3)) - pillow.mean(axis=(1, 2, 3)))
    assert means.max() <= SAMPLE_MEAN


def test_dali_cpu_inputs_match_pillow_within_tolerance() -> None:
    blobs = _photos()
    _assert_within_tolerance(_dali(blobs, "cpu"), _pillow(blobs))


def test_features_from_dali_inputs_match_within_tolerance(effnet_export) -> None:
    blobs = _photos()
    graph = testing.compose([onnx.load_from_string(b.data) for b in effnet_export.blocks[:4]])
    session = models.create_session(graph, models.RuntimeSettings(device="cpu"))
    reference = session.run(None, {"input": _pillow(blobs)})[0]
    features = session.run(None, {"input": _dali(blobs, "cpu")})[0]
    share = np.quantile(np.abs(features - reference), 0.99) / np.abs(reference).max()
    assert 0 < share <= FEATURE_P99  # different bits, within the tolerance


def test_a_batch_longer_than_the_pipeline_runs_in_parts() -> None:
    blobs = _photos()[:7]
    whole = _dali(blobs, "cpu")
    np.testing.assert_array_equal(_dali(blobs, "cpu", batch_size=3), whole)


def test_an_undecodable_image_is_named_and_the_others_decode() -> None:
    blobs = _photos()[:3]
    blobs[1] = b"\xff\xd8\xff\xe0 not a jpeg at all" + bytes(200)
    decoder = DaliDecoder(PRESET, device="cpu")
    out = np.zeros((3, 3, PRESET.crop, PRESET.crop), np.float32)
    with pytest.raises(UndecodableObject) as caught:
        decoder.decode(blobs, out, keys=["a.jpg", "b.jpg", "c.jpg"])
    assert caught.value.key == "b.jpg"
    np.testing.assert_array_equal(out[0], _dali(blobs[:1], "cpu")[0])  # decoded before it


def test_the_decoder_is_part_of_the_preset_and_pil_keeps_old_keys() -> None:
    assert PRESET.decoder == "pil" and "decoder" not in PRESET.to_dict()
    dali = dataclasses.replace(PRESET, decoder="dali-gpu")
    assert dali.to_dict()["decoder"] == "dali-gpu"
    assert models.Preset.from_dict(dali.to_dict()) == dali
    assert models.Preset.from_dict(PRESET.to_dict()) == PRESET
    with pytest.raises(InvalidModelSpec, match="unknown decoder 'nvjpeg'"):
        dataclasses.replace(PRESET, decoder="nvjpeg")


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_usable(), reason="needs a CUDA GPU")
@pytest.mark.skipif(not models.dali_available(), reason="needs NVIDIA DALI (hapi[gpu-decode])")
def test_dali_gpu_inputs_match_pillow_within_tolerance() -> None:
    blobs = _photos()
    _assert_within_tolerance(_dali(blobs, "gpu"), _pillow(blobs))
