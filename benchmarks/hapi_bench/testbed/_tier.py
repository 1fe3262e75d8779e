"""The storage tier: SeaweedFS and the hapi gateway inside the namespace, on their own core.

:class:`StorageTier` (run by the benchmark, in the root namespace) starts this module as
``ip netns exec NS taskset -c CPU python -m hapi_bench._tier``: the process and
everything it starts (``weed``) live in the namespace and on that core. The process runs
the embedded store bound to the namespace's address and then the gateway in front of it,
with one onnxruntime thread and one decode thread to match the single core, until
SIGTERM; it then stops the gateway and the store. Its settings arrive in one environment
variable (secrets stay out of ``ps``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import httpx
from botocore.credentials import Credentials as BotoCredentials

from hapi import sdk
from hapi_bench.core._errors import BenchError
from hapi_bench.testbed._netns import Link

ENV = "HAPI_BENCH_TIER"
STORE_PORT = 8333
GATEWAY_PORT = 8080
UNCACHED_PORT = 8081
MEMORY_BUDGET = 6 * 1024**3  # the sweep keeps a session per split; never the limit here
_TICKS = os.sysconf("SC_CLK_TCK")


StorageDevice = Literal["cpu", "cuda"]


@dataclass(frozen=True, kw_only=True)
class TierSpec:
    """What the tier process needs."""

    host: str
    data_dir: str
    store_key: str
    store_secret: str
    client_key: str
    client_secret: str
    store_port: int = STORE_PORT
    gateway_port: int = GATEWAY_PORT
    fixed_batch: int | None = None
    uncached_port: int | None = None
    gateway_only: bool = False
    device: StorageDevice = "cpu"

    @classmethod
    def generate(
        cls,
        host: str,
        data_dir: Path,
        fixed_batch: int | None = None,
        uncached_port: int | None = None,
        device: StorageDevice = "cpu",
    ) -> TierSpec:
        """Fresh credentials for one run."""
        return cls(
            host=host,
            data_dir=str(data_dir),
            fixed_batch=fixed_batch,
            uncached_port=uncached_port,
            device=device,
            store_key="BENCHSTORE" + secrets.token_hex(5).upper(),
            store_secret=secrets.token_urlsafe(30),
            client_key="BENCHCLIENT" + secrets.token_hex(5).upper(),
            client_secret=secrets.token_urlsafe(30),
        )

    def control_auth(self) -> sdk.GatewayAuth:
        """Signs requests to the gateway's control plane with the client credential."""
        return sdk.GatewayAuth(BotoCredentials(self.client_key, self.client_secret))

    @property
    def gateway_url(self) -> str:
        """The gateway, as the client reaches it across the link."""
        return f"http://{self.host}:{self.gateway_port}"

    @property
    def uncached_url(self) -> str | None:
        """The second gateway, without a feature cache (``None`` unless asked for)."""
        return None if self.uncached_port is None else f"http://{self.host}:{self.uncached_port}"

    @property
    def store_url(self) -> str:
        """The store itself (setup traffic only: uploads and model registration)."""
        return f"http://{self.host}:{self.store_port}"


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds of ``pids`` (every thread), from ``/proc``."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICKS


def steal_seconds(cpus: Iterable[int], stat: Path = Path("/proc/stat")) -> float:
    """Seconds the hypervisor has held ``cpus`` back while they had work to run (the
    ``steal`` column of ``/proc/stat``; 0 on bare metal). On a virtual machine it is the
    host's share of an epoch's noise: a vCPU woken from idle waits for the host."""
    wanted = {f"cpu{cpu}" for cpu in cpus}
    total = 0
    for line in stat.read_text().splitlines():
        fields = line.split()
        if fields and fields[0] in wanted and len(fields) > 8:
            total += int(fields[8])  # user nice system idle iowait irq softirq steal
    return total / _TICKS


class StorageTier:
    """The tier process, owned by a context manager.

    Args:
        link: The namespace to run in.
        cpu: The core to pin it to.
        workdir: Where the store keeps its data.
        log: Where the tier's output goes.
        fixed_batch: The gateway's storage-side batch size; ``None`` for adaptive.
        niceness: Scheduling niceness of the tier (negative: ahead of other work).
        uncached: Also run a second gateway with its feature cache off (on
            ``UNCACHED_PORT``, same store, same core), for the cache's overhead.
        device: Where the gateway runs blocks: ``cpu`` (one intra-op thread, on ``cpu``)
            or ``cuda`` (onnxruntime's CUDA provider; decoding and HTTP stay on ``cpu``).
    """

    def __init__(
        self,
        link: Link,
        cpu: int,
        workdir: Path,
        log: Path,
        fixed_batch: int | None = None,
        niceness: int = 0,
        uncached: bool = False,
        device: StorageDevice = "cpu",
    ) -> None:
        self.link = link
        self.cpu = cpu
        self.niceness = niceness
        second = UNCACHED_PORT if uncached else None
        self.spec = TierSpec.generate(
            link.storage_ip, workdir / "store", fixed_batch, second, device=device
        )
        self.log = log
        self.pids: list[int] = []
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> StorageTier:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the tier and wait until the gateway answers across the link.

        Raises:
            BenchError: The tier exited or did not come up in time (with its log's tail).
        """
        env = {**os.environ, ENV: json.dumps(asdict(self.spec))}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self._process = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self._wait(self.spec.gateway_url, timeout_s)
        if self.spec.uncached_url is not None:
            self._wait(self.spec.uncached_url, timeout_s)
        self.pids = self.link.pids()

    def command(self) -> list[str]:
        """The tier's command line: in the namespace, on its core, at its niceness."""
        return [
            "ip", "netns", "exec", self.link.namespace, "taskset", "-c", str(self.cpu),
            "nice", "-n", str(self.niceness), sys.executable, "-m", "hapi_bench.testbed._tier",
        ]  # fmt: skip

    def gateway_stats(self) -> dict[str, Any]:
        """The gateway's ``/_hapi/stats`` (batching and memory), or ``{}`` if unreadable."""
        try:
            stats: dict[str, Any] = httpx.get(
                self.spec.gateway_url + "/_hapi/stats", timeout=10, auth=self.spec.control_auth()
            ).json()
        except (httpx.HTTPError, ValueError):
            return {}
        return stats

    def _wait(self, url: str, timeout_s: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BenchError(f"the storage tier exited while starting:\n{self._tail()}")
            try:
                if httpx.get(url + "/_hapi/health", timeout=1).is_success:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise BenchError(f"the storage tier did not start within {timeout_s:g} s:\n{self._tail()}")

    def _tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """CPU seconds the tier's processes have used so far."""
        return cpu_seconds(self.pids)

    def steal_seconds(self) -> float:
        """Seconds the host has held the tier's core back so far."""
        return steal_seconds([self.cpu])

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the tier (it stops the gateway and the store), SIGKILL after ``grace_s``."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- inside the namespace ------------------------------------------------------------------


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _gateway_settings(spec: TierSpec, backend_url: str, *, cache: bool) -> Any:
    from hapi.gateway import ClientKey, GatewaySettings
    from hapi.protocol import Credentials

    return GatewaySettings(
        backend_url=backend_url,
        backend_credentials=Credentials(spec.store_key, spec.store_secret),
        clients={spec.client_key: ClientKey(spec.client_secret)},
        device=spec.device,
        intra_op_threads=1,
        decode_workers=1,
        memory_budget_bytes=MEMORY_BUDGET,
        fixed_batch_size=spec.fixed_batch,
        # The planner's probes last PROBE_SECONDS at the shaped rate, twice per cell:
        # on this closed testbed they may be larger and more frequent than a
        # production gateway allows any one credential.
        max_probe_bytes=4 * 1024**3,
        probe_bytes_per_minute=64 * 1024**3,
        cache_enabled=cache,
    )


def main_gateway_settings(spec: TierSpec, backend_url: str | None = None) -> Any:
    """The tier's gateway: with the feature cache only in the cache scenario (where a
    second, uncached gateway runs beside it). The split sweep repeats epochs over the
    same objects, so a cache would time the warm-up's entries instead of the blocks."""
    cache = spec.uncached_port is not None
    return _gateway_settings(spec, backend_url or spec.store_url, cache=cache)


def _start_uncached(spec: TierSpec) -> subprocess.Popen[bytes] | None:
    """The second gateway (cache off) as a child: same namespace, core and niceness."""
    if spec.uncached_port is None:
        return None
    child = replace(spec, gateway_port=spec.uncached_port, uncached_port=None, gateway_only=True)
    env = {**os.environ, ENV: json.dumps(asdict(child))}
    return subprocess.Popen([sys.executable, "-m", "hapi_bench.testbed._tier"], env=env)


def _stop(child: subprocess.Popen[bytes] | None) -> None:
    if child is None or child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(20)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def main() -> None:
    """Run the store and the gateway in this namespace until SIGTERM (with
    ``gateway_only``, a gateway without a cache in front of the tier's store)."""
    from hapi.gateway import run_gateway
    from hapi.store import EmbeddedStore, StoreSettings

    spec = TierSpec(**json.loads(os.environ.pop(ENV)))
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if spec.gateway_only:
        settings = _gateway_settings(spec, spec.store_url, cache=False)
        run_gateway(settings, spec.host, spec.gateway_port)
        return
    store = EmbeddedStore(
        StoreSettings(
            data_dir=Path(spec.data_dir),
            port=spec.store_port,
            host=spec.host,
            access_key_id=spec.store_key,
            secret_access_key=spec.store_secret,
        )
    )
    child = None
    try:
        store.start()
        child = _start_uncached(spec)
        run_gateway(main_gateway_settings(spec, store.endpoint_url), spec.host, spec.gateway_port)
    finally:
        _stop(child)
        store.stop()


if __name__ == "__main__":
    main()
