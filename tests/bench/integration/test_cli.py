"""``hapi bench`` refuses, in one line with exit code 2, where it cannot run."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from hapi_bench import bench
from hapi_bench.core._errors import TestbedUnavailable
from hapi_bench.testbed._preflight import check_environment

MODULE = [sys.executable, "-m", "hapi_bench"]
NOT_ROOT = (
    "hapi bench needs root: it creates a network namespace and a veth pair and shapes them "
    "with tc (run it with sudo, or as root in a VM or container with CAP_NET_ADMIN)"
)


def _which_all(tool: str) -> str:
    return f"/usr/bin/{tool}"


def test_preflight_returns_the_first_two_cores() -> None:
    assert check_environment(euid=0, which=_which_all, cpus={3, 1, 7}) == (1, 3)


@pytest.mark.parametrize(
    ("euid", "which", "cpus", "message"),
    [
        (1000, _which_all, {0, 1}, "needs root"),
        (0, lambda tool: None if tool == "tc" else "/x", {0, 1}, "needs tc on PATH"),
        (0, _which_all, {0}, "this process may use 1"),
    ],
)
def test_preflight_refusals(euid: int, which, cpus: set[int], message: str) -> None:
    with pytest.raises(TestbedUnavailable, match=message):
        check_environment(euid=euid, which=which, cpus=cpus)


def test_not_root_is_one_line_and_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    result = CliRunner().invoke(bench, ["--quick", "--out", str(tmp_path / "out")])

    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"Error: {NOT_ROOT}"]
    assert not (tmp_path / "out").exists()


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    result = CliRunner().invoke(bench, ["--models", "resnet18,nope", "--out", str(tmp_path)])

    assert result.exit_code == 2
    assert "unknown model nope" in result.stderr


def test_missing_tools_in_a_real_process(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no ip, tc or taskset there

    done = subprocess.run(
        [*MODULE, "--quick", "--out", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "Error: hapi bench needs ip, tc, taskset on PATH (Debian/Ubuntu: apt-get install "
        "iproute2 util-linux)"
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_a_real_unprivileged_user_is_refused() -> None:
    setpriv = "/usr/bin/setpriv"
    if not os.access(setpriv, os.X_OK):
        pytest.skip("setpriv is not installed")
    with tempfile.TemporaryDirectory() as home:  # pytest's tmp_path is root's alone
        os.chmod(home, 0o777)
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *MODULE,
                   "--quick", "--out", f"{home}/out"]  # fmt: skip
        own = {"HOME": home, "XDG_CACHE_HOME": f"{home}/.cache"}  # the user's, not root's
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              env={**os.environ, **own})  # fmt: skip
        assert not Path(home, "out").exists()

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"Error: {NOT_ROOT}"]
