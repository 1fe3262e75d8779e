"""Shared by the benchmarks: a real ``hapi serve`` process on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from hapi.store import EmbeddedStore, StoreSettings, free_port


@dataclass(frozen=True)
class BenchStore:
    """A real store in a temporary directory, with a boto3 client of it."""

    tmp: Path  # for logs and the like, removed with the store
    store: EmbeddedStore
    s3: Any  # boto3, as the store's own identity
    key: str
    secret: str

    def gateway(self, log: str, env: Mapping[str, str] | None = None) -> Any:
        """A gateway in front of this store (see :func:`gateway_subprocess`)."""
        return gateway_subprocess(
            self.tmp / log, self.store.endpoint_url, self.key, self.secret, env
        )


@contextlib.contextmanager
def bench_store() -> Iterator[BenchStore]:
    """Start a store with fresh credentials in a temporary directory; stop it after."""
    import boto3

    with tempfile.TemporaryDirectory(prefix="hapi-bench-") as tmp_name:
        tmp = Path(tmp_name)
        key, secret = "BENCHSTORE", os.urandom(16).hex()
        settings = StoreSettings(
            data_dir=tmp / "store", port=free_port(), access_key_id=key, secret_access_key=secret
        )
        with EmbeddedStore(settings) as store:
            s3 = boto3.client(
                "s3",
                endpoint_url=store.endpoint_url,
                region_name="us-east-1",
                aws_access_key_id=key,
                aws_secret_access_key=secret,
            )
            yield BenchStore(tmp, store, s3, key, secret)


class BenchGateway(NamedTuple):
    """A running benchmark gateway."""

    url: str
    key: str
    secret: str
    pid: int

    def rss_bytes(self, field: str = "VmRSS") -> int:
        """Resident memory (``VmRSS``) or its peak since the last reset (``VmHWM``)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(field)

    def reset_peak_rss(self) -> None:
        """Reset ``VmHWM`` to the current RSS (Linux: write 5 to clear_refs)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")


def hapi_serve(port: int) -> list[str]:
    """The command line of ``hapi serve`` on ``port`` (settings from the environment)."""
    return [str(Path(sys.executable).parent / "hapi"), "serve", "--port", str(port)]


@contextlib.contextmanager
def gateway_subprocess(
    log: Path,
    backend: str,
    key: str,
    secret: str,
    extra_env: Mapping[str, str] | None = None,
    command: Callable[[int], list[str]] = hapi_serve,
) -> Iterator[BenchGateway]:
    """Run the gateway in front of ``backend``; yields its URL, client credentials and pid.

    ``command(port)`` starts it: ``hapi serve`` by default, or another server of the same
    app reading the same ``HAPI_*`` variables."""
    port, client_key, client_secret = free_port(), "BENCHCLIENT", os.urandom(16).hex()
    env = {
        **os.environ,
        "HAPI_BACKEND_URL": backend,
        "HAPI_BACKEND_ACCESS_KEY_ID": key,
        "HAPI_BACKEND_SECRET_ACCESS_KEY": secret,
        "HAPI_ACCESS_KEY_ID": client_key,
        "HAPI_SECRET_ACCESS_KEY": client_secret,
        # One identity drives every load: its bounds (which keep one key of many from
        # starving the others) would measure the bound, not the gateway.
        "HAPI_IDENTITY_UPSTREAM_REQUESTS": "0",
        "HAPI_IDENTITY_PUSHDOWN_REQUESTS": "0",
        **(extra_env or {}),
    }
    with server_process(command(port), log, env) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_for_gateway(url, proc, log)
        yield BenchGateway(url, client_key, client_secret, proc.pid)


@contextlib.contextmanager
def server_process(
    command: list[str], log: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` running, its output in ``log``; terminated (killed after 10 s) after."""
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for_gateway(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the gateway at ``url`` answers its health check (120 s at most)."""
    deadline = time.monotonic() + 120  # several workers each import the gateway anew
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            httpx.get(url + "/_hapi/health", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("the gateway did not start within 120 s")
