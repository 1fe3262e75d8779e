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
features locally, after one :class:`FallbackWarning`; a refusal (:class:`AccessDenied`) or
a server error is raised at the batch it concerns instead, never fallen back from.

``sdk.client()`` is an ordinary boto3 S3 client with ``get_features`` and
``get_features_batch`` added, for code that wants the tensors without a dataset.

Several gateways in front of one store can share the load: pass them all
(``endpoint_url="http://a:8080,http://b:8080"`` or a list) and feature requests are
spread over them, with a request that meets a dead gateway retried on another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hapi.protocol import AugmentPolicy

from .client._client import client
from .client._errors import (
    AccessDenied,
    EndpointsUnavailable,
    InvalidArgument,
    LabelError,
    ModelUnavailable,
    NoSuchKey,
    NoSuchModel,
    ProbeError,
    PushdownUnavailable,
    RequestError,
    SDKError,
    SlowDown,
    StateMismatch,
    UnprocessableObject,
)
from .client._features import Features
from .client._probe import GatewayAuth, fetch_gateway_profile, probe_bandwidth
from .client._sources import LABEL_SOURCES
from .datasets._compute import FallbackWarning
from .datasets._constructors import DatasetOptions
from .planning._measure import measure_client_blocks, measure_decode_ms, measure_request_ms
from .planning._split import SplitChoice
from .planning._stats import EpochStats

if TYPE_CHECKING:
    from .datasets._dataset import FeatureDataset
    from .datasets._iterable import IterableFeatureDataset

__all__ = [
    "LABEL_SOURCES",
    "AccessDenied",
    "AugmentPolicy",
    "DatasetOptions",
    "EndpointsUnavailable",
    "EpochStats",
    "FallbackWarning",
    "FeatureDataset",
    "Features",
    "GatewayAuth",
    "InvalidArgument",
    "IterableFeatureDataset",
    "LabelError",
    "ModelUnavailable",
    "NoSuchKey",
    "NoSuchModel",
    "ProbeError",
    "PushdownUnavailable",
    "RequestError",
    "SDKError",
    "SlowDown",
    "SplitChoice",
    "StateMismatch",
    "UnprocessableObject",
    "client",
    "fetch_gateway_profile",
    "measure_client_blocks",
    "measure_decode_ms",
    "measure_request_ms",
    "probe_bandwidth",
]


def __getattr__(name: str) -> object:
    # The dataset classes need torch. Loading them on first use keeps `import hapi.sdk`
    # free of it: the pushdown path (`client().get_features`) works with the lean
    # install, and the `hapi` CLI starts seconds faster everywhere.
    if name == "FeatureDataset":
        from .datasets._dataset import FeatureDataset

        return FeatureDataset
    if name == "IterableFeatureDataset":
        from .datasets._iterable import IterableFeatureDataset

        return IterableFeatureDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
