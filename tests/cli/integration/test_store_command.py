"""`hapi store` takes its secret from the environment or a file, never from its command line."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from click.testing import CliRunner

from hapi.cli import cli
from hapi.store import free_port
from tests.support import HAPI

KEY_ID = "HAPI_BACKEND_ACCESS_KEY_ID"
SECRET = "HAPI_BACKEND_SECRET_ACCESS_KEY"
HALF_A_PAIR = (
    f"Error: give both --access-key-id (or {KEY_ID}) and its secret "
    f"({SECRET} or --secret-file), or neither\n"
)


@pytest.fixture
def no_credentials(monkeypatch):
    monkeypatch.delenv(KEY_ID, raising=False)
    monkeypatch.delenv(SECRET, raising=False)


def _invoke(*args: str):
    return CliRunner().invoke(cli, ["store", *args])


def test_the_secret_flag_is_gone(no_credentials, tmp_path):
    # Port 0 is refused: were the flag taken, the command would end at once, not run a store.
    args = ["--port", "0", "--access-key-id", "K", "--secret-access-key", "S"]
    done = _invoke("--dir", str(tmp_path / "s"), *args)
    assert done.exit_code == 2
    assert "Error: No such option '--secret-access-key'." in done.stderr
    assert not (tmp_path / "s").exists()


def test_help_says_where_the_secret_comes_from():
    done = _invoke("--help")
    assert done.exit_code == 0
    assert "--secret-file" in done.stdout and SECRET in done.stdout
    assert "--secret-access-key" not in done.stdout


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--access-key-id", "K"], {}),
        ([], {KEY_ID: "K"}),
        ([], {SECRET: "S"}),
        (["--secret-file", "{secret}"], {}),
    ],
    ids=["key-id-flag", "key-id-variable", "secret-variable", "secret-file"],
)
def test_half_a_pair_is_one_line_and_exit_2(no_credentials, monkeypatch, tmp_path, args, env):
    secret_file = tmp_path / "secret"
    secret_file.write_text("S\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = [arg.format(secret=secret_file) for arg in args]
    done = _invoke("--dir", str(tmp_path / "s"), *args)
    assert (done.exit_code, done.stderr) == (2, HALF_A_PAIR)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("content", [None, "", "\n"], ids=["missing", "empty", "blank"])
def test_an_unusable_secret_file_is_one_line_and_exit_2(no_credentials, tmp_path, content):
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    done = _invoke("--dir", str(tmp_path / "s"), "--access-key-id", "K", "--secret-file", str(path))
    assert done.exit_code == 2
    expected = "Error: cannot read" if content is None else f"Error: --secret-file {path} is empty"
    assert done.stderr.startswith(expected)
    assert done.stderr.count("\n") == 1


def _processes_showing(text: str) -> list[int]:
    """Processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found


@pytest.mark.parametrize("source", ["variable", "file"])
def test_the_store_accepts_the_secret_it_was_given(tmp_path, source):
    secret, port = os.urandom(20).hex(), free_port()
    env = {name: value for name, value in os.environ.items() if name not in (KEY_ID, SECRET)}
    args = [HAPI, "store", "--dir", str(tmp_path / "s"), "--port", str(port)]
    args += ["--access-key-id", "STOREKEY"]
    if source == "variable":
        env[SECRET] = secret
    else:
        (tmp_path / "secret").write_text(secret + "\n")
        args += ["--secret-file", str(tmp_path / "secret")]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert f"S3 store at http://127.0.0.1:{port}" in proc.stdout.readline()
        assert _client(port, secret).list_buckets()["ResponseMetadata"]["HTTPStatusCode"] == 200
        with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
            _client(port, "another secret").list_buckets()
        assert _processes_showing(secret) == []  # neither hapi's nor weed's command line
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert not (tmp_path / "s" / "backend-credentials.json").exists()  # a given pair stays unsaved


def _client(port: int, secret: str):
    return boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="STOREKEY",
        aws_secret_access_key=secret,
        config=Config(retries={"total_max_attempts": 1}),
    )
