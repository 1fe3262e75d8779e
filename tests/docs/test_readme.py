"""Every shell and Python example in README.md runs, in order, against a live `hapi up`.

Like a reader: one `hapi up` (demo model included) in a fresh state directory, its banner's
`export` lines as the environment, one working directory that holds the reader's photo,
and every fenced `sh` block run with bash and every `python` block with this Python, in
the order the README gives them. An example that stops working fails here.

The one block not run here is the first (`make run`, `make test`): `make run` is run on a
fresh clone by tests/cli/integration/test_make_run.py, and `make test` is this suite.
"""

from __future__ import annotations

import subprocess

from tests.docs._reader import (
    README,
    RUNNABLE,
    STRICT_CURL,
    blocks,
    commands,
    failure,
    is_diagram,
    put_training_data,
    remove_bucket,
    run,
)

RUN_ELSEWHERE = {"make run", "make test"}


def _examples() -> list[tuple[str, str]]:
    runnable = [b for b in blocks(README) if b[0] in RUNNABLE]
    return [b for b in runnable if commands(b[1]) != RUN_ELSEWHERE]


def test_every_code_block_is_shell_or_python_or_a_diagram():
    languages = [language for language, _ in blocks(README)]
    assert set(languages) <= {"sh", "python", ""}
    plain = [code for language, code in blocks(README) if language == ""]
    assert all(is_diagram(code) for code in plain)  # diagrams, not commands
    skipped = [b for b in blocks(README) if b[0] == "sh" and commands(b[1]) == RUN_ELSEWHERE]
    assert len(skipped) == 1  # only `make run` / `make test`, run elsewhere
    assert len(_examples()) >= 5


def test_a_newcomer_reaches_a_pushdown_and_a_feature_dataset_early():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, "the README is read to the end; reference goes to docs/"
    first = {
        "pushdown": next(n for n, line in enumerate(lines, 1) if "hapi-model=" in line),
        "FeatureDataset": next(n for n, line in enumerate(lines, 1) if ".from_prefix(" in line),
    }
    assert all(n <= 80 for n in first.values()), first


def test_the_banners_commands_run_and_its_pushdown_sends_fewer_bytes(hapi_up, reader):
    banner = hapi_up.banner
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
    try:
        assert done.returncode == 0, f"{lines}\n--- stderr\n{done.stderr[-3000:]}"
        assert (workdir / "copy.jpg").read_bytes() == (workdir / "photo.jpg").read_bytes()
        assert '"float16"' in done.stdout and "1280" in done.stdout, done.stdout[-3000:]
    finally:
        remove_bucket(hapi_up.exports, "data")  # the README's reader starts from an empty store


def test_readme_examples_run_in_order(hapi_up, reader):
    workdir, env = reader
    remove_bucket(hapi_up.exports, "data")  # the README's reader starts from an empty store
    try:
        for index, (language, code) in enumerate(_examples()):
            if "FeatureDataset" in code:
                put_training_data(hapi_up.exports)
            done = run(language, code, workdir, env)
            assert done.returncode == 0, failure(README, index, language, code, done)
    finally:
        remove_bucket(hapi_up.exports, "data")

    # The pushdown examples show the benefit: the pooled float16 features of the photo are
    # far fewer bytes than the photo itself.
    photo = (workdir / "photo.jpg").stat().st_size
    assert (workdir / "copy.jpg").stat().st_size == photo
    assert (workdir / "features.safetensors").stat().st_size < photo / 10
