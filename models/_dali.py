"""Batch decoding with NVIDIA DALI: decode, resize, crop and normalize in one pipeline.

``dali-gpu`` decodes with nvJPEG (the ``mixed`` decoder) and resizes and normalizes on the
GPU; ``dali-cpu`` runs the same operators on host threads (DALI's CPU mode, which needs no
GPU). Both change pixels slightly from Pillow's decoder and resampling (:data:`INPUT_P99`, :data:`FEATURE_P99`),
so the decoder is part of the preset (``Preset.decoder``) and of every cache key made from
it: features decoded two ways never mix.

DALI is optional (``pip install 'hapi[gpu-decode]'``); :func:`dali_available` says whether
it imports.
"""

from __future__ import annotations

import importlib
import io
import threading
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from PIL import Image

from ._decode import UndecodableObject
from ._preprocess import _ORIENTATION, Preset, _resized_size

_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height

INPUT_P99 = 0.05
"""The 99th percentile of ``|DALI - Pillow|`` over a batch's inputs, in normalized units
(pixel / 255, less the mean, over the std), that hapi accepts. Measured with DALI's CPU
mode on scikit-image's sample photos, crops of them and 32 ImageNet-like JPEGs (the
ImageNet preset): a median of 0 (most inputs are the same bits) and a 99th percentile and
largest difference of 0.0175, one 8-bit level: JPEG's IDCT and resampling round a pixel
differently here and there."""

SAMPLE_MEAN = 0.005
"""The most one sample's mean input may move from Pillow's (measured: 0.002)."""

FEATURE_P99 = 0.05
"""The 99th percentile of the features' difference, as a share of their largest value,
that hapi accepts. Measured on the same photos: 0.0015 through ResNet18's blocks [0, 5)
(the largest single difference: 0.0041 of the largest value), 0.030 through
EfficientNet-Lite0's blocks [0, 4), whose depthwise layers amplify a level's difference.
The GPU decoder's figures come from the GPU-marked tests where a GPU is lent."""


_INTERPOLATION = {"bilinear": "INTERP_LINEAR", "bicubic": "INTERP_CUBIC", "nearest": "INTERP_NN"}


def dali_available() -> bool:
    """Whether NVIDIA DALI imports here."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


class DaliDecoder:
    """Decodes batches of encoded images into a preset's model inputs with one DALI pipeline.

    Args:
        preset: What the inputs must be (resize, crop, mean and std, interpolation).
        device: ``gpu`` (nvJPEG and GPU operators) or ``cpu`` (host threads only).
        batch_size: The most images one pipeline run takes; longer lists run in parts.
        threads: Host threads DALI uses.
        device_id: The CUDA device (``gpu`` only).

    A pipeline runs one batch at a time: :meth:`decode` holds a lock while it runs.
    """

    def __init__(
        self,
        preset: Preset,
        *,
        device: Literal["cpu", "gpu"],
        batch_size: int = 64,
        threads: int = 2,
        device_id: int = 0,
    ) -> None:
        dali = importlib.import_module("nvidia.dali")  # optional, and loosely typed
        fn, types = dali.fn, dali.types

        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be cpu or gpu, not {device!r}")
        self.name = f"dali-{device}"
        self.preset = preset
        self._batch_size = batch_size
        self._lock = threading.Lock()
        interpolation = getattr(types, _INTERPOLATION[preset.interpolation])

        @dali.pipeline_def(  # type: ignore[untyped-decorator]
            batch_size=batch_size,
            num_threads=max(1, threads),
            device_id=device_id if device == "gpu" else None,
            prefetch_queue_depth=1,
        )
        def pipeline() -> Any:
            encoded = fn.external_source(name="encoded", dtype=types.UINT8)
            # Sizes and crop anchors computed on the host exactly as Pillow's path does
            # (the longer side truncated, the anchor rounded half to even): DALI's own
            # rounding moved crops by a pixel, which moved every input by a pixel.
            size = fn.external_source(name="size", dtype=types.FLOAT)
            anchor = fn.external_source(name="anchor", dtype=types.INT32)
            images = fn.decoders.image(
                encoded, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB
            )
            images = fn.resize(images, size=size, interp_type=interpolation, antialias=True)
            images = fn.slice(images, anchor, (preset.crop, preset.crop), axes=(0, 1))
            return fn.crop_mirror_normalize(
                images,
                mean=[255.0 * m for m in preset.mean],
                std=[255.0 * s for s in preset.std],
                output_layout="CHW",
                dtype=types.FLOAT,
            )

        self._make_pipeline = pipeline
        self._pipeline = self._build()

    def _build(self) -> Any:
        built = self._make_pipeline()
        built.build()
        return built

    def decode(
        self, images: Sequence[bytes | memoryview], out: np.ndarray, *, keys: Sequence[str]
    ) -> np.ndarray:
        """Decode ``images`` into ``out`` (``[len(images), 3, crop, crop]`` float32).

        Raises:
            UndecodableObject: An image DALI cannot decode, named by its key.
        """
        for start in range(0, len(images), self._batch_size):
            part = slice(start, start + self._batch_size)
            self._run(images[part], out[part], keys[part])
        return out

    def _run(
        self, images: Sequence[bytes | memoryview], out: np.ndarray, keys: Sequence[str]
    ) -> None:
        try:
            rows = self._pipeline_run(images)
        except RuntimeError as exc:
            with self._lock:  # a pipeline that failed runs no more
                self._pipeline = self._build()
            if len(images) == 1:
                said = str(exc).strip().splitlines()[0][:200]
                raise UndecodableObject(keys[0], f"DALI cannot decode it ({said})") from None
            for index in range(len(images)):  # name the image that failed
                self._run(images[index : index + 1], out[index : index + 1], keys[index:])
            return
        for index, row in enumerate(rows):
            out[index] = row

    def _geometry(self, image: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
        """The resized ``(height, width)`` and the crop's ``(top, left)``, as
        :func:`hapi.models.preprocess` computes them (from the header, oriented)."""
        try:
            with Image.open(io.BytesIO(image)) as opened:
                width, height = opened.size
                if opened.getexif().get(_ORIENTATION, 1) in _TRANSPOSED:
                    width, height = height, width
        except (OSError, ValueError, SyntaxError):
            width, height = 1, 1  # DALI reports the image as undecodable
        width, height = _resized_size(width, height, self.preset.resize)
        crop = self.preset.crop
        top, left = round((height - crop) / 2.0), round((width - crop) / 2.0)
        return np.array([height, width], np.float32), np.array([top, left], np.int32)

    def _pipeline_run(self, images: Sequence[bytes | memoryview]) -> list[np.ndarray]:
        sizes, anchors = [], []
        for image in images:
            size, anchor = self._geometry(image)
            sizes.append(size)
            anchors.append(anchor)
        with self._lock:
            self._pipeline.feed_input("encoded", [np.frombuffer(i, np.uint8) for i in images])
            self._pipeline.feed_input("size", sizes)
            self._pipeline.feed_input("anchor", anchors)
            (batch,) = self._pipeline.run()
            if hasattr(batch, "as_cpu"):
                batch = batch.as_cpu()
            return [np.asarray(batch.at(i)) for i in range(len(images))]
