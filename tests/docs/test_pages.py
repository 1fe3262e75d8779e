"""The pages under docs/: every `sh` and `python` example runs, and every link resolves.

Each page's examples run in order, like the README's (tests/docs/test_readme.py), against
the same live `hapi up`, starting where the README's first pushdown leaves a reader:
`photo.jpg` in the working directory and in `s3://data/`. A block that cannot run here (a
gateway in front of a production store) is fenced `console` or `text`, and the languages
each page uses are pinned below, so a block fenced in a new language is not silently
skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.docs._reader import (
    DOCS,
    README,
    ROOT,
    RUNNABLE,
    blocks,
    ensure_bucket,
    failure,
    is_diagram,
    photo_jpeg,
    remove_bucket,
    run,
    s3_client,
)

# The fence languages each page uses: "sh" and "python" run, "console" is shown, "" is a
# diagram, "json" a document shown (it must parse). docs/results.md is the benchmarks' record; its command needs root and the
# two-tier testbed, which tests/bench runs.
LANGUAGES = {
    "api.md": set(),
    "cache.md": {"sh"},
    "cluster.md": {"console"},
    "configuration.md": {"console"},
    "design.md": {""},
    "models.md": {"sh"},
    "operations.md": {"sh"},
    "planner.md": {"sh"},
    "protocol.md": {"sh"},
    "sdk.md": {"python"},
    "security.md": {"json"},
}
NOT_CHECKED = {"results.md"}
# What running a page's examples leaves in the reader's working directory.
PRODUCES = {
    "planner.md": ["plan.png", "plan.json"],
    "protocol.md": ["shard.safetensors", "batch.safetensors", "auto.safetensors"],
}
RUN = sorted(page for page, languages in LANGUAGES.items() if languages & set(RUNNABLE))


def test_every_page_is_pinned():
    assert {p.name for p in DOCS.glob("*.md")} == set(LANGUAGES) | NOT_CHECKED


@pytest.mark.parametrize("page", sorted(LANGUAGES))
def test_blocks_run_or_are_marked_as_shown(page: str):
    found = blocks(DOCS / page)
    assert {language for language, _ in found} == LANGUAGES[page]
    assert all(is_diagram(code) for language, code in found if language == "")
    for language, code in found:
        if language == "json":  # shown, not run: it must still be what it says
            json.loads(code)


@pytest.mark.parametrize("page", RUN)
def test_page_examples_run_in_order(page: str, hapi_up, reader):
    workdir, env = reader
    s3 = s3_client(hapi_up.exports)
    s3.put_object(Bucket=ensure_bucket(s3, "data"), Key="photo.jpg", Body=photo_jpeg())
    try:
        for index, (language, code) in enumerate(blocks(DOCS / page)):
            if language in RUNNABLE:
                done = run(language, code, workdir, env)
                assert done.returncode == 0, failure(DOCS / page, index, language, code, done)
    finally:
        remove_bucket(hapi_up.exports, "data")
    for name in PRODUCES.get(page, []):
        assert (workdir / name).stat().st_size > 0, name


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", FENCED.sub("", text), re.M)}


FENCED = re.compile(r"^```.*?^```\n", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s:#]*)(?:#([^)\s]+))?\)")


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_links_resolve(page: Path):
    for target, anchor in LINK.findall(FENCED.sub("", page.read_text(encoding="utf-8"))):
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.relative_to(ROOT)}: {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.relative_to(ROOT)}: {target}#{anchor}"
