"""Fixtures for the registry tests: exports shared by the session, a registry per test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image

from hapi.models import ExportedModel, Registry, export_model, preprocess_batch, sample_images
from hapi.models.testing import Decomposition, build


@pytest.fixture(scope="session")
def photos() -> list[Image.Image]:
    """Real photos: a cat (chelsea), an astronaut, coffee, a rocket."""
    return sample_images()


@pytest.fixture(scope="session")
def effnet() -> Decomposition:
    """EfficientNet-Lite0 with its real ImageNet weights, as torch blocks."""
    return build("efficientnet_lite0")


@pytest.fixture(scope="session")
def effnet_export(effnet: Decomposition) -> ExportedModel:
    return export_model(effnet)


@pytest.fixture(scope="session")
def resnet18() -> Decomposition:
    return build("resnet18")


@pytest.fixture(scope="session")
def resnet18_export(resnet18: Decomposition) -> ExportedModel:
    return export_model(resnet18)


@pytest.fixture
def registry(backend_s3: Any, unique_bucket: str) -> Registry:
    """A registry in a fresh bucket of the session's real store."""
    return Registry(backend_s3, unique_bucket)


@pytest.fixture
def stored(backend_s3: Any, unique_bucket: str) -> Callable[[str], dict[str, int]]:
    """``stored(prefix)``: the objects under ``prefix`` in the test's bucket, key -> size."""

    def listing(prefix: str = "") -> dict[str, int]:
        pages = backend_s3.get_paginator("list_objects_v2").paginate(
            Bucket=unique_bucket, Prefix=prefix
        )
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    return listing


def _torch_upto(decomposition: Decomposition, batch: np.ndarray, stop: int) -> np.ndarray:
    import torch

    x = torch.from_numpy(batch)
    with torch.no_grad():
        for block in decomposition.blocks[:stop]:
            x = block(x)
    return x.numpy()


@pytest.fixture(scope="session")
def torch_upto() -> Callable[[Decomposition, np.ndarray, int], np.ndarray]:
    """``torch_upto(d, batch, k)``: torch's output of blocks ``[0, k)`` (``batch`` for k=0)."""
    return _torch_upto


@pytest.fixture(scope="session")
def photo_batch(photos: list[Image.Image]) -> Callable[[Decomposition], np.ndarray]:
    """``photo_batch(d)``: the photos preprocessed with ``d``'s preset, NCHW float32."""
    return lambda d: preprocess_batch(photos, d.preset)


@pytest.fixture(scope="session")
def resnet50_pair() -> tuple[ExportedModel, ExportedModel]:
    """ResNet50 and a child whose last two blocks with weights (layer4.2, fc) changed."""
    import torch

    decomposition = build("resnet50")
    base = export_model(decomposition)
    with torch.no_grad():
        for index in (16, 18):  # block 17 is pooling: nothing to fine-tune
            for parameter in decomposition.blocks[index].parameters():
                parameter.mul_(1.01)
    return base, export_model(decomposition)
