"""The layering rule and the error tree (the public names: tests/test_public_api.py)."""

from __future__ import annotations

import subprocess
import sys

from hapi import planner


def test_the_planner_imports_no_gateway_sdk_web_framework_or_http_client() -> None:
    code = (
        "import sys, hapi.planner; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "{'starlette', 'uvicorn', 'fastapi', 'httpx'}"
        " or m.startswith(('hapi.gateway', 'hapi.sdk'))]; print(bad)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_errors_form_one_tree() -> None:
    for error in (planner.InvalidInput, planner.NoFeasibleSplit):
        assert issubclass(error, planner.PlannerError)
    assert issubclass(planner.InvalidInput, ValueError)
