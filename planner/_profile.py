"""Profiles: from a manifest's export-time figures, or measured on this machine.

A manifest records each block's output bytes, peak activation bytes, weights and CPU time
per sample on the exporting machine; :func:`profile_from_manifest` assumes those times
for both sides. :func:`measure_client_blocks` and :func:`measure_decode_ms` replace the
client side's figures with what onnxruntime and Pillow take here, on real photos, and
:func:`measure_request_ms` what one GET costs this process's CPU.
"""

from __future__ import annotations

import functools
import io
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

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

from ._cost import Profile
from ._errors import InvalidInput

DEFAULT_RAW_BYTES = 110_000
"""Mean bytes of one ImageNet JPEG (they range over about 50-150 KB)."""
DEFAULT_DECODE_MS = 10.0
"""Decoding and preprocessing one ImageNet-sized JPEG with Pillow on one CPU core."""
DEFAULT_MEASURE_BATCH = 8
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def profile_from_manifest(
    manifest: Manifest,
    *,
    storage_ms: Sequence[float] | None = None,
    client_ms: Sequence[float] | None = None,
    raw_bytes: float = DEFAULT_RAW_BYTES,
    storage_decode_ms: float = DEFAULT_DECODE_MS,
    client_decode_ms: float = DEFAULT_DECODE_MS,
    head_ms: float = 0.0,
    client_request_ms: float = 0.0,
    head_memory_bytes: int = 0,
    storage_memory_bytes: int | None = None,
    client_memory_bytes: int | None = None,
    storage_load: float = 1.0,
    wire_dtype: str | None = None,
    shared_compute: bool = False,
) -> Profile:
    """A profile of ``manifest``'s frozen blocks, with the manifest's ``cpu_ms`` for both
    sides unless measured times are given.

    Args:
        manifest: The model.
        storage_ms: Per-block storage-side ms per sample (e.g. from
            :meth:`GatewayProfile.storage_ms`); the manifest's ``cpu_ms`` if omitted.
        client_ms: Per-block client ms per sample (e.g. from
            :func:`measure_client_blocks`); the manifest's ``cpu_ms`` if omitted.
        raw_bytes: Mean object bytes per sample.
        storage_decode_ms: Decode and preprocess ms per sample on the storage side.
        client_decode_ms: The same on the client (see :func:`measure_decode_ms`).
        head_ms: The head's training step, ms per sample.
        client_request_ms: The client's CPU time per request (see
            :func:`measure_request_ms`); 0 leaves requests unpriced.
        head_memory_bytes: Client memory the head's training needs.
        storage_memory_bytes: The storage side's budget; ``None`` for unlimited.
        client_memory_bytes: The client's budget; ``None`` for unlimited.
        storage_load: Factor on storage-side time for a shared device.
        wire_dtype: The ``x-hapi-dtype`` features travel in (``float16`` halves float32
            bytes); the blocks' own dtype if omitted.
        shared_compute: Both tiers run on the same machine's cores (see
            :attr:`Profile.shared_compute`).

    Raises:
        InvalidInput: A per-block sequence of the wrong length, an unknown dtype, or a
            negative figure.
    """
    frozen = manifest.blocks[: manifest.freeze]
    scale = _wire_scale(manifest, wire_dtype)
    return Profile(
        storage_ms=_per_block(storage_ms, manifest, "storage_ms"),
        client_ms=_per_block(client_ms, manifest, "client_ms"),
        output_bytes=tuple(math.ceil(b.output_bytes * scale) for b in frozen),
        peak_activation_bytes=tuple(b.peak_activation_bytes for b in frozen),
        weight_bytes=tuple(b.size for b in frozen),
        input_bytes=math.ceil(_input_bytes(manifest) * scale),
        raw_bytes=raw_bytes,
        storage_decode_ms=storage_decode_ms,
        client_decode_ms=client_decode_ms,
        head_ms=head_ms,
        client_request_ms=client_request_ms,
        head_memory_bytes=head_memory_bytes,
        storage_memory_bytes=storage_memory_bytes,
        client_memory_bytes=client_memory_bytes,
        storage_load=storage_load,
        wire_dtype=wire_dtype or manifest.input.dtype,
        shared_compute=shared_compute,
    )


def _per_block(values: Sequence[float] | None, manifest: Manifest, what: str) -> tuple[float, ...]:
    if values is None:
        return tuple(block.cpu_ms for block in manifest.blocks[: manifest.freeze])
    if len(values) < manifest.freeze:
        raise InvalidInput(
            f"{what} has {len(values)} entries; {manifest.ref} has {manifest.freeze} frozen blocks"
        )
    return tuple(float(v) for v in values[: manifest.freeze])


def _itemsize(dtype: str) -> int:
    try:
        return _ITEMSIZE[dtype]
    except KeyError:
        raise InvalidInput(f"unknown dtype {dtype!r}; known: {', '.join(_ITEMSIZE)}") from None


def _input_bytes(manifest: Manifest) -> int:
    return int(math.prod(manifest.input.shape)) * _itemsize(manifest.input.dtype)


def _wire_scale(manifest: Manifest, wire_dtype: str | None) -> float:
    if wire_dtype is None:
        return 1.0
    return _itemsize(wire_dtype) / _itemsize(manifest.input.dtype)


def measure_client_blocks(
    registry: Registry,
    manifest: Manifest,
    *,
    batch_size: int = DEFAULT_MEASURE_BATCH,
    runs: int = 3,
    images: Sequence[Image.Image] | None = None,
    settings: RuntimeSettings | None = None,
    inputs: np.ndarray | None = None,
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
    times = []
    for index in range(manifest.freeze):
        session = create_session(registry.load_blocks(manifest, index, index + 1), settings)
        feed = {session.get_inputs()[0].name: batch}
        batch = np.asarray(session.run(None, feed)[0])  # a warm-up; feeds the next block
        times.append(_best_ms(functools.partial(session.run, None, feed), runs) / batch_size)
    return tuple(times)


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
