"""One multi-node testbed per session: three storage nodes (a volume server, an S3 endpoint
and a gateway each, in namespaces of their own), master and filer, and the client's
namespace; objects pinned to the nodes under ``nI/`` prefixes; a model in the registry.

Every test module here is marked ``cluster`` and runs only under ``make test-cluster``
(root, network namespaces, tc, cgroups); without root they skip.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

NODES = 3
PER_NODE = 24  # objects pinned to each node
FREEZE = 6


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths, tc)"
    if not all(shutil.which(tool) for tool in ("ip", "tc")):
        return "needs ip and tc (iproute2)"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = _unavailable()
    for item in items:
        if reason and Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The testbed with its objects (:class:`hapi_bench.cluster._cluster.Objects`), started once,
    torn down at the end of the session."""
    from hapi_bench.cluster._cluster import Testbed, TestbedSpec

    workdir = tmp_path_factory.mktemp("cluster")
    with Testbed(TestbedSpec(nodes=NODES, workdir=workdir, cpus=0.5)) as testbed:
        yield testbed.load(NODES * PER_NODE, freeze=FREEZE, seed=31)


def report(name: str, line: str) -> None:
    """Keep ``line`` for `make test-cluster` to print (in ``$HAPI_CLUSTER_OUT``)."""
    out = os.environ.get("HAPI_CLUSTER_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(line + "\n")


def fetched(testbed: Any, roles: Iterable[str]) -> dict[str, float]:
    """The object fetches the gateways of ``roles`` counted so far, summed, by placement
    (``local``, ``remote``, ``unknown``): their ``/metrics``."""
    total = dict.fromkeys(("local", "remote", "unknown"), 0.0)
    for role in roles:
        for where, count in testbed.fetches(role).items():
            total[where] += count
    return total


def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What was counted between two :func:`fetched` readings."""
    return {where: after[where] - before[where] for where in after}
