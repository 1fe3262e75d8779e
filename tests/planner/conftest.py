"""A small real model in the session's store, for the CLI and live-gateway tests."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from hapi.models import Manifest, Registry, export_model
from tests.support import empty_bucket


@pytest.fixture(scope="package")
def planned_model(backend_s3: Any) -> Iterator[tuple[str, Manifest]]:
    """ResNet18 (seeded random weights) frozen at block 4, in a registry bucket of its own."""
    bucket = f"hapi-plan-{secrets.token_hex(6)}"
    manifest = Registry(backend_s3, bucket).register("r18", export_model("resnet18", freeze=4))
    yield bucket, manifest
    empty_bucket(backend_s3, bucket)
    backend_s3.delete_bucket(Bucket=bucket)
