"""deploy/systemd: a unit systemd accepts, running `hapi serve` like the image does."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy import _support as s


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[method-assign]  # unit keys are case-sensitive
    parser.read_string(s.UNIT.read_text())
    return parser


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    hapi = s.executable("hapi")
    assert hapi, "the hapi console script is installed"
    # verify insists that ExecStart's program exists: point it at this checkout's `hapi`.
    unit = tmp_path / s.UNIT.name
    exec_start = _unit()["Service"]["ExecStart"]
    unit.write_text(s.UNIT.read_text().replace(exec_start.split()[0], hapi))
    verified = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 on unknown keys and bad values too; it only says so on stderr.
    assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr


def test_runs_hapi_serve_like_the_image() -> None:
    service = _unit()["Service"]
    command = s.split_command(service["ExecStart"])
    assert command[0] == "/opt/hapi/bin/hapi"
    port = s.command_defaults("serve")["port"]
    assert command[1:] == ["serve", "--host", "0.0.0.0", "--port", str(port)]
    assert service["EnvironmentFile"] == "/etc/hapi/gateway.env"
    assert service["Restart"] == "on-failure"
    assert service["DynamicUser"] == "yes"  # never root
    assert _unit()["Install"]["WantedBy"] == "multi-user.target"


def test_gpu_devices_stay_visible() -> None:
    service = _unit()["Service"]
    assert "PrivateDevices" not in service and "DevicePolicy" not in service


def test_env_example_holds_the_gateways_variables_and_defaults() -> None:
    example = s.read_env_file(s.UNIT_ENV_EXAMPLE)
    assert set(example) <= s.gateway_env()
    assert all(example[name] == "" for name in s.CREDENTIAL_ENV), "the example ships no secrets"
    for name, default in s.default_settings_env().items():
        assert example[name] == default, f"{name}: the example says it shows the default"
    settings = s.gateway_settings({**example, **s.dummy_credentials()})
    assert settings.backend_url == example["HAPI_BACKEND_URL"]


def test_credentials_file_path_is_where_load_credential_puts_it() -> None:
    text = s.UNIT.read_text() + s.UNIT_ENV_EXAMPLE.read_text()
    name = s.UNIT.name
    # systemd puts LoadCredential=ID:PATH at /run/credentials/UNIT/ID.
    assert f"HAPI_CREDENTIALS_FILE=/run/credentials/{name}/clients.json" in text
    assert "LoadCredential=clients.json:" in text
