"""The package's surface and layering: public names, and no torch on the serving path."""

from __future__ import annotations

import inspect
import subprocess
import sys

import hapi.models


def test_all_names_exist_and_nothing_public_is_left_out() -> None:
    exported = set(hapi.models.__all__)
    assert len(exported) == len(hapi.models.__all__)
    for name in exported:
        assert hasattr(hapi.models, name), name
    defined = {
        name
        for name, value in vars(hapi.models).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert defined == exported


def test_serving_path_imports_without_torch_or_other_layers() -> None:
    code = """
import sys
sys.modules["torch"] = None  # any import of torch now fails
import hapi.models, hapi.models._cli
from hapi.models import Registry, create_session, preprocess, compose
layers = [m for m in sys.modules if m.startswith(("hapi.gateway", "hapi.planner", "hapi.sdk"))]
web = [m for m in ("starlette", "fastapi", "uvicorn", "httpx") if m in sys.modules]
print(layers, web)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] []"


def test_export_without_torch_says_what_to_install() -> None:
    code = """
import sys
sys.modules["torch"] = None
from hapi.models import ExportError, export_model
try:
    export_model("resnet18")
except ExportError as exc:
    print(exc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'hapi[torch]'" in done.stdout
