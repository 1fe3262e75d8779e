"""Each package's public surface is what docs/api.md lists: exactly, as httpx tests its own.

A name added to or removed from a package's ``__all__`` without the page changing fails
here; so does a page that lists a name the package does not export, and an ``__all__``
that misses a public name the package defines.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[1] / "docs" / "api.md"
PACKAGES = (
    "hapi.protocol",
    "hapi.models",
    "hapi.planner",
    "hapi.gateway",
    "hapi.sdk",
    "hapi.store",
)
_SECTION = re.compile(r"^## `(hapi\.[a-z]+)`$", re.M)
_ITEM = re.compile(r"^- `(\w+)`", re.M)


def documented(text: str | None = None) -> dict[str, list[str]]:
    """The names a page (docs/api.md unless given) lists, per package, in its order."""
    text = API.read_text(encoding="utf-8") if text is None else text
    parts = _SECTION.split(text)[1:]
    return {name: _ITEM.findall(body) for name, body in zip(parts[::2], parts[1::2], strict=True)}


def test_the_page_has_a_section_per_package() -> None:
    assert sorted(documented()) == sorted(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_exactly_what_the_page_documents(package: str) -> None:
    module = importlib.import_module(package)
    assert list(module.__all__) == documented()[package]


@pytest.mark.parametrize("package", PACKAGES)
def test_all_names_every_public_name_the_package_defines(package: str) -> None:
    module = importlib.import_module(package)
    public = {n for n in dir(module) if not n.startswith("_")} - {"annotations", "TYPE_CHECKING"}
    modules = {n for n in public if type(getattr(module, n)).__name__ == "module"}
    assert set(module.__all__) == public - modules
    assert module.__all__ == sorted(module.__all__, key=lambda n: (not n.isupper(), n))


def test_the_check_sees_a_change() -> None:
    page = "## `hapi.protocol`\n\nShared.\n\n- `parse_size`: sizes\n- `UserError`\n"
    assert documented(page) == {"hapi.protocol": ["parse_size", "UserError"]}
    assert documented(page.replace("- `UserError`\n", "")) != documented(page)


DESIGN = API.parent / "design.md"
_ROW = re.compile(
    r"^\| `(hapi\.[a-z]+)` \(`[a-z]+/`[^)]*\) \|.*\| (\d+)(?: \(\d+ before\))? \|$", re.M
)


def design_counts(text: str | None = None) -> dict[str, int]:
    """The public-name counts design.md's package table states, per package."""
    text = DESIGN.read_text(encoding="utf-8") if text is None else text
    return {name: int(count) for name, count in _ROW.findall(text)}


def test_the_design_pages_counts_are_the_packages_own() -> None:
    counts = design_counts()
    assert sorted(counts) == sorted(PACKAGES)
    for package, count in counts.items():
        assert len(importlib.import_module(package).__all__) == count, package


def test_the_design_page_says_truly_how_the_stream_writes_safetensors() -> None:
    stream = (API.parents[1] / "gateway" / "pushdown" / "_stream.py").read_text()
    text = " ".join(DESIGN.read_text(encoding="utf-8").split())
    assert "header from `hapi.protocol.safetensors_header`" in text
    assert "safetensors_header" in stream
    assert "encoded by `hapi.protocol.encode_features`" not in text


def test_the_count_check_sees_a_change() -> None:
    row = "| `hapi.sdk` (`sdk/`) | owns | below | 29 (20 before) |\n"
    assert design_counts(row) == {"hapi.sdk": 29}
    assert design_counts(row.replace("29", "30")) != design_counts(row)
