"""`make run` on a fresh clone, exactly as the README's first command says.

The clone reuses this checkout's virtual environment (a symlink, with every pyproject.toml
dated before the venv's stamp so make does not reinstall into it); everything else is the
committed tree, with the default state directory `.state` relative to the clone.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import boto3

from tests.support import free_port, read_until

ROOT = Path(__file__).resolve().parents[3]


def _clone(tmp_path: Path) -> Path:
    clone = tmp_path / "hapi"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    stamp = (ROOT / ".venv" / ".installed").stat().st_mtime
    for project in clone.rglob("pyproject.toml"):  # every prerequisite of the stamp
        os.utime(project, (stamp - 60, stamp - 60))
    done = subprocess.run(["make", "-q", ".venv/.installed"], cwd=clone, check=False)
    assert done.returncode == 0, "make would reinstall into the shared venv"
    return clone


def _installed_from() -> str:
    code = "import hapi.gateway; print(hapi.gateway.__file__)"
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", code], capture_output=True, text=True
    )
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def _processes_mentioning(text: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def test_make_run_on_a_fresh_clone(tmp_path):
    clone = _clone(tmp_path)
    # as at a terminal: no AWS or hapi settings, and no parent make (CI runs this suite
    # from `make test`, whose MAKELEVEL makes the child print "Leaving directory" lines)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "HAPI_")) and k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")
    }
    args = f"--port {free_port()} --store-port {free_port()} --no-demo-model"
    make = subprocess.Popen(
        ["make", "run", f"ARGS={args}"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal would give it
    )
    try:
        banner = read_until(
            make, "Ctrl-C stops", timeout=120, kill=lambda: os.killpg(make.pid, signal.SIGKILL)
        )
        values = dict(
            line.strip().removeprefix("export ").split("=", 1)
            for line in banner.splitlines()
            if line.strip().startswith("export ")
        )
        s3 = boto3.client(
            "s3",
            endpoint_url=values["AWS_ENDPOINT_URL"],
            region_name=values["AWS_DEFAULT_REGION"],
            aws_access_key_id=values["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=values["AWS_SECRET_ACCESS_KEY"],
        )
        s3.create_bucket(Bucket="data")
        s3.put_object(Bucket="data", Key="photo.jpg", Body=b"not really a photo")
        assert s3.get_object(Bucket="data", Key="photo.jpg")["Body"].read() == b"not really a photo"

        (hapi_up,) = _children(make.pid)
        os.kill(hapi_up, signal.SIGINT)  # Ctrl-C, delivered to hapi up
        rest, _ = make.communicate(timeout=60)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
    lines = [line for line in rest.splitlines() if line.strip()]
    assert make.returncode == 0, rest  # make passes on hapi up's exit status: 0
    assert "Aborted" not in rest and "Error" not in rest, rest
    assert lines[-1] == "hapi stopped: the gateway and the store are down.", rest
    assert (clone / ".state" / "store" / "backend-credentials.json").is_file()
    assert _processes_mentioning(str(clone)) == []  # no weed left behind
    # make did not reinstall into the shared venv (which would point it at the clone)
    assert _installed_from() == str(ROOT / "gateway" / "__init__.py")
