"""Fixtures of the models' integration tests: the CLI against the session's real store."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from hapi.models._cli import models
from tests.support import store_env


@pytest.fixture
def invoke(store: Any, unique_bucket: str):
    """Run ``hapi models ARGS --bucket <test bucket>`` with the store in the environment."""
    env = store_env(store)

    def run(*args: str):
        return CliRunner().invoke(models, [*args, "--bucket", unique_bucket], env=env)

    return run
