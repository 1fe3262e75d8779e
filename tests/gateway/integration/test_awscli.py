"""The AWS CLI, unchanged, against the gateway (it lives in .venv-awscli: its botocore pin differs)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def aws(gateway, tmp_path_factory):
    binary = os.environ.get("HAPI_AWS_CLI") or str(ROOT / ".venv-awscli" / "bin" / "aws")
    if not Path(binary).exists():
        pytest.fail(f"AWS CLI not found at {binary}: run `make test`, which installs it")
    home = tmp_path_factory.mktemp("awshome")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
        "AWS_ACCESS_KEY_ID": gateway.access_key_id,
        "AWS_SECRET_ACCESS_KEY": gateway.secret_access_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": gateway.endpoint_url,
    }

    def run(*args: str) -> str:
        done = subprocess.run([binary, *args], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"aws {' '.join(args)} failed:\n{done.stderr}"
        return done.stdout

    return run


def test_cli_copy_list_multipart_and_remove(aws, backend_s3, tmp_path):
    bucket = "hapi-cli-" + os.urandom(4).hex()
    aws("s3", "mb", f"s3://{bucket}")
    small, large = tmp_path / "small.txt", tmp_path / "large.bin"
    small.write_text("hello from the aws cli\n")
    large.write_bytes(os.urandom(20 * 1024 * 1024))  # above the CLI's 8 MiB multipart threshold
    aws("s3", "cp", str(small), f"s3://{bucket}/docs/small.txt")
    aws("s3", "cp", str(large), f"s3://{bucket}/blobs/large.bin")
    listing = aws("s3", "ls", "--recursive", f"s3://{bucket}/")
    assert "docs/small.txt" in listing and "blobs/large.bin" in listing
    stored = backend_s3.get_object(Bucket=bucket, Key="blobs/large.bin")
    assert stored["ETag"].strip('"').endswith("-3")  # really went up in parts
    assert (
        hashlib.sha256(stored["Body"].read()).digest()
        == hashlib.sha256(large.read_bytes()).digest()
    )
    aws("s3", "cp", f"s3://{bucket}/blobs/large.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == large.read_bytes()
    url = aws("s3", "presign", f"s3://{bucket}/docs/small.txt").strip()
    assert httpx.get(url).text == "hello from the aws cli\n"
    aws("s3", "rm", "--recursive", f"s3://{bucket}/")
    aws("s3", "rb", f"s3://{bucket}")
    assert bucket not in [b["Name"] for b in backend_s3.list_buckets()["Buckets"]]
