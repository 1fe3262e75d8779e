"""One `hapi up` (demo model included) for every docs test, and a fresh reader per test."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs._reader import ROOT, photo_jpeg
from tests.support import HAPI, free_port, read_until


@dataclass(frozen=True)
class Stack:
    banner: str
    exports: dict[str, str]  # the variables the banner says to export


@pytest.fixture(scope="session")
def hapi_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`hapi up` in a fresh state directory, on free ports; stopped with Ctrl-C at the end."""
    state = tmp_path_factory.mktemp("docs-state")
    ports = ["--port", str(free_port()), "--store-port", str(free_port())]
    proc = subprocess.Popen(
        [HAPI, "up", "--state-dir", str(state), *ports],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        banner = read_until(proc, "Ctrl-C stops", timeout=300)
        exports = dict(
            line.strip().removeprefix("export ").split("=", 1)
            for line in banner.splitlines()
            if line.strip().startswith("export ")
        )
        yield Stack(banner, exports)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _aws_cli() -> Path:
    binary = Path(os.environ.get("HAPI_AWS_CLI") or ROOT / ".venv-awscli" / "bin" / "aws")
    if not binary.exists():
        pytest.fail(f"AWS CLI not found at {binary}: run `make test`, which installs it")
    return binary


@pytest.fixture
def reader(hapi_up: Stack, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The reader's working directory (with photo.jpg) and shell environment."""
    workdir = tmp_path_factory.mktemp("reader")
    (workdir / "photo.jpg").write_bytes(photo_jpeg())
    home = tmp_path_factory.mktemp("home")
    path = os.pathsep.join([str(_aws_cli().parent), str(Path(HAPI).parent), os.environ["PATH"]])
    env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", **hapi_up.exports}
    return workdir, env
