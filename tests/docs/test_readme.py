"""Every shell and Python example in README.md runs, in order, against a live `hapi up`.

Like a reader: one `hapi up` (demo model included) in a fresh state directory, its banner's
`export` lines as the environment, one working directory that holds the reader's photo,
and every fenced `sh` block run with bash and every `python` block with this Python, in
the order the README gives them. An example that stops working fails here.

The one block not run here is the first (`make run`, `make test`): `make run` is run on a
fresh clone by tests/cli/integration/test_make_run.py, and `make test` is this suite.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import boto3
import pytest

from tests.support import HAPI, free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
RUN_ELSEWHERE = {"make run", "make test"}


def blocks(language: str | None = None) -> list[tuple[str, str]]:
    """The README's fenced blocks as (language, code), in order."""
    found = [(m[1], m[2]) for m in FENCE.finditer(README.read_text(encoding="utf-8"))]
    return [b for b in found if language is None or b[0] == language]


def _commands(code: str) -> set[str]:
    return {line.split("#")[0].strip() for line in code.splitlines() if line.split("#")[0].strip()}


def _examples() -> list[tuple[str, str]]:
    runnable = [b for b in blocks() if b[0] in ("sh", "python")]
    return [b for b in runnable if _commands(b[1]) != RUN_ELSEWHERE]


def test_every_code_block_is_shell_or_python_or_a_diagram():
    languages = [language for language, _ in blocks()]
    assert set(languages) <= {"sh", "python", ""}
    plain = [code for language, code in blocks() if language == ""]
    assert all("──" in code or "|" in code for code in plain)  # diagrams, not commands
    skipped = [b for b in blocks() if b[0] == "sh" and _commands(b[1]) == RUN_ELSEWHERE]
    assert len(skipped) == 1  # only `make run` / `make test`, run elsewhere
    assert len(_examples()) >= 5


BANNERS: list[str] = []


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict[str, str]]:
    """`hapi up` with the demo model; the environment its banner says to export."""
    state = tmp_path_factory.mktemp("readme-state")
    ports = ["--port", str(free_port()), "--store-port", str(free_port())]
    proc = subprocess.Popen(
        [HAPI, "up", "--state-dir", str(state), *ports],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        banner = _banner(proc)
        BANNERS.append(banner)
        exports = dict(
            line.strip().removeprefix("export ").split("=", 1)
            for line in banner.splitlines()
            if line.strip().startswith("export ")
        )
        yield exports
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _banner(proc: subprocess.Popen[str]) -> str:
    lines: list[str] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops" in line:
            return "".join(lines)
    proc.kill()
    pytest.fail("hapi up printed no banner:\n" + "".join(lines))


def _aws_cli() -> Path:
    binary = Path(os.environ.get("HAPI_AWS_CLI") or ROOT / ".venv-awscli" / "bin" / "aws")
    if not binary.exists():
        pytest.fail(f"AWS CLI not found at {binary}: run `make test`, which installs it")
    return binary


@pytest.fixture(scope="module")
def reader(stack, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The reader's working directory (with photo.jpg) and shell environment."""
    from PIL import Image
    from skimage import data

    workdir = tmp_path_factory.mktemp("reader")
    Image.fromarray(data.chelsea()).save(workdir / "photo.jpg", quality=90)
    home = tmp_path_factory.mktemp("home")
    path = os.pathsep.join([str(_aws_cli().parent), str(Path(HAPI).parent), os.environ["PATH"]])
    env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", **stack}
    return workdir, env


def _your_training_data(stack: dict[str, str]) -> None:
    """What the FeatureDataset example calls the reader's data: s3://data/train/CLASS/*.jpg."""
    from PIL import Image
    from skimage import data

    s3 = boto3.client(
        "s3",
        endpoint_url=stack["AWS_ENDPOINT_URL"],
        region_name=stack["AWS_DEFAULT_REGION"],
        aws_access_key_id=stack["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=stack["AWS_SECRET_ACCESS_KEY"],
    )
    photos = {"cat": data.chelsea(), "coffee": data.coffee(), "astronaut": data.astronaut()}
    for label, pixels in photos.items():
        for n in range(2):
            buffer = BytesIO()
            Image.fromarray(pixels).rotate(10 * n).save(buffer, "JPEG", quality=85)
            key = f"train/{label}/{n:03d}.jpg"
            s3.put_object(Bucket=_bucket(s3, "data"), Key=key, Body=buffer.getvalue())


def _bucket(s3, name: str) -> str:
    if name not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=name)
    return name


def test_the_banners_commands_run_and_its_pushdown_sends_fewer_bytes(stack, reader):
    (banner,) = BANNERS
    assert "hapi-model=efficientnet_lite0&hapi-split=19&hapi-dtype=float16" in banner
    assert "(pooled, float16: 2,560 bytes)" in banner
    lines = banner.split("export AWS_DEFAULT_REGION=us-east-1\n")[1].split("Ctrl-C stops")[0]
    workdir, env = reader
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", STRICT_CURL + lines],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{lines}\n--- stderr\n{done.stderr[-3000:]}"
    assert (workdir / "copy.jpg").read_bytes() == (workdir / "photo.jpg").read_bytes()
    assert '"float16"' in done.stdout and "1280" in done.stdout, done.stdout[-3000:]
    _clear_bucket(stack, "data")  # the README's reader starts from an empty store


def _clear_bucket(stack: dict[str, str], name: str) -> None:
    s3 = boto3.resource(
        "s3",
        endpoint_url=stack["AWS_ENDPOINT_URL"],
        region_name=stack["AWS_DEFAULT_REGION"],
        aws_access_key_id=stack["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=stack["AWS_SECRET_ACCESS_KEY"],
    )
    bucket = s3.Bucket(name)
    bucket.objects.all().delete()
    bucket.delete()


# An HTTP error must fail the example, as it would fail the reader.
STRICT_CURL = 'curl() { command curl --fail-with-body --silent --show-error "$@"; }\n'


def test_readme_examples_run_in_order(stack, reader):
    workdir, env = reader
    for index, (language, code) in enumerate(_examples()):
        if "FeatureDataset" in code:
            _your_training_data(stack)
        command = ["bash", "-euo", "pipefail", "-c", STRICT_CURL + code]
        if language == "python":
            command = [sys.executable, "-c", code]
        done = subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, (
            f"README example {index} ({language}) failed:\n{code}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )

    # The pushdown examples show the benefit: the pooled float16 features of the photo are
    # far fewer bytes than the photo itself.
    photo = (workdir / "photo.jpg").stat().st_size
    assert (workdir / "copy.jpg").stat().st_size == photo
    assert (workdir / "features.safetensors").stat().st_size < photo / 10
