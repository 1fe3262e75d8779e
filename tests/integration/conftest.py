"""The real gateway (``hapi serve`` under uvicorn) in front of the session's real store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.support import RunningGateway, gateway_process


@pytest.fixture(scope="session")
def gateway(store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """One gateway process for the session, stopped however the tests end."""
    with gateway_process(
        backend_url=store.endpoint_url,
        backend_key=store.credentials.access_key_id,
        backend_secret=store.credentials.secret_access_key,
        log_dir=tmp_path_factory.mktemp("gateway"),
    ) as running:
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


@pytest.fixture
def bucket(unique_bucket: str) -> str:
    """A fresh bucket (created on the store, used through the gateway)."""
    return unique_bucket
