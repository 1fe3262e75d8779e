"""A multi-node SeaweedFS store: master and filer on a control node, a volume server and an
S3 endpoint on every storage node, from the same ``weed`` binary.

Where each process runs is the caller's: a node is an address plus a command prefix its
processes are started under (``ip netns exec NS`` for a network namespace, a cgroup's
wrapper for a CPU quota, nothing for a process on this host). The cluster itself knows
nothing of namespaces. Every node gets ports of its own (weed names its unix sockets in
``/tmp`` after the port, so nodes sharing a host must not share ports).

Placement: writes under a prefix can be pinned to one node (``fs.configure`` with the node's
rack and data node, plus a volume grown there for the bucket's collection; without that
volume, a PUT lands on any node with a writable volume and nothing says so), and
:meth:`SeaweedCluster.holders` reports which nodes hold an object's bytes as the store
itself sees them: the entry's chunks from ``weed shell fs.meta.cat`` and the volume ids of
every data node from the master's topology.

The filer's and the master's HTTP APIs answer without authentication (that is how
SeaweedFS ships; ``security.toml`` can require JWTs). They stay on here because the
placement lookup of clients reads them: run the cluster on a network only the storage
nodes and the trainers reach.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import boto3
import httpx
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from hapi.protocol import Credentials

from ._store import (
    _SCRUBBED_ENV,
    StoreError,
    StoreIdentity,
    _die_with,
    _identity_config,
    _remove_sockets,
    _signal_group,
    _write_private,
    locate_weed,
)

DATA_CENTER = "dc1"
_LOG_TAIL_LINES = 15


@dataclass(frozen=True, kw_only=True)
class ClusterNode:
    """One machine of the cluster.

    Args:
        name: The node's name; also its rack (one rack per node, so a prefix can be
            pinned to it).
        host: The address its processes bind to and advertise.
        prefix: The command its processes run under, e.g. ``("ip", "netns", "exec", NS)``;
            empty runs them here. It must ``exec`` the command it is given, so that the
            process started is the one signalled.
    """

    name: str
    host: str
    prefix: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ClusterPorts:
    """Ports of the control node and the bases of the storage nodes' (node ``i`` of
    ``0..n-1`` adds ``i``); each gRPC port is given explicitly."""

    master: int = 9333
    master_grpc: int = 19333
    filer: int = 8888
    filer_grpc: int = 18888
    volume: int = 8100
    volume_grpc: int = 18100
    s3: int = 8300
    s3_grpc: int = 18300


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """How to run a multi-node store.

    Args:
        data_dir: Where every process keeps its data and log (``<node>/``), made absolute.
        control: The node of the master and the filer.
        nodes: The storage nodes: a volume server and an S3 endpoint each.
        access_key_id: The key of the store's own identity, allowed everything.
        secret_access_key: Its secret.
        identities: Further identities of the S3 endpoints.
        ports: The ports.
        volume_size_limit_mb: Size at which the master stops writing to a volume; small,
            so a small disk holds the volumes every node pre-grows.
        max_volumes: Volumes per volume server.
        start_timeout: Seconds :meth:`SeaweedCluster.start` waits for every node.
        stop_timeout: Seconds each tier of processes gets after SIGTERM before SIGKILL.
    """

    data_dir: Path
    control: ClusterNode
    nodes: tuple[ClusterNode, ...]
    access_key_id: str
    secret_access_key: str = field(repr=False)
    identities: tuple[StoreIdentity, ...] = ()
    ports: ClusterPorts = ClusterPorts()
    volume_size_limit_mb: int = 64
    max_volumes: int = 32
    start_timeout: float = 60.0
    stop_timeout: float = 3.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", self.data_dir.absolute())
        if not self.nodes:
            raise ValueError("a cluster needs at least one storage node")
        names = [node.name for node in (self.control, *self.nodes)]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be distinct, not {names}")
        if not (self.access_key_id and self.secret_access_key):
            raise ValueError("the store needs an access key id and a secret access key")


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


class SeaweedCluster:
    """Master, filer, and a volume server plus an S3 endpoint per storage node.

    Use as a context manager (or :meth:`start` and :meth:`stop`)::

        with SeaweedCluster(settings) as cluster:
            cluster.pin("data", "node1/", "node1")
            s3 = boto3.client("s3", endpoint_url=cluster.s3_url("node1"), ...)

    Args:
        settings: The nodes, ports and credentials.
    """

    def __init__(self, settings: ClusterSettings) -> None:
        self.settings = settings
        self._processes: list[_Process] = []

    # -- where things are ------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """The master's HTTP API (volume lookups, topology)."""
        return f"http://{self.settings.control.host}:{self.settings.ports.master}"

    @property
    def filer_url(self) -> str:
        """The filer's HTTP API (entries and their chunks)."""
        return f"http://{self.settings.control.host}:{self.settings.ports.filer}"

    def node(self, name: str) -> ClusterNode:
        """The storage node called ``name``.

        Raises:
            KeyError: No such storage node.
        """
        for node in self.settings.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no storage node {name!r}; the nodes are {self.names()}")

    def names(self) -> list[str]:
        """The storage nodes' names, in order."""
        return [node.name for node in self.settings.nodes]

    def s3_url(self, name: str) -> str:
        """The S3 endpoint of storage node ``name``."""
        return f"http://{self.node(name).host}:{self._port(name, self.settings.ports.s3)}"

    def volume_address(self, name: str) -> str:
        """``host:port`` of node ``name``'s volume server, as the master names data nodes."""
        return f"{self.node(name).host}:{self._port(name, self.settings.ports.volume)}"

    def _port(self, name: str, base: int) -> int:
        return base + self.names().index(name)

    @property
    def pids(self) -> dict[str, int]:
        """Process ids by process name (``master``, ``filer``, ``<node>-volume``, ``<node>-s3``)."""
        return {p.name: p.popen.pid for p in self._processes}

    # -- life --------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every process and wait until each node's volume server has joined and each
        S3 endpoint answers a signed ListBuckets.

        Raises:
            StoreError: ``weed`` is missing, a process exited, or the cluster was not
                ready within ``start_timeout`` (with the tail of the culprit's log).
        """
        if self._processes:
            raise StoreError("the cluster is already running")
        weed = locate_weed()
        try:
            self._spawn(self.settings.control, "master", self._master(weed))
            self._spawn(self.settings.control, "filer", self._filer(weed))
            identities = self._identities()
            for node in self.settings.nodes:
                self._spawn(node, f"{node.name}-volume", self._volume(weed, node))
                self._spawn(node, f"{node.name}-s3", self._s3(weed, node, identities))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process, in tiers: the S3 endpoints, the filer, the volume servers,
        the master (a filer whose master is gone waits for it instead of exiting); each
        tier gets SIGTERM, then SIGKILL after ``stop_timeout``. Removes the unix sockets
        weed left in ``/tmp``. Safe to call twice."""
        processes, self._processes = self._processes, []
        for suffix in ("-s3", "filer", "-volume", "master"):
            _end([p for p in processes if p.name.endswith(suffix)], self.settings.stop_timeout)
        if processes:
            _remove_sockets(self._all_ports())

    def _all_ports(self) -> tuple[int, ...]:
        p = self.settings.ports
        count = len(self.settings.nodes)
        per_node = (p.volume, p.volume_grpc, p.s3, p.s3_grpc)
        nodes = tuple(base + i for base in per_node for i in range(count))
        return (p.master, p.master_grpc, p.filer, p.filer_grpc, *nodes)

    # -- command lines ---------------------------------------------------------------------

    def _dir(self, name: str) -> Path:
        path = self.settings.data_dir / name
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def _common(self, weed: Path, name: str) -> list[str]:
        return [str(weed), "-logtostderr", f"-config_dir={self._dir(name)}"]

    def _master_address(self) -> str:
        p = self.settings.ports
        return f"{self.settings.control.host}:{p.master}.{p.master_grpc}"

    def _master(self, weed: Path) -> list[str]:
        host, p = self.settings.control.host, self.settings.ports
        return [
            *self._common(weed, "master"),
            "master",
            f"-ip={host}",
            f"-ip.bind={host}",
            f"-port={p.master}",
            f"-port.grpc={p.master_grpc}",
            f"-mdir={self._dir('master')}",
            f"-volumeSizeLimitMB={self.settings.volume_size_limit_mb}",
            "-defaultReplication=000",
            "-telemetry=false",
        ]

    def _filer(self, weed: Path) -> list[str]:
        host, p = self.settings.control.host, self.settings.ports
        return [
            *self._common(weed, "filer"),
            "filer",
            f"-ip={host}",
            f"-ip.bind={host}",
            f"-port={p.filer}",
            f"-port.grpc={p.filer_grpc}",
            f"-master={self._master_address()}",
            f"-defaultStoreDir={self._dir('filer')}",
            f"-localSocket={self._dir('filer') / 'filer.sock'}",
        ]

    def _volume(self, weed: Path, node: ClusterNode) -> list[str]:
        p = self.settings.ports
        return [
            *self._common(weed, node.name),
            "volume",
            f"-ip={node.host}",
            f"-ip.bind={node.host}",
            f"-port={self._port(node.name, p.volume)}",
            f"-port.grpc={self._port(node.name, p.volume_grpc)}",
            f"-dir={self._dir(node.name + '/volume')}",
            f"-max={self.settings.max_volumes}",
            f"-master={self._master_address()}",
            f"-dataCenter={DATA_CENTER}",
            f"-rack={node.name}",
            "-preStopSeconds=0",
        ]

    def _s3(self, weed: Path, node: ClusterNode, identities: Path) -> list[str]:
        p = self.settings.ports
        return [
            *self._common(weed, node.name),
            "s3",
            f"-ip.bind={node.host}",
            f"-port={self._port(node.name, p.s3)}",
            f"-port.grpc={self._port(node.name, p.s3_grpc)}",
            f"-filer={self.settings.control.host}:{p.filer}.{p.filer_grpc}",
            f"-config={identities}",
            f"-localSocket={self._dir(node.name) / 's3.sock'}",
            "-port.iceberg=0",
            "-port.lance=0",
            "-iam=false",
            "-autoCreateBucket=false",
            "-allowDeleteBucketNotEmpty=false",
        ]

    def _identities(self) -> Path:
        creds = _credentials(self.settings)
        path = self._dir("control") / "s3-identities.json"
        _write_private(path, json.dumps(_identity_config(creds, self.settings.identities)))
        return path

    def _spawn(self, node: ClusterNode, name: str, command: list[str]) -> None:
        log = self._dir(node.name) / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        with log.open("wb") as out:
            try:
                popen = subprocess.Popen(
                    [*node.prefix, *command],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self._dir(node.name),
                    env=env,
                    start_new_session=True,
                    # SIGKILL: a filer or volume server told to stop waits for its peers.
                    preexec_fn=_die_with(os.getpid(), signal.SIGKILL),
                )
            except OSError as exc:
                raise StoreError(f"cannot run {command[0]} for {name}: {exc}") from exc
        self._processes.append(_Process(name, popen, log))

    # -- readiness -----------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.start_timeout
        waiting = "the master and every volume server"
        while time.monotonic() < deadline:
            self._check_alive()
            if len(self._data_nodes()) == len(self.settings.nodes):
                break
            time.sleep(0.2)
        else:
            raise StoreError(f"{waiting} did not come up in time{self._tails()}")
        for node in self.settings.nodes:
            client = self.s3_client(node.name, retries=1)
            while True:
                self._check_alive()
                with contextlib.suppress(BotoCoreError, ClientError):
                    client.list_buckets()
                    break
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"the S3 endpoint of {node.name} did not answer{self._tails()}"
                    )
                time.sleep(0.2)

    def _check_alive(self) -> None:
        for process in self._processes:
            if (code := process.popen.poll()) is not None:
                raise StoreError(f"{process.name} exited with code {code}{_tail(process.log)}")

    def _tails(self) -> str:
        return "".join(_tail(process.log) for process in self._processes)

    # -- the store's own view ------------------------------------------------------------------

    def topology(self) -> dict[str, tuple[int, ...]]:
        """Volume ids by data node (``host:port``), from the master's ``/dir/status``."""
        return {node["Url"]: _volume_ids(node.get("VolumeIds", "")) for node in self._data_nodes()}

    def _data_nodes(self) -> list[dict[str, Any]]:
        try:
            status = httpx.get(f"{self.master_url}/dir/status", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return []
        topology = status.get("Topology") or {}
        return [
            node
            for center in topology.get("DataCenters") or []
            for rack in center.get("Racks") or []
            for node in rack.get("DataNodes") or []
        ]

    def shell(self, commands: str, timeout: float = 30.0) -> str:
        """Run ``weed shell`` commands on the control node; their output.

        Raises:
            StoreError: The shell failed or ran out of time.
        """
        p, control = self.settings.ports, self.settings.control
        command = [
            *control.prefix,
            str(locate_weed()),
            f"-config_dir={self._dir('control')}",
            "shell",
            f"-master={self._master_address()}",
            f"-filer={control.host}:{p.filer}.{p.filer_grpc}",
        ]
        try:
            done = subprocess.run(
                command, input=commands + "\n", capture_output=True, text=True, timeout=timeout
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StoreError(f"weed shell failed: {exc}") from exc
        if done.returncode != 0 or "error:" in done.stdout:
            raise StoreError(f"weed shell failed: {(done.stdout + done.stderr).strip()[-500:]}")
        return done.stdout

    def pin(self, bucket: str, prefix: str, name: str, *, volumes: int = 1) -> None:
        """Send writes under ``s3://bucket/prefix`` to storage node ``name``.

        Configures the filer's path rule (``fs.configure``: the node's rack and data node)
        and grows ``volumes`` volumes of the bucket's collection on that node, since
        without a writable volume there the master would place writes elsewhere.

        Raises:
            StoreError: The rule or the volume could not be made.
        """
        address = self.volume_address(name)
        self.shell(
            f"fs.configure -locationPrefix=/buckets/{bucket}/{prefix} "
            f"-dataCenter={DATA_CENTER} -rack={name} -dataNode={address} -apply"
        )
        params = {
            "collection": bucket,
            "count": str(volumes),
            "dataCenter": DATA_CENTER,
            "rack": name,
            "dataNode": address,
            "replication": "000",
        }
        try:
            answer = httpx.get(f"{self.master_url}/vol/grow", params=params, timeout=30).json()
        except (httpx.HTTPError, ValueError) as exc:
            raise StoreError(f"growing a volume on {name} failed: {exc}") from exc
        if "error" in answer:
            raise StoreError(f"growing a volume on {name} failed: {answer['error']}")

    def holders(self, bucket: str, key: str) -> dict[str, int]:
        """Bytes of ``s3://bucket/key`` held by each storage node, as the store sees them:
        the entry's chunks (``weed shell fs.meta.cat``) and the master's topology. An
        object stored inside its filer entry (no chunks) is held by no node.

        Raises:
            StoreError: The entry could not be read.
        """
        by_volume = _chunk_volumes(self.shell(f"fs.meta.cat /buckets/{bucket}/{key}"))
        addresses = {self.volume_address(name): name for name in self.names()}
        held: dict[str, int] = {}
        for address, volumes in self.topology().items():
            name = addresses.get(address)
            for volume in volumes:
                if name is not None and volume in by_volume:
                    held[name] = held.get(name, 0) + by_volume[volume]
        return held

    def s3_client(self, name: str, *, retries: int = 3) -> Any:
        """A boto3 S3 client for node ``name``'s endpoint with the store's own identity."""
        return boto3.client(
            "s3",
            endpoint_url=self.s3_url(name),
            region_name="us-east-1",
            aws_access_key_id=self.settings.access_key_id,
            aws_secret_access_key=self.settings.secret_access_key,
            config=Config(
                connect_timeout=2,
                read_timeout=30,
                retries={"total_max_attempts": retries},
                s3={"addressing_style": "path"},
            ),
        )


def _credentials(settings: ClusterSettings) -> Credentials:
    return Credentials(
        access_key_id=settings.access_key_id, secret_access_key=settings.secret_access_key
    )


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    except OSError:
        return ""
    return f"\n--- last lines of {log}:\n" + "\n".join(lines)


def _chunk_volumes(shell_output: str) -> dict[int, int]:
    """Bytes per volume id of the entry ``fs.meta.cat`` printed (a JSON object, then a line
    of sizes). A chunk manifest counts where the manifest itself is stored.

    Raises:
        StoreError: No entry in the output.
    """
    start = shell_output.find("{")
    try:
        entry, _ = json.JSONDecoder().raw_decode(shell_output[start:])
    except ValueError as exc:
        raise StoreError(f"fs.meta.cat printed no entry: {shell_output[:200]!r}") from exc
    volumes: dict[int, int] = {}
    for chunk in entry.get("chunks") or []:
        volume = int(chunk["fid"]["volumeId"])
        volumes[volume] = volumes.get(volume, 0) + int(chunk.get("size", 0))
    return volumes


def _end(processes: list[_Process], grace_s: float) -> None:
    """SIGTERM ``processes``, SIGKILL those still running after ``grace_s``."""
    for process in processes:
        _signal_group(process.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process.popen.pid, signal.SIGKILL)
            process.popen.wait()
        _signal_group(process.popen.pid, signal.SIGKILL)  # anything it forked


def _volume_ids(text: str) -> tuple[int, ...]:
    """``" 1 4-6"`` (how ``/dir/status`` lists a node's volumes) -> ``(1, 4, 5, 6)``."""
    ids: list[int] = []
    for item in str(text).split():
        first, _, last = item.partition("-")
        ids.extend(range(int(first), int(last or first) + 1))
    return tuple(ids)
