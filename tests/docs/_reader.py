"""What the docs tests share: a page's fenced blocks, and running them as a reader would.

A reader has the variables `hapi up` prints exported, a working directory holding
`photo.jpg`, and runs every `sh` block with bash and every `python` block with Python, in
the order the page gives them. Blocks in any other language (`console`, `text`, a bare
fence for a diagram) are shown, not run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from io import BytesIO
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
RUNNABLE = ("sh", "python")

# An HTTP error must fail the example, as it would fail the reader.
STRICT_CURL = 'curl() { command curl --fail-with-body --silent --show-error "$@"; }\n'


def blocks(page: Path, language: str | None = None) -> list[tuple[str, str]]:
    """The page's fenced blocks as (language, code), in order."""
    found = [(m[1], m[2]) for m in FENCE.finditer(page.read_text(encoding="utf-8"))]
    return [b for b in found if language is None or b[0] == language]


def is_diagram(code: str) -> bool:
    return any(mark in code for mark in ("──", "│", "|"))


def commands(code: str) -> set[str]:
    """The block's commands, comments and blank lines left out."""
    return {line.split("#")[0].strip() for line in code.splitlines() if line.split("#")[0].strip()}


def run(
    language: str, code: str, workdir: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run one block as the reader would, in ``workdir`` with ``env``."""
    command = ["bash", "-euo", "pipefail", "-c", STRICT_CURL + code]
    if language == "python":
        command = [sys.executable, "-c", code]
    return subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600
    )


def failure(
    page: Path, index: int, language: str, code: str, done: subprocess.CompletedProcess[str]
) -> str:
    return (
        f"{page.relative_to(ROOT)} example {index} ({language}) failed:\n{code}\n"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )


def s3_client(exports: dict[str, str]) -> Any:
    """A boto3 client of the reader's: the gateway, with the credentials `hapi up` printed."""
    return boto3.client(
        "s3",
        endpoint_url=exports["AWS_ENDPOINT_URL"],
        region_name=exports["AWS_DEFAULT_REGION"],
        aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"],
    )


def ensure_bucket(s3: Any, name: str) -> str:
    if name not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=name)
    return name


def remove_bucket(exports: dict[str, str], name: str) -> None:
    """Delete the bucket and everything in it, if it is there."""
    s3 = s3_client(exports)
    if name not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        return
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        for item in page.get("Contents", []):
            s3.delete_object(Bucket=name, Key=item["Key"])
    s3.delete_bucket(Bucket=name)


def photo_jpeg() -> bytes:
    """The reader's photo: a real one (a cat), as a JPEG."""
    from PIL import Image
    from skimage import data

    buffer = BytesIO()
    Image.fromarray(data.chelsea()).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def put_training_data(exports: dict[str, str]) -> None:
    """What the FeatureDataset example calls the reader's data: s3://data/train/CLASS/*.jpg."""
    from PIL import Image
    from skimage import data

    s3 = s3_client(exports)
    photos = {"cat": data.chelsea(), "coffee": data.coffee(), "astronaut": data.astronaut()}
    for label, pixels in photos.items():
        for n in range(2):
            buffer = BytesIO()
            Image.fromarray(pixels).rotate(10 * n).save(buffer, "JPEG", quality=85)
            key = f"train/{label}/{n:03d}.jpg"
            s3.put_object(Bucket=ensure_bucket(s3, "data"), Key=key, Body=buffer.getvalue())
