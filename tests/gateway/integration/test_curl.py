"""The README's curl examples, run for real with curl's own SigV4 signing."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from skimage import data as samples

from hapi.protocol import decode_features as decode
from tests.support import encode_image


@pytest.fixture(scope="module")
def curl(gateway):
    binary = shutil.which("curl")
    if binary is None:
        pytest.fail("curl is not installed (apt-get install curl)")
    sig = [
        "--aws-sigv4",
        "aws:amz:us-east-1:s3",
        "--user",
        f"{gateway.access_key_id}:{gateway.secret_access_key}",
    ]

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [binary, "-sS", *sig, *args], capture_output=True, timeout=60, check=False
        )

    return run


def test_plain_get_with_curl(curl, gateway, s3, bucket):
    s3.put_object(Bucket=bucket, Key="hello.txt", Body=b"hello curl")
    done = curl(f"{gateway.endpoint_url}/{bucket}/hello.txt")
    assert done.returncode == 0 and done.stdout == b"hello curl", done.stderr


def test_pushdown_json_summary_with_curl(curl, gateway, registered, s3, bucket):
    s3.put_object(Bucket=bucket, Key="cat.jpg", Body=encode_image(samples.chelsea(), "JPEG"))
    done = curl(
        f"{gateway.endpoint_url}/{bucket}/cat.jpg?hapi-model=r18&hapi-split=3&hapi-format=json"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"{"), done.stdout[:500]
    summary = json.loads(done.stdout)
    assert summary is not None, done
    assert summary["shape"] == [1, *registered["r18"].blocks[2].output_shape]


def test_batch_post_with_curl(curl, gateway, registered, s3, bucket):
    for key in ("a.jpg", "b.jpg"):
        s3.put_object(Bucket=bucket, Key=key, Body=encode_image(samples.chelsea(), "JPEG"))
    body = json.dumps({"keys": ["a.jpg", "b.jpg"], "model": "r18", "split": 2})
    url = f"{gateway.endpoint_url}/{bucket}?hapi-batch"
    refused = curl("-X", "POST", url, "-d", body)  # curl 7.x signs a body without saying how
    assert b"x-amz-content-sha256: UNSIGNED-PAYLOAD" in refused.stdout
    done = curl("-X", "POST", url, "-d", body, "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD")
    tensors, meta = decode(done.stdout)
    assert tensors["features"].shape[0] == 2 and json.loads(meta["keys"]) == ["a.jpg", "b.jpg"], (
        done.stdout[:300]
    )
