"""deploy/README.md and every file under deploy/: the names they use are the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy import _support as s

README = s.README.read_text()
DEPLOY_FILES = sorted(
    p for p in s.DEPLOY.rglob("*") if p.is_file() and p.name not in (".gitignore",)
)


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda p: str(p.relative_to(s.DEPLOY)))
def test_every_hapi_variable_is_one_the_gateway_reads(path: Path) -> None:
    names = set(s.HAPI_NAME.findall(path.read_text()))
    unknown = names - s.gateway_env() - s.DEPLOY_ONLY_ENV - s.SDK_ENV
    assert not unknown, f"{path.name} uses variables the gateway does not read: {unknown}"


def test_readme_documents_every_gateway_variable() -> None:
    table = {m for m in re.findall(r"^\| `([^|]*)` \|", README, re.M)}
    documented = {name for row in table for name in s.HAPI_NAME.findall(row)}
    assert documented == s.gateway_env()


def test_readme_names_only_exported_metrics() -> None:
    named = set(re.findall(r"\bhapi_[a-z_]+\b", README))
    adapter_outputs = {"hapi_request_concurrency", "hapi_requests_per_second"}
    assert named - adapter_outputs <= s.metric_samples()
    assert adapter_outputs <= named


def test_readme_paths_are_routes() -> None:
    routes = s.gateway_routes()
    for path in set(re.findall(r"`(/_hapi/[a-z]+|/metrics)`", README)):
        assert path in routes, path


def test_readme_shows_the_endpoints_and_ports() -> None:
    up = s.command_defaults("up")
    assert f"`http://127.0.0.1:{up['port']}`" in README
    assert f"`http://127.0.0.1:{up['store_port']}`" in README
    port = s.command_defaults("serve")["port"]
    assert f"hapi serve --host 0.0.0.0 --port {port}" in README
    assert s.dockerfile_args()["CUDA_IMAGE"] in README


def test_readme_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (s.DEPLOY / target).exists(), target


def test_readme_anchors_exist() -> None:
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", README, re.M)
    }
    for anchor in re.findall(r"\]\(#([^)]+)\)", README):
        assert anchor in headings, anchor


def test_readme_mentions_every_deployment_file() -> None:
    for path in DEPLOY_FILES:
        if path == s.README or path.suffix == ".dockerignore" or path.name == "kustomization.yaml":
            continue
        relative = str(path.relative_to(s.DEPLOY))
        assert relative in README or path.name in README, relative


def test_sizing_table_is_a_marked_placeholder_for_the_benchmarks() -> None:
    assert "Placeholder: figures from `make bench-pushdown` / `make bench-proxy`" in README
    makefile = (s.ROOT / "Makefile").read_text()
    for target in ("bench-pushdown", "bench-proxy"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    sizing = README.split("## Sizing", 1)[1]
    rows = [line for line in sizing.splitlines() if line.startswith("| _TBD_")]
    assert rows, "the placeholder rows are there to fill"
    # No invented figures: every cell of the placeholder rows is still to be measured.
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(c == "_TBD_" or not re.search(r"\d", c) for c in cells), row
