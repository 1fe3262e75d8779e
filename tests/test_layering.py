"""What one hapi package shares with another is public API: no reaching into underscore names.

import-linter checks which package may import which (``make check``); this checks *how*:
an import from another hapi package goes through that package's public surface, never one of
its private modules or underscore names, function-level imports included (grimp reads the
source, so lazy imports count as well).
"""

from __future__ import annotations

import re

import grimp

PACKAGES = ("models", "store", "planner", "gateway", "sdk", "cli", "bench")
_IMPORTED_NAMES = re.compile(r"\bimport\s+\(?([^)#]*)")


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split(".")[2:])


def _underscore_names(line: str) -> list[str]:
    match = _IMPORTED_NAMES.search(line)
    names = match.group(1).split(",") if match else []
    return [n.split()[0] for n in names if n.strip().startswith("_")]


def test_no_package_imports_another_packages_private_modules_or_names() -> None:
    graph = grimp.build_graph(*(f"hapi.{name}" for name in PACKAGES), cache_dir=None)
    breaches = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if _package(imported) == _package(importer):
                continue
            details = graph.get_import_details(importer=importer, imported=imported)
            for detail in details:
                line = f"{importer}:{detail['line_number']}: {detail['line_contents']}"
                if _private(imported) or _underscore_names(detail["line_contents"]):
                    breaches.append(line)
    assert breaches == []


def test_the_check_sees_a_breach() -> None:
    assert _private("hapi.models._cli")
    assert not _private("hapi.models")
    assert _underscore_names("from hapi.models import UserError, _registry") == ["_registry"]
    assert _underscore_names("from hapi.models import UserError as E") == []
