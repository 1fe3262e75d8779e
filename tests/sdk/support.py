"""Helpers shared by the SDK's tests."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from PIL import Image

from hapi.sdk.datasets._prefetch import Deferred, Fetch

T = TypeVar("T")
R = TypeVar("R")


def picture(kind: str, seed: int) -> bytes:
    """A small, distinct, deterministic JPEG of a class of shapes."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:96, 0:112]
    cx, cy = rng.integers(30, 80), rng.integers(30, 66)
    if kind == "circle":
        mask = (x - cx) ** 2 + (y - cy) ** 2 < rng.integers(200, 900)
    elif kind == "square":
        mask = (abs(x - cx) < 20) & (abs(y - cy) < 20)
    else:
        mask = (x // rng.integers(4, 12)) % 2 == 0
    pixels = (rng.random((96, 112, 3)) * 60).astype(np.uint8)
    pixels[mask] = rng.integers(120, 255, size=3)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def on_fetch_threads(fetch: Callable[[T], Callable[[], R]]) -> Callable[[T], Fetch[R]]:
    """A pipeline's ``start`` that queues nothing: ``fetch(job)`` runs on a fetch thread."""
    return lambda job: Deferred(functools.partial(fetch, job))
