"""Synthetic results for the report and plot tests."""

from __future__ import annotations

import pytest

from hapi_bench.reports._results import CellResult
from tests.bench.support import cell, run


@pytest.fixture
def cells() -> list[CellResult]:
    """Two cells: a network-bound one where the pick wins 4x and is the best, and a
    compute-bound one where the pick is 10% behind the best."""
    network = cell(
        "network-bound",
        10,
        [
            run(None, 20.0, client_cpu_s=5.0, link_s=19.0),
            run(None, 26.0, loader="sdk", client_cpu_s=5.0, link_s=19.0),
            run(9, 40.0, measured=False, link_s=40.0, link_bytes=100 * 100_000),
            run(10, 5.0, storage_cpu_s=4.6, client_cpu_s=0.2, link_s=0.2, attempts_s=(5.0,)),
        ],
    )
    compute = cell(
        "compute-bound",
        8,
        [
            run(None, 5.0),
            run(8, 5.5, storage_cpu_s=4.4, link_bytes=100 * 100_000),
            run(10, 5.0 / 1.05, storage_cpu_s=4.5),
        ],
        ratio=0.25,
        bandwidth_bps=30e6,
    )
    return [network, compute]
