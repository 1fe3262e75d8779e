"""The benchmarks are a distribution of their own: the hapi wheel ships none of them, and
hapi-bench gives `hapi bench` and the public `hapi-bench` commands the Makefile runs."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from click.testing import CliRunner

from hapi_bench import bench, main

ROOT = Path(__file__).resolve().parents[3]
HAPI = tomllib.loads((ROOT / "pyproject.toml").read_text())
HAPI_BENCH = tomllib.loads((ROOT / "benchmarks" / "pyproject.toml").read_text())


def test_the_hapi_wheel_ships_no_benchmarks() -> None:
    setuptools = HAPI["tool"]["setuptools"]
    assert not [p for p in setuptools["packages"] if "bench" in p]
    assert not [d for d in setuptools["package-dir"].values() if "bench" in d]
    assert "bench" not in HAPI["project"]["entry-points"]["hapi.commands"]


def test_hapi_bench_depends_on_hapi_and_registers_its_commands() -> None:
    project = HAPI_BENCH["project"]
    assert project["name"] == "hapi-bench"
    assert any(re.match(r"hapi\b(?!-)", dep) for dep in project["dependencies"])
    assert any(dep.startswith("matplotlib") for dep in project["dependencies"])
    assert project["entry-points"]["hapi.commands"] == {"bench": "hapi_bench:bench"}
    assert project["scripts"] == {"hapi-bench": "hapi_bench:main"}
    # every folder of the distribution is packaged, each a subpackage saying in one line
    # what lives there
    source = Path(__file__).parents[3] / "benchmarks" / "hapi_bench"
    folders = sorted(p.parent for p in source.rglob("__init__.py"))
    names = [
        "hapi_bench" + "".join("." + part for part in f.relative_to(source).parts) for f in folders
    ]
    assert HAPI_BENCH["tool"]["setuptools"]["packages"] == names
    for folder in folders[1:]:
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and "\n" not in doc.strip(), folder
    assert len(list(source.glob("_*.py"))) <= 5  # the top level: the command and its errors
    # the head-to-head's contender, AWS's loader
    assert "s3torchconnector==1.5.0" in project["dependencies"]


def test_hapi_bench_has_the_testbed_and_the_micro_benchmarks() -> None:
    assert set(main.commands) == {
        "testbed",
        "proxy",
        "servers",
        "floors",
        "pushdown",
        "batching",
        "device",
        "device-ceiling",
        "load",
        "cluster",
        "headtohead",
        "augment",
    }
    assert main.commands["testbed"] is bench


def test_a_micro_benchmark_keeps_its_own_options() -> None:
    result = CliRunner().invoke(main, ["proxy", "--help"])

    assert result.exit_code == 0, result.output
    assert "--size-mib" in result.output
    assert "--rss-mib" in result.output
    assert "--connections" in result.output  # wrk's load phase
    ceiling = CliRunner().invoke(main, ["pushdown", "--help"])
    assert ceiling.exit_code == 0 and "bare loop" in ceiling.output


def test_the_make_targets_call_the_public_commands() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "hapi_bench._" not in makefile
    assert "hapi.bench" not in makefile
    for name in ("proxy", "pushdown", "device", "load", "headtohead"):
        assert re.search(rf"^bench-{name}:.*\n(?:\t.*\n)*?\t\S*hapi-bench {name} ", makefile, re.M)
    assert re.search(r"^bench:.*\n\t\S*hapi-bench testbed ", makefile, re.M)
