"""One multi-node testbed per session: three storage nodes (a volume server, an S3 endpoint
and a gateway each, in namespaces of their own), master and filer, and the client's
namespace; objects pinned to the nodes under ``nI/`` prefixes; a model in the registry.

Every test module here is marked ``cluster`` and runs only under ``make test-cluster`` (root,
network namespaces, tc, cgroups); without root they skip.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

NODES = 3
PER_NODE = 24  # objects pinned to each node
SPLIT = 6  # the model's freeze point: the client runs no blocks of its own


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


@dataclass
class Loaded:
    """The session's testbed with its objects and model."""

    testbed: Any
    bucket: str
    keys: list[str]  # n1/00000.jpg, n2/00001.jpg, ...: object j on node j % NODES
    sizes: dict[str, int]
    model: str

    def node_of(self, key: str) -> str:
        return key.split("/", 1)[0]

    def job(self, *, placement: str | None, request_size: int = 8) -> dict[str, Any]:
        testbed = self.testbed
        warm = [[testbed.gateway_url(role), self._first(role)] for role in testbed.roles]
        return {
            "bucket": self.bucket,
            "keys": self.keys,
            "model": self.model,
            "split": SPLIT,
            "dtype": "float16",
            "endpoints": testbed.gateway_urls,
            "placement": placement,
            "request_size": request_size,
            "prefetch": 2,
            "warm": warm,
        }

    def _first(self, role: str) -> str:
        return next(key for key in self.keys if self.node_of(key) == role)

    @property
    def placement(self) -> str:
        cluster = self.testbed.cluster
        return f"seaweedfs:filer={cluster.filer_url},master={cluster.master_url}"


@pytest.fixture(scope="session")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    """The testbed, started once, torn down at the end of the session."""
    from hapi import models
    from hapi_bench._cluster import Testbed, TestbedSpec
    from hapi_bench._data import generate

    workdir = tmp_path_factory.mktemp("cluster")
    with Testbed(TestbedSpec(nodes=NODES, workdir=workdir, cpus=0.5)) as testbed:
        cluster = testbed.cluster
        s3 = cluster.s3_client(testbed.roles[0])
        s3.create_bucket(Bucket="data")
        for role in testbed.roles:
            cluster.pin("data", f"{role}/", role)
        samples = generate(NODES * PER_NODE, models.sample_images(), seed=31)
        keys, sizes = [], {}
        for number, sample in enumerate(samples):
            key = f"{testbed.roles[number % NODES]}/{number:05d}.jpg"
            s3.put_object(Bucket="data", Key=key, Body=sample.data)
            keys.append(key)
            sizes[key] = len(sample.data)
        s3.create_bucket(Bucket="hapi-models")
        manifest = models.Registry(s3).register(
            "r18", models.export_model("resnet18", freeze=SPLIT)
        )
        yield Loaded(testbed, "data", keys, sizes, manifest.ref)


@dataclass
class Epoch:
    """One measured epoch: what the client reported and what crossed each node's link."""

    done: dict[str, Any]
    links: dict[str, Any]  # role -> hapi_bench._cluster_net.Counters during the epoch

    @property
    def object_bytes(self) -> int:
        """Bytes the volume servers sent over node links: objects read from another node."""
        return sum(counters.objects for counters in self.links.values())

    def counts(self) -> dict[int, int]:
        return {int(label): count for label, count in self.done["labels"].items()}


def run_epoch(
    loaded: Loaded,
    *,
    placement: str | None,
    request_size: int = 8,
    during: Any = None,
) -> Epoch:
    """An epoch over every object from the client's namespace; ``during(event)`` is called
    with each progress event (to kill a gateway mid-epoch)."""
    testbed = loaded.testbed
    client = testbed.client(loaded.job(placement=placement, request_size=request_size))
    try:
        client.until("ready", timeout_s=180)
        before = testbed.counters()
        client.go()
        while (event := client.event(timeout_s=180))["event"] != "done":
            if during is not None:
                during(event)
        after = testbed.counters()
    finally:
        client.close()
    return Epoch(event, {role: after[role] - before[role] for role in after})


def report(name: str, line: str) -> None:
    """Keep ``line`` for `make test-cluster` to print (in ``$HAPI_CLUSTER_OUT``)."""
    out = os.environ.get("HAPI_CLUSTER_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(line + "\n")
