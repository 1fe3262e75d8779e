"""Shared by the benchmarks: a real ``hapi serve`` process on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import httpx

from hapi.store import free_port


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


@contextlib.contextmanager
def gateway_subprocess(
    log: Path, backend: str, key: str, secret: str, extra_env: Mapping[str, str] | None = None
) -> Iterator[BenchGateway]:
    """Run the gateway in front of ``backend``; yields its URL, client credentials and pid."""
    port, client_key, client_secret = free_port(), "BENCHCLIENT", os.urandom(16).hex()
    env = {
        **os.environ,
        "HAPI_BACKEND_URL": backend,
        "HAPI_BACKEND_ACCESS_KEY_ID": key,
        "HAPI_BACKEND_SECRET_ACCESS_KEY": secret,
        "HAPI_ACCESS_KEY_ID": client_key,
        "HAPI_SECRET_ACCESS_KEY": client_secret,
        **(extra_env or {}),
    }
    hapi = Path(sys.executable).parent / "hapi"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(hapi), "serve", "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, proc, log)
        yield BenchGateway(url, client_key, client_secret, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
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
