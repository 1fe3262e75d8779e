"""What one hapi package shares with another is public API: no reaching into underscore names;
and mypy checks the packages as one program.

import-linter checks which package may import which (``make check``); this checks *how*:
an import from another hapi package goes through that package's public surface, never one of
its private modules or underscore names, function-level imports included (grimp reads the
source, so lazy imports count as well).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
# the benchmarks are a distribution of their own (benchmarks/), outside the hapi namespace
PACKAGES = (
    "hapi.protocol",
    "hapi.models",
    "hapi.store",
    "hapi.planner",
    "hapi.gateway",
    "hapi.sdk",
    "hapi.cli",
    "hapi_bench",
)
_IMPORTED_NAMES = re.compile(r"\bimport\s+\(?([^)#]*)")


def _package(module: str) -> str:
    depth = 2 if module.startswith("hapi.") else 1
    return ".".join(module.split(".")[:depth])


def _private(module: str) -> bool:
    inside = module.removeprefix(_package(module)).split(".")[1:]
    return any(part.startswith("_") for part in inside)


def _underscore_names(line: str) -> list[str]:
    match = _IMPORTED_NAMES.search(line)
    names = match.group(1).split(",") if match else []
    return [n.split()[0] for n in names if n.strip().startswith("_")]


def test_no_package_imports_another_packages_private_modules_or_names() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
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
    assert _private("hapi_bench._report")
    assert not _private("hapi_bench")
    assert _package("hapi_bench._report") == "hapi_bench"
    assert _underscore_names("from hapi.models import UserError, _registry") == ["_registry"]
    assert _underscore_names("from hapi.models import UserError as E") == []


@pytest.mark.slow
def test_mypy_resolves_hapi_imports_to_the_sources(tmp_path: Path) -> None:
    """The tree `make check` type-checks: a wrong use of another package's API is an error,
    not ``Any`` (which is what the editable install's path hook gives mypy)."""
    tree = tmp_path / "hapi"
    tree.mkdir()
    (tree / "models").symlink_to(ROOT / "models")
    probe = tree / "probe"
    probe.mkdir()
    (probe / "__init__.py").write_text(
        "from hapi.models import RuntimeSettings\n\nwrong: int = RuntimeSettings()\n"
    )
    done = subprocess.run(
        [
            *(sys.executable, "-m", "mypy", "--explicit-package-bases", "--follow-imports=silent"),
            *("--cache-dir", str(tmp_path / "cache"), str(probe / "__init__.py")),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(tmp_path)},
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'expression has type "RuntimeSettings"' in done.stdout, done.stdout
