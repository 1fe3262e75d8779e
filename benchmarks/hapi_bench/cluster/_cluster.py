"""The multi-node testbed: a SeaweedFS cluster with a hapi gateway on every storage node.

:class:`Testbed` makes the network (:mod:`._cluster_net`: blackhole first, a namespace per
node, shaped links, CPU quotas), starts :class:`hapi.store.SeaweedCluster` in it (master and
filer in ``ctl``, a volume server and an S3 endpoint in each ``nI``), then ``hapi serve`` in
each storage node's namespace with that node's S3 endpoint as its backend. The training
client runs in ``cli`` (:meth:`Testbed.client`, which starts :mod:`._cluster_client`).
Leaving the context manager tears everything down and says what could not be removed.

Every node's processes run under the node's CPU quota when ``cpus`` is given: the cluster
then fits a small machine honestly (three storage nodes at half a core each, not three
nodes each believing it has the whole machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import httpx
from botocore.credentials import Credentials as BotoCredentials
from prometheus_client.parser import text_string_to_metric_families

from hapi import sdk
from hapi.store import ClusterNode, ClusterPorts, ClusterSettings, SeaweedCluster, StoreError
from hapi_bench.cluster._cluster_net import Counters, Network, node_role, sweep
from hapi_bench.core._errors import BenchError

GATEWAY_PORT = 8080
CLIENT_ENV = "HAPI_BENCH_CLUSTER_CLIENT"
BUCKET = "data"


@dataclass(frozen=True, kw_only=True)
class TestbedSpec:
    """The shape of a testbed.

    Args:
        nodes: Storage nodes.
        workdir: Where data and logs go.
        rate_bps: Each node's link cap, both ways (``None``: uncapped, still counted).
        cpus: Each storage node's CPU quota in cores (``None``: no quota).
        client_cpus: The client's CPU quota in cores.
        start_timeout: Seconds to wait for the store and the gateways.
    """

    __test__ = False  # not a pytest class

    nodes: int
    workdir: Path
    rate_bps: float | None = None
    cpus: float | None = None
    client_cpus: float | None = None
    start_timeout: float = 90.0


@dataclass(frozen=True)
class Credentials:
    """The store's identity (setup) and the client's (through the gateways)."""

    store_key: str
    store_secret: str
    client_key: str
    client_secret: str

    @classmethod
    def generate(cls) -> Credentials:
        return cls(
            "CLUSTERSTORE" + secrets.token_hex(5).upper(),
            secrets.token_urlsafe(30),
            "CLUSTERCLIENT" + secrets.token_hex(5).upper(),
            secrets.token_urlsafe(30),
        )


class Testbed:
    """The network, the cluster and the gateways, owned by a context manager.

    Args:
        spec: Its shape.
    """

    __test__ = False  # not a pytest class

    def __init__(self, spec: TestbedSpec) -> None:
        if spec.nodes < 1:
            raise ValueError(f"a testbed needs at least one storage node, not {spec.nodes}")
        self.spec = spec
        self.roles = [node_role(i) for i in range(1, spec.nodes + 1)]
        ports = ClusterPorts()
        self.net = Network(
            ["ctl", "cli", *self.roles],
            {role: ports.volume + i for i, role in enumerate(self.roles)},
        )
        self.credentials = Credentials.generate()
        self.cluster = SeaweedCluster(self._settings(ports))
        self._gateways: dict[str, subprocess.Popen[bytes]] = {}

    def _settings(self, ports: ClusterPorts) -> ClusterSettings:
        net, cpus = self.net, self.spec.cpus
        return ClusterSettings(
            data_dir=self.spec.workdir / "cluster",
            control=ClusterNode(name="ctl", host=net.address("ctl"), prefix=net.prefix("ctl")),
            nodes=tuple(
                ClusterNode(name=role, host=net.address(role), prefix=net.prefix(role, cpus))
                for role in self.roles
            ),
            access_key_id=self.credentials.store_key,
            secret_access_key=self.credentials.store_secret,
            ports=ports,
            start_timeout=self.spec.start_timeout,
        )

    # -- life ----------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        left = self.stop()
        if left and exc is None:
            raise BenchError(f"the testbed left {', '.join(left)} behind")

    def start(self) -> None:
        """Sweep leftovers of dead runs, make the network, start the store and gateways.

        Raises:
            TestbedUnavailable: No root or no namespaces here.
            BenchError: Something did not start (with its log's tail).
        """
        sweep()
        # The store lives for one run: its volumes and metadata name this run's addresses.
        shutil.rmtree(self.spec.workdir / "cluster", ignore_errors=True)
        self.net.create()
        try:
            for role in self.roles:
                self.net.shape(role, self.spec.rate_bps)
            try:
                self.cluster.start()
            except StoreError as exc:
                raise BenchError(f"the store did not start: {exc}") from exc
            for role in self.roles:
                self.start_gateway(role)
            for role in self.roles:
                self._wait_gateway(role)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> list[str]:
        """Stop the gateways and the store, remove the network; what could not be removed."""
        for role in list(self._gateways):
            self.kill_gateway(role, signal.SIGTERM)
        self.cluster.stop()
        return self.net.destroy()

    # -- gateways ------------------------------------------------------------------------------

    def gateway_url(self, role: str) -> str:
        """The gateway of storage node ``role``."""
        return f"http://{self.net.address(role)}:{GATEWAY_PORT}"

    @property
    def gateway_urls(self) -> list[str]:
        """Every storage node's gateway, in node order."""
        return [self.gateway_url(role) for role in self.roles]

    @property
    def placement(self) -> str:
        """The placement spec of this cluster (the SDK's and the gateways')."""
        return f"seaweedfs:filer={self.cluster.filer_url},master={self.cluster.master_url}"

    def fetches(self, role: str) -> dict[str, float]:
        """The object fetches ``role``'s gateway counted so far, by placement (``local``,
        ``remote``, ``unknown``), from its ``/metrics`` signed with the client's key."""
        creds = self.credentials
        auth = sdk.GatewayAuth(BotoCredentials(creds.client_key, creds.client_secret))
        reply = httpx.get(self.gateway_url(role) + "/metrics", auth=auth, timeout=10)
        reply.raise_for_status()
        return {
            sample.labels["placement"]: sample.value
            for family in text_string_to_metric_families(reply.text)
            if family.name == "hapi_pushdown_object_fetches"
            for sample in family.samples
            if sample.name.endswith("_total")
        }

    def start_gateway(self, role: str) -> None:
        """``hapi serve`` in ``role``'s namespace (and CPU quota), its node's S3 behind it,
        with the cluster's placement and its node's volume server address (it counts the
        objects it fetches from other nodes)."""
        log = self.spec.workdir / "cluster" / role / "gateway.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [
            *self.net.prefix(role, self.spec.cpus),
            _hapi(),
            "serve",
            "--host", self.net.address(role),
            "--port", str(GATEWAY_PORT),
            "--backend", self.cluster.s3_url(role),
            "--device", "cpu",
            "--intra-op-threads", "1",
            "--decode-workers", "1",
            "--memory-budget", "1GiB",
            # Cache entries would be written to, and read from, whichever node holds them.
            "--no-cache-enabled",
        ]  # fmt: skip
        creds = self.credentials
        env = {
            **os.environ,
            "HAPI_BACKEND_ACCESS_KEY_ID": creds.store_key,
            "HAPI_BACKEND_SECRET_ACCESS_KEY": creds.store_secret,
            "HAPI_ACCESS_KEY_ID": creds.client_key,
            "HAPI_SECRET_ACCESS_KEY": creds.client_secret,
            "HAPI_PLACEMENT": self.placement,
            "HAPI_NODE_ADDRESS": self.cluster.volume_address(role),
        }
        with log.open("ab") as out:
            self._gateways[role] = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_gateway(self, role: str) -> None:
        process, url = self._gateways[role], self.gateway_url(role)
        deadline = time.monotonic() + self.spec.start_timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise BenchError(f"the gateway of {role} exited:\n{self._tail(role)}")
            try:
                if httpx.get(url + "/_hapi/health", timeout=2).is_success:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise BenchError(f"the gateway of {role} did not start:\n{self._tail(role)}")

    def _tail(self, role: str) -> str:
        log = self.spec.workdir / "cluster" / role / "gateway.log"
        try:
            return "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return ""

    def kill_gateway(self, role: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop ``role``'s gateway (SIGKILL by default: a node's gateway dying mid-epoch)."""
        process = self._gateways.pop(role, None)
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    # -- data --------------------------------------------------------------------------------

    def load(self, count: int, *, freeze: int, seed: int = 0) -> Objects:
        """Pin ``nI/`` to node I, upload ``count`` JPEGs round-robin over the nodes
        (``nI/00012.jpg``), register ResNet18 up to ``freeze`` as ``r18``."""
        from hapi import models
        from hapi_bench.testbed._data import generate

        s3 = self.cluster.s3_client(self.roles[0])
        s3.create_bucket(Bucket=BUCKET)
        for role in self.roles:
            self.cluster.pin(BUCKET, f"{role}/", role)
        keys, sizes = [], {}
        for number, sample in enumerate(generate(count, models.sample_images(), seed=seed)):
            key = f"{self.roles[number % len(self.roles)]}/{number:05d}.jpg"
            s3.put_object(Bucket=BUCKET, Key=key, Body=sample.data)
            keys.append(key)
            sizes[key] = len(sample.data)
        s3.create_bucket(Bucket="hapi-models")
        exported = models.export_model("resnet18", freeze=freeze)
        manifest = models.Registry(s3).register("r18", exported)
        return Objects(self, BUCKET, keys, sizes, manifest.ref, freeze)

    # -- measuring ---------------------------------------------------------------------------

    def counters(self) -> dict[str, Counters]:
        """Bytes on every storage node's link so far."""
        return {role: self.net.counters(role) for role in self.roles}

    def client(self, job: dict[str, Any]) -> ClientRun:
        """Start :mod:`._cluster_client` in the client's namespace with ``job``."""
        command = [*self.net.prefix("cli", self.spec.client_cpus), sys.executable]
        env = {
            **os.environ,
            CLIENT_ENV: json.dumps(job),
            "AWS_ACCESS_KEY_ID": self.credentials.client_key,
            "AWS_SECRET_ACCESS_KEY": self.credentials.client_secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "HAPI_PLACEMENT"):
            env.pop(name, None)
        log = self.spec.workdir / "client.log"
        with log.open("ab") as errors:
            process = subprocess.Popen(
                [*command, "-m", "hapi_bench.cluster._cluster_client"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                bufsize=0,  # events are read a line at a time, after select()
                start_new_session=True,
            )
        return ClientRun(process, log)


@dataclass
class Objects:
    """What :meth:`Testbed.load` put in the store."""

    testbed: Testbed
    bucket: str
    keys: list[str]  # nI/00012.jpg: object 12 on node I
    sizes: dict[str, int]
    model: str
    split: int  # the model's freeze point: the client runs no blocks of its own

    @staticmethod
    def node_of(key: str) -> str:
        """The node an object was pinned to."""
        return key.split("/", 1)[0]

    @property
    def placement(self) -> str:
        """The SDK's placement spec for this cluster."""
        return self.testbed.placement

    def job(self, *, locality: bool, request_size: int = 8, prefetch: int = 2) -> dict[str, Any]:
        """The client's job: an epoch over every object, through every gateway; each
        gateway first warmed with an object of its own node (it loads its blocks)."""
        testbed = self.testbed
        first = {self.node_of(key): key for key in reversed(self.keys)}
        return {
            "bucket": self.bucket,
            "keys": self.keys,
            "model": self.model,
            "split": self.split,
            "dtype": "float16",
            "endpoints": testbed.gateway_urls,
            "placement": self.placement if locality else None,
            "request_size": request_size,
            "prefetch": prefetch,
            "warm": [[testbed.gateway_url(role), first[role]] for role in testbed.roles],
        }

    def epoch(
        self,
        *,
        locality: bool,
        request_size: int = 8,
        prefetch: int = 2,
        during: Callable[[dict[str, Any]], None] | None = None,
    ) -> Epoch:
        """One epoch from the client's namespace, the links counted around it alone;
        ``during(event)`` sees each progress event (to kill a gateway mid-epoch)."""
        testbed = self.testbed
        job = self.job(locality=locality, request_size=request_size, prefetch=prefetch)
        client = testbed.client(job)
        try:
            client.until("ready", timeout_s=300)
            before = testbed.counters()
            client.go()
            while (event := client.event(timeout_s=300))["event"] != "done":
                if during is not None:
                    during(event)
            after = testbed.counters()
        finally:
            client.close()
        return Epoch(event, {role: after[role] - before[role] for role in after})


@dataclass
class Epoch:
    """One measured epoch: what the client reported, what crossed each node's link."""

    done: dict[str, Any]
    links: dict[str, Counters]

    @property
    def object_bytes(self) -> int:
        """Bytes the volume servers sent over node links: objects read from another node."""
        return sum(counters.objects for counters in self.links.values())

    @property
    def samples(self) -> int:
        return int(self.done["samples"])

    @property
    def seconds(self) -> float:
        return float(self.done["seconds"])

    def counts(self) -> dict[int, int]:
        """How often each object's number was read."""
        return {int(label): count for label, count in self.done["labels"].items()}


class ClientRun:
    """A running client: its events, one JSON object a line, and its ``go``."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log

    def event(self, timeout_s: float = 300.0) -> dict[str, Any]:
        """The client's next event.

        Raises:
            BenchError: It exited (with its stderr) or said nothing in time.
        """
        stdout = self.process.stdout
        assert stdout is not None
        line = _readline(stdout, timeout_s)
        if not line:
            self.process.wait(timeout=10)
            tail = self.log.read_text(errors="replace")[-3000:]
            raise BenchError(f"the client exited ({self.process.returncode}):\n{tail}")
        event: dict[str, Any] = json.loads(line)
        return event

    def until(self, kind: str, timeout_s: float = 300.0) -> dict[str, Any]:
        """Events until one of ``kind`` (which it returns)."""
        while (event := self.event(timeout_s))["event"] != kind:
            pass
        return event

    def go(self) -> None:
        """Let the client start its measured epoch."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        self.process.stdin.flush()

    def close(self) -> None:
        """End the client if it is still running."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _readline(stream: IO[bytes], timeout_s: float) -> bytes:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        raise BenchError(f"the client said nothing for {timeout_s:g} s")
    return stream.readline()


def _hapi() -> str:
    """The ``hapi`` console script of this environment."""
    beside = Path(sys.executable).parent / "hapi"
    found = str(beside) if beside.exists() else shutil.which("hapi")
    if found is None:
        raise BenchError("the hapi console script was not found")
    return found
