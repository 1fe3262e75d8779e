"""`hapi up` (what `make run` starts): store + gateway, banner, clean stop on Ctrl-C and SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import time

import boto3
import httpx
import pytest

from tests.support import HAPI, free_port


def _start(tmp_path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            HAPI,
            "up",
            "--state-dir",
            str(tmp_path / "state"),
            "--port",
            str(port),
            "--store-port",
            str(free_port()),
            "--no-demo-model",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _banner(proc: subprocess.Popen[str]) -> str:
    lines, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops" in line:
            return "".join(lines)
    proc.kill()
    pytest.fail("hapi up printed no banner:\n" + "".join(lines))


def _weeds(state: str) -> int:
    found = subprocess.run(["pgrep", "-f", state], capture_output=True, text=True)
    return len(found.stdout.split())


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_up_serves_and_stops_cleanly(tmp_path, stop):
    port = free_port()
    proc = _start(tmp_path, port)
    banner = _banner(proc)
    key = banner.split("AWS_ACCESS_KEY_ID=")[1].split()[0]
    secret = banner.split("AWS_SECRET_ACCESS_KEY=")[1].split()[0]
    assert httpx.get(f"http://127.0.0.1:{port}/_hapi/health").json()["status"] == "ok"
    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )
    s3.create_bucket(Bucket="data")
    s3.put_object(Bucket="data", Key="k", Body=b"v")
    assert s3.get_object(Bucket="data", Key="k")["Body"].read() == b"v"
    proc.send_signal(stop)
    assert proc.wait(30) in (0, 1, 130, 128 + stop)
    assert _weeds(str(tmp_path / "state")) == 0  # the store went down with it

    again = _start(tmp_path, port)  # credentials and data survive a restart
    banner_again = _banner(again)
    assert f"AWS_ACCESS_KEY_ID={key}" in banner_again
    assert s3.get_object(Bucket="data", Key="k")["Body"].read() == b"v"
    again.send_signal(signal.SIGINT)
    again.wait(30)
