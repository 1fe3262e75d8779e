"""``HAPI_WORKERS=2``: two gateway processes serve one port."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.adversarial._support import connection, encode_request, read_reply
from tests.support import RunningGateway, signed_headers, store_gateway


@pytest.fixture(scope="module")
def two_workers(store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with store_gateway(
        store,
        tmp_path_factory.mktemp("workers"),
        start_timeout=120,  # each worker imports the gateway anew
        env={"HAPI_WORKERS": "2"},
    ) as running:
        yield running


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _established_inodes(port: int) -> set[str]:
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        if local_port == port and fields[3] == "01":  # 01: ESTABLISHED
            inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _serving(gateway: RunningGateway, port: int, path: str) -> list[int]:
    """The worker pids holding one of 40 connections opened and answered at once."""
    with contextlib.ExitStack() as stack:
        for _ in range(40):
            sock = stack.enter_context(connection(gateway))
            sock.sendall(encode_request("GET", path, signed_headers(gateway, "GET", path)))
            assert read_reply(sock).status == 200
        established = _established_inodes(port)
        return [pid for pid in _children(gateway.pid) if _socket_inodes(pid) & established]


def test_two_worker_processes_serve_the_port(two_workers, bucket):
    port = int(two_workers.endpoint_url.rsplit(":", 1)[1])
    path = f"/{bucket}?list-type=2"
    # A worker still importing the gateway accepts nothing yet: give both a bounded while.
    deadline = time.monotonic() + 60
    serving = _serving(two_workers, port, path)
    while len(serving) < 2 and time.monotonic() < deadline:
        time.sleep(1)
        serving = _serving(two_workers, port, path)
    assert len(serving) == 2, serving
