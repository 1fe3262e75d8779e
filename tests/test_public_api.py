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
