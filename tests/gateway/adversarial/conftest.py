"""Fixtures of the adversarial suite: the session's real store and gateway, plus one more
gateway with short edge limits, so tests that exhaust them do not disturb the others."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import RunningGateway, store_gateway


@pytest.fixture(scope="module")
def edge_gateway(store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """A gateway of its own with short edge limits: head size and time, keep-alive, connections."""
    env = {
        "HAPI_MAX_HEADER_BYTES": "16KiB",
        "HAPI_HEADER_TIMEOUT_S": "1",
        "HAPI_KEEP_ALIVE_TIMEOUT_S": "2",
        "HAPI_MAX_CONNECTIONS": "8",
    }
    with store_gateway(
        store,
        tmp_path_factory.mktemp("edge-gateway"),
        env=env,
    ) as running:
        yield running
