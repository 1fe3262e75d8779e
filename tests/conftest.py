"""Shared fixtures: one real SeaweedFS store per test session, on a free loopback port,
and the real gateway (``hapi serve`` under uvicorn) in front of it.

Module level stays light (boto3, httpx and the store module only) so unit tests collect fast.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from hapi.protocol import Credentials
from hapi.store import (
    EmbeddedStore,
    StoreIdentity,
    StoreSettings,
    free_port,
    load_or_create_credentials,
)
from tests.support import RunningGateway, empty_bucket, store_gateway

# Two tenants of the store with their own permissions: each may create, read and write
# buckets named after it, and read the registry; neither may touch the other's buckets.
TENANTS = {
    name: Credentials(name.upper() + secrets.token_hex(6).upper(), secrets.token_hex(20))
    for name in ("alice", "bob")
}


@pytest.fixture(autouse=True)
def bandwidth_memory(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """Each test's own cache directory: the SDK remembers the bandwidth it measured there
    (``$XDG_CACHE_HOME/hapi``), and no test starts from another's figure or the user's.
    It exists, as for every user (onnxruntime keeps an id there too), beside the test's
    ``tmp_path``, whose contents some tests check."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("HAPI_BANDWIDTH", raising=False)
    return cache / "hapi"


def tenant_actions(name: str) -> tuple[str, ...]:
    own = tuple(f"{action}:{name}-*" for action in ("Admin", "Read", "Write", "List", "Tagging"))
    return (*own, "Read:hapi-models", "List:hapi-models")


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStore]:
    """A running embedded store, stopped at the end of the session however tests end: its
    own identity (allowed everything) and the two :data:`TENANTS`."""
    root = tmp_path_factory.mktemp("store")
    creds = load_or_create_credentials(root / "state", None, None)
    settings = StoreSettings(
        data_dir=root / "data",
        port=free_port(),
        access_key_id=creds.access_key_id,
        secret_access_key=creds.secret_access_key,
        identities=tuple(
            StoreIdentity(name, pair, tenant_actions(name)) for name, pair in TENANTS.items()
        ),
    )
    with EmbeddedStore(settings) as running:
        yield running


def _client(store: EmbeddedStore) -> Any:
    """A boto3 S3 client for ``store``: path-style, us-east-1, its credentials."""
    return boto3.client(
        "s3",
        endpoint_url=store.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=store.credentials.access_key_id,
        aws_secret_access_key=store.credentials.secret_access_key,
        config=Config(s3={"addressing_style": "path"}),
    )


@pytest.fixture(scope="session")
def backend_s3(store: EmbeddedStore) -> Any:
    """A boto3 S3 client talking straight to the store, bypassing any gateway."""
    return _client(store)


@pytest.fixture
def unique_bucket(backend_s3: Any) -> Iterator[str]:
    """A fresh, randomly named bucket on the store; emptied and deleted afterwards."""
    name = f"hapi-test-{secrets.token_hex(6)}"
    backend_s3.create_bucket(Bucket=name)
    yield name
    empty_bucket(backend_s3, name)
    backend_s3.delete_bucket(Bucket=name)


@pytest.fixture
def bucket(unique_bucket: str) -> str:
    """A fresh bucket (created on the store, used through the gateway)."""
    return unique_bucket


@pytest.fixture(scope="session")
def gateway(store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """One gateway process for the session, stopped however the tests end."""
    with store_gateway(store, tmp_path_factory.mktemp("gateway")) as running:
        yield running


@pytest.fixture(scope="session")
def s3(gateway: RunningGateway) -> Any:
    """A plain boto3 client whose endpoint is the gateway."""
    return boto3.client(
        "s3",
        endpoint_url=gateway.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=gateway.access_key_id,
        aws_secret_access_key=gateway.secret_access_key,
        config=Config(signature_version="s3v4", retries={"max_attempts": 1}),
    )


@pytest.fixture(scope="session")
def registered(backend_s3: Any) -> dict[str, Any]:
    """Two model families exported from torch and registered in the store's registry.

    ``r18``: ResNet18 (seeded random weights) frozen at block 6; ``enl0``:
    EfficientNet-Lite0 with its real ImageNet weights, at its default freeze point.
    """
    from hapi import models

    registry = models.Registry(backend_s3)
    return {
        "r18": registry.register("r18", models.export_model("resnet18", freeze=6)),
        "enl0": registry.register("enl0", models.export_model("efficientnet_lite0")),
    }
