"""`hapi demo` and examples/transfer_learning.py (one program) run end to end against the
real gateway, and show the benefit honestly: fewer bytes received than the raw images."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import HAPI

pytestmark = pytest.mark.slow  # minutes of real work: `make test-slow`


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "transfer_learning.py"
SMALL = ["--train-per-class", "6", "--test-per-class", "3", "--epochs", "2"]


def _env(gateway) -> dict[str, str]:
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": gateway.endpoint_url,
        "AWS_ACCESS_KEY_ID": gateway.access_key_id,
        "AWS_SECRET_ACCESS_KEY": gateway.secret_access_key,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@pytest.mark.parametrize("command", [[HAPI, "demo"], [sys.executable, str(EXAMPLE)]])
def test_demo_trains_and_receives_fewer_bytes_than_the_raw_images(gateway, registered, command):
    args = [*command, "--model", "enl0", *SMALL]  # defaults: the pooled split, float16
    done = subprocess.run(args, env=_env(gateway), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    freeze = registered["enl0"].freeze
    assert re.search(rf"^split: {freeze} of freeze {freeze} ", out, re.M), out
    accuracy = float(re.search(r"test accuracy: ([\d.]+)%", out).group(1))
    assert accuracy > 30  # ten classes: chance is 10%; real features do far better
    found = re.search(r"bytes received: ([\d.]+) MB, the raw objects: ([\d.]+) MB \((.*)\)", out)
    assert found, out
    received, raw = float(found[1]), float(found[2])
    assert received < raw, out
    assert "fewer bytes than the raw images" in found[3]
    assert "dtype float16" in out
    assert "wall time:" in out


def test_demo_and_example_are_one_program():
    helped = subprocess.run([HAPI, "demo", "--help"], capture_output=True, text=True, check=True)
    example = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, check=True
    )
    assert helped.stdout.startswith("usage: hapi demo ")
    assert example.stdout.startswith("usage: transfer_learning.py ")
    assert helped.stdout.split("options:")[1] == example.stdout.split("options:")[1]
    assert "hapi.sdk._demo" not in EXAMPLE.read_text()  # the code itself, public API only
