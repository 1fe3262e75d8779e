"""hapi.sdk: read features instead of images from an S3 store behind a hapi gateway.

Point the endpoint at the gateway and swap the dataset; the training loop stays the same::

    from hapi import sdk
    from torch.utils.data import DataLoader

    train = sdk.FeatureDataset.from_prefix(
        "s3://data/train/", model="efficientnet_lite0", split="auto", labels="folder"
    )
    for features, labels in DataLoader(train, batch_size=64, shuffle=True, num_workers=2):
        loss = criterion(head(features), labels)

``features`` is what the model's frozen blocks ``[0, freeze)`` produce, whatever split
the gateway ran, so the head sees the same tensor at any split. Against a plain S3 store
(or a gateway without the model) the dataset reads the raw objects and computes the same
features locally, after one :class:`FallbackWarning`.

``sdk.client()`` is an ordinary boto3 S3 client with ``get_features`` and
``get_features_batch`` added, for code that wants the tensors without a dataset.
"""

from __future__ import annotations

from ._client import Features, client
from ._compute import FallbackWarning
from ._dataset import FeatureDataset, IterableFeatureDataset
from ._errors import (
    InvalidArgument,
    LabelError,
    ModelUnavailable,
    NoSuchKey,
    NoSuchModel,
    PushdownUnavailable,
    RequestError,
    SDKError,
    SlowDown,
    UnprocessableObject,
)
from ._sources import LABEL_SOURCES
from ._split import SplitChoice
from ._stats import EpochStats

__all__ = [
    "LABEL_SOURCES",
    "EpochStats",
    "FallbackWarning",
    "FeatureDataset",
    "Features",
    "InvalidArgument",
    "IterableFeatureDataset",
    "LabelError",
    "ModelUnavailable",
    "NoSuchKey",
    "NoSuchModel",
    "PushdownUnavailable",
    "RequestError",
    "SDKError",
    "SlowDown",
    "SplitChoice",
    "UnprocessableObject",
    "client",
]
