"""`hapi up` (what `make run` starts): store + gateway, banner, clean stop on Ctrl-C and SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import boto3
import httpx
import pytest
from botocore.exceptions import ClientError

from tests.support import HAPI, free_port, read_until


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
    return read_until(proc, "Ctrl-C stops", timeout=60)


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
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    assert "Aborted" not in rest
    assert rest.strip().splitlines()[-1] == "hapi stopped: the gateway and the store are down."
    assert _weeds(str(tmp_path / "state")) == 0  # the store went down with it

    again = _start(tmp_path, port)  # credentials and data survive a restart
    banner_again = _banner(again)
    assert f"AWS_ACCESS_KEY_ID={key}" in banner_again
    assert s3.get_object(Bucket="data", Key="k")["Body"].read() == b"v"
    again.send_signal(signal.SIGINT)
    again.wait(30)


def _creds(banner: str) -> tuple[str, str]:
    key = banner.split("AWS_ACCESS_KEY_ID=")[1].split()[0]
    return key, banner.split("AWS_SECRET_ACCESS_KEY=")[1].split()[0]


def _weed_pids(state) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-f", "--", f"-dir={state}/store"], capture_output=True, text=True
    )
    return [int(pid) for pid in found.stdout.split()]


def test_a_second_up_says_who_runs_and_changes_nothing(tmp_path):
    port = free_port()
    first = _start(tmp_path, port)
    try:
        _banner(first)
        state = tmp_path / "state"
        log = (state / "store" / "weed.log").stat()
        second = _start(tmp_path, free_port())
        out, _ = second.communicate(timeout=60)
        assert second.returncode == 1, out
        assert out.strip().splitlines() == [
            f"Error: hapi is already running (pid {first.pid}, http://127.0.0.1:{port}); "
            "nothing was changed. Use that one, or stop it first (Ctrl-C in its terminal, "
            f"or kill {first.pid})."
        ]
        assert (state / "store" / "weed.log").stat().st_ino == log.st_ino  # not renamed away
        assert not (state / "store" / "weed.log.1").exists()
        assert httpx.get(f"http://127.0.0.1:{port}/_hapi/health").json()["status"] == "ok"
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=30)
    assert first.returncode == 0


def test_weed_dies_with_a_killed_up_and_the_next_run_cleans_up(tmp_path):
    state = tmp_path / "state"
    proc = _start(tmp_path, free_port())
    _banner(proc)
    (weed,) = _weed_pids(state)
    proc.kill()  # kill -9: no chance to stop the store itself
    proc.wait()
    deadline = time.monotonic() + 30
    while _weed_pids(state) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _weed_pids(state) == []  # the parent-death signal took weed down
    assert (state / "hapi.json").exists()  # what the killed run left

    port = free_port()
    again = _start(tmp_path, port)
    banner = _banner(again)
    assert f"cleaned up after a hapi up that did not stop cleanly (pid {proc.pid})" in banner
    assert httpx.get(f"http://127.0.0.1:{port}/_hapi/health").json()["status"] == "ok"
    again.send_signal(signal.SIGTERM)
    rest, _ = again.communicate(timeout=30)
    assert again.returncode == 0, rest
    assert not (state / "hapi.json").exists()
    assert weed not in _weed_pids(state)


def test_up_on_a_busy_port_is_one_line_and_starts_no_store(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _start(tmp_path, port)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert out.strip().splitlines() == [
        f"Error: port {port} on 127.0.0.1 is already in use (another hapi?); "
        "stop that process or choose another port with --port"
    ]
    assert not (tmp_path / "state" / "store" / "weed.log").exists()


def test_up_gives_an_ordinary_client_key_and_an_admin_key(tmp_path):
    port = free_port()
    proc = _start(tmp_path, port)
    try:
        banner = _banner(proc)
        assert "an ordinary client key" in banner and "the admin key" in banner
        admin_key = banner.split("HAPI_ADMIN_ACCESS_KEY_ID=")[1].split()[0]
        admin_secret = banner.split("HAPI_ADMIN_SECRET_ACCESS_KEY=")[1].split()[0]
        endpoint = f"http://127.0.0.1:{port}"
        client, admin = (
            boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id=key,
                aws_secret_access_key=secret,
            )
            for key, secret in (_creds(banner), (admin_key, admin_secret))
        )
        client.create_bucket(Bucket="data")  # an ordinary client still makes its buckets
        for attempt in (
            lambda: client.put_object(Bucket="hapi-models", Key="models/x/latest", Body=b"1"),
            lambda: client.list_objects_v2(Bucket="hapi-cache"),
        ):
            with pytest.raises(ClientError) as caught:
                attempt()
            assert caught.value.response["Error"]["Code"] == "AccessDenied"
        admin.put_object(Bucket="hapi-models", Key="models/x/latest", Body=b"1")
        assert admin.list_objects_v2(Bucket="hapi-cache")["KeyCount"] == 0
        # At the store itself, the client's own identity is held to the same rule by the
        # bucket policies hapi up sets.
        tenant = json.loads(next((tmp_path / "state" / "store-client").glob("*.json")).read_text())
        record = json.loads((tmp_path / "state" / "hapi.json").read_text())
        direct = boto3.client(
            "s3",
            endpoint_url=record["store_url"],
            region_name="us-east-1",
            aws_access_key_id=tenant["access_key_id"],
            aws_secret_access_key=tenant["secret_access_key"],
        )
        direct.put_object(Bucket="data", Key="mine", Body=b"ok")  # its own data it may write
        direct.create_bucket(Bucket="photos")  # and buckets of its own
        # Not a store administrator: where the store skips bucket policies (a batch delete's
        # keys, a copy's source), its own permissions still hold; the operators' buckets
        # (hapi-*, the admin key's too) are out of its reach.
        admin.create_bucket(Bucket="hapi-operators")
        admin.put_object(Bucket="hapi-operators", Key="notes", Body=b"operators'")
        admin.put_object(Bucket="hapi-cache", Key="entry", Body=b"features")
        direct.delete_objects(
            Bucket="hapi-models", Delete={"Objects": [{"Key": "models/x/latest"}]}
        )
        for attempt in (
            lambda: direct.put_object(Bucket="hapi-models", Key="models/x/latest", Body=b"2"),
            lambda: direct.list_objects_v2(Bucket="hapi-cache"),
            lambda: direct.copy_object(Bucket="data", Key="loot", CopySource="hapi-cache/entry"),
            lambda: direct.create_bucket(Bucket="hapi-mine"),
            lambda: direct.get_object(Bucket="hapi-operators", Key="notes"),
            lambda: client.get_object(Bucket="hapi-operators", Key="notes"),
        ):
            with pytest.raises(ClientError) as caught:
                attempt()
            assert caught.value.response["Error"]["Code"] in ("AccessDenied", "NoSuchBucket")
        latest = admin.get_object(Bucket="hapi-models", Key="models/x/latest")["Body"].read()
        assert latest == b"1"
        assert "loot" not in {o["Key"] for o in direct.list_objects_v2(Bucket="data")["Contents"]}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
