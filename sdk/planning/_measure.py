"""Measuring this machine for the planner: block timings, decoding, and one request's CPU.

The planner is pure (it takes figures); the figures of the client side come from here.
:func:`measure_client_blocks` and :func:`measure_decode_ms` time what onnxruntime and
Pillow take here, on real photos, and :func:`measure_request_ms` what one GET costs this
process's CPU.
"""

from __future__ import annotations

import functools
import io
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, Unpack

import numpy as np
from PIL import Image

from hapi.models import (
    Manifest,
    Preset,
    Registry,
    RuntimeSettings,
    create_session,
    preprocess,
    preprocess_batch,
    sample_images,
)
from hapi.planner import InvalidInput
from hapi.protocol import share_of_zeros

DEFAULT_MEASURE_BATCH = 8


class BlockOptions(TypedDict, total=False):
    """How :func:`measure_client_blocks` and :func:`run_client_blocks` run the blocks."""

    batch_size: int
    runs: int
    images: Sequence[Image.Image] | None
    settings: RuntimeSettings | None
    inputs: np.ndarray | None


def measure_client_blocks(
    registry: Registry, manifest: Manifest, **options: Unpack[BlockOptions]
) -> tuple[float, ...]:
    """Time each frozen block here with onnxruntime, on real preprocessed photos.

    Each block gets its own session and the previous block's real output as input; the
    time is the best of ``runs`` (after one warm-up run), divided by the batch size.

    Args:
        registry: Where the blocks are.
        manifest: The model.
        batch_size: Samples per timed run (photos repeat to fill it).
        runs: Timed runs per block.
        images: Photos to use; scikit-image's sample photos if omitted.
        settings: onnxruntime device and threads (``auto``: CUDA when usable).
        inputs: Preprocessed samples ``[n, ...]`` to use instead of photos (e.g. a
            dataset's own objects, decoded as the gateway decodes them).

    Returns:
        Milliseconds per sample for each block of ``[0, freeze)``.

    Raises:
        hapi.models.ModelError: A block cannot be fetched or run, or no photos (without
            scikit-image installed, pass ``images``).
    """
    return run_client_blocks(registry, manifest, **options)[0]


def run_client_blocks(
    registry: Registry,
    manifest: Manifest,
    *,
    batch_size: int = DEFAULT_MEASURE_BATCH,
    runs: int = 3,
    images: Sequence[Image.Image] | None = None,
    settings: RuntimeSettings | None = None,
    inputs: np.ndarray | None = None,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """:func:`measure_client_blocks`, and each block's share of zero values in its real
    output (what the ``zeros`` encoding leaves off the wire at the split after it).

    Raises:
        As :func:`measure_client_blocks`.
    """
    if batch_size < 1 or runs < 1:
        raise InvalidInput("need a batch size >= 1 and runs >= 1")
    if inputs is not None:
        if not len(inputs):
            raise InvalidInput("need at least one sample")
        batch: np.ndarray = np.resize(inputs, (batch_size, *inputs.shape[1:])).astype(np.float32)
    else:
        photos = list(images) if images is not None else sample_images()
        if not photos:
            raise InvalidInput("need at least one image")
        batch = preprocess_batch((photos * batch_size)[:batch_size], manifest.preprocess)
    if manifest.input.dtype == "float16":
        batch = batch.astype(np.float16)
    times, zeros = [], []
    for index in range(manifest.freeze):
        session = create_session(registry.load_blocks(manifest, index, index + 1), settings)
        feed = {session.get_inputs()[0].name: batch}
        batch = np.asarray(session.run(None, feed)[0])  # a warm-up; feeds the next block
        times.append(_best_ms(functools.partial(session.run, None, feed), runs) / batch_size)
        zeros.append(share_of_zeros(batch))
    return tuple(times), tuple(zeros)


def _best_ms(call: Callable[[], Any], runs: int) -> float:
    best = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1000.0


def measure_request_ms(
    s3: Any, bucket: str, key: str, *, runs: int = 8, byte_range: str | None = None
) -> float:
    """The CPU time this thread spends on one GET of ``s3://bucket/key`` with ``s3`` (a
    boto3 client): signing, sending, reading and parsing, the median of ``runs`` after
    one warm-up. CPU time, not wall time: waiting for the network costs no CPU, and
    the network is priced apart. ``byte_range`` (an HTTP ``Range``, e.g. ``bytes=0-0``)
    times a request's fixed cost without moving the object: what a job on a slow link
    measures, so that planning sends next to nothing.

    Raises:
        InvalidInput: ``runs`` < 1.
    """
    if runs < 1:
        raise InvalidInput("runs must be >= 1")

    ranged = {} if byte_range is None else {"Range": byte_range}

    def get() -> None:
        s3.get_object(Bucket=bucket, Key=key, **ranged)["Body"].read()

    get()  # the connection and the client's lazy set-up
    times = []
    for _ in range(runs):
        started = time.thread_time()
        get()
        times.append(time.thread_time() - started)
    return 1000.0 * statistics.median(times)


def measure_decode_ms(
    preset: Preset,
    *,
    images: Sequence[Image.Image] | None = None,
    runs: int = 3,
    quality: int = 90,
) -> float:
    """Time decoding and preprocessing JPEGs here with Pillow, ms per sample.

    The photos are encoded as JPEG once (``quality``), then decoded and preprocessed with
    ``preset`` as the gateway and the SDK do; the best of ``runs`` passes counts.

    Raises:
        hapi.models.ModelError: No photos (without scikit-image installed, pass ``images``).
    """
    photos = list(images) if images is not None else sample_images()
    if not photos or runs < 1:
        raise InvalidInput("need at least one image and runs >= 1")
    blobs = [_jpeg(photo, quality) for photo in photos]

    def decode_all() -> None:
        for blob in blobs:
            with Image.open(io.BytesIO(blob)) as image:
                preprocess(image, preset)

    return _best_ms(decode_all, runs) / len(blobs)


def _jpeg(image: Image.Image, quality: int) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()
