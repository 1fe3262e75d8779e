"""`hapi demo` (the README's example) runs end to end against the real gateway."""

from __future__ import annotations

import os
import re
import subprocess

from tests.support import HAPI


def test_demo_trains_and_reports(gateway, registered):
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": gateway.endpoint_url,
        "AWS_ACCESS_KEY_ID": gateway.access_key_id,
        "AWS_SECRET_ACCESS_KEY": gateway.secret_access_key,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    args = [
        "demo",
        "--model",
        "enl0",
        "--split",
        "19",
        "--dtype",
        "float16",
        "--train-per-class",
        "6",
        "--test-per-class",
        "3",
        "--epochs",
        "2",
    ]
    done = subprocess.run([HAPI, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert re.search(r"^split: 19 of freeze \d+", out, re.M), out
    accuracy = float(re.search(r"test accuracy: ([\d.]+)%", out).group(1))
    assert accuracy > 30  # ten classes: chance is 10%; real features do far better
    assert re.search(r"bytes received: [\d.]+ MB, the raw objects: [\d.]+ MB", out), out
    assert "wall time:" in out
