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
    assert _private("hapi_bench.reports._report")
    assert not _private("hapi_bench")
    assert _package("hapi_bench.reports._report") == "hapi_bench"
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


# Import cycles still to be removed, each named exactly so that the list can only shrink:
# a cycle found here that is not (part of) one of these fails, and so does an entry that no
# longer matches any cycle. No module cycle is left. Packages: the gateway's top level (the
# router, the app) imports both halves, and both halves import the top level's shared
# modules (errors, settings, identities, the store client); edge/ and pushdown/ never import
# each other (an import-linter contract).
ALLOWED_MODULE_CYCLES: tuple[frozenset[str], ...] = ()
ALLOWED_PACKAGE_CYCLES = (
    frozenset({"hapi.gateway", "hapi.gateway.edge", "hapi.gateway.pushdown"}),
)


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = {stack.pop()}
                    while node not in component:
                        component.add(stack.pop())
                    if len(component) > 1:
                        found.append(frozenset(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(edges.get(target, ())))))
            elif target in stack:
                low[node] = min(low[node], index[target])
    return found


def _import_graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Module imports (every import grimp sees: module level, in functions, and under
    ``TYPE_CHECKING``), and the same folded onto packages: a module stands for the package
    it lies in, and a package's ``__init__`` (which re-exports its children) is left out."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    modules: dict[str, set[str]] = {m: set() for m in graph.modules}
    packages: dict[str, set[str]] = {}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            modules[importer].add(imported)
            if graph.find_children(importer):
                continue
            source = importer.rpartition(".")[0]
            target = imported if graph.find_children(imported) else imported.rpartition(".")[0]
            if source != target:
                packages.setdefault(source, set()).add(target)
                packages.setdefault(target, set())
    return modules, packages


def _unexpected(found: list[frozenset[str]], allowed: tuple[frozenset[str], ...]) -> list[str]:
    extra = [sorted(c) for c in found if not any(c <= known for known in allowed)]
    stale = [sorted(k) for k in allowed if not any(c <= k for c in found)]
    return [f"new cycle: {c}" for c in extra] + [f"gone, drop it from the list: {k}" for k in stale]


def test_no_import_cycles_between_modules_but_the_listed_ones() -> None:
    modules, _ = _import_graphs()
    assert _unexpected(_cycles(modules), ALLOWED_MODULE_CYCLES) == []


def test_no_import_cycles_between_packages_but_the_listed_ones() -> None:
    _, packages = _import_graphs()
    assert _unexpected(_cycles(packages), ALLOWED_PACKAGE_CYCLES) == []


def test_the_cycle_check_sees_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(edges) == [frozenset({"a", "b", "c"})]
    assert _unexpected([frozenset({"a", "b"})], (frozenset({"a", "b", "c"}),)) == []
    assert _unexpected([frozenset({"x", "y"})], ()) == ["new cycle: ['x', 'y']"]
    assert _unexpected([], (frozenset({"a", "b"}),)) == ["gone, drop it from the list: ['a', 'b']"]
