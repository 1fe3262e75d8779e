"""deploy/compose.yaml: valid Compose, the endpoints of `make run`, the gateway's variables."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import _support as s


def _raw() -> dict[str, Any]:
    (doc,) = s.yaml_documents(s.COMPOSE)
    return doc


def _environ() -> dict[str, str]:
    """What a filled-in deploy/.env holds: the example plus credentials."""
    return {**s.read_env_file(s.COMPOSE_ENV_EXAMPLE), **s.dummy_credentials()}


def _rendered() -> dict[str, Any]:
    return dict(s.interpolate(_raw(), _environ()))


def _check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("check_jsonschema")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_compose_file_matches_the_compose_spec() -> None:
    checked = _check_jsonschema(s.COMPOSE)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_interpolated_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    rendered = tmp_path / "compose.yaml"
    rendered.write_text(yaml.safe_dump(_rendered()))
    checked = _check_jsonschema(rendered)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_schema_check_catches_a_mistake(tmp_path: Path) -> None:
    broken = _raw()
    broken["services"]["gateway"]["healthcheck"]["retry"] = 3
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert _check_jsonschema(path).returncode != 0


def test_empty_credentials_stop_compose() -> None:
    environ = s.read_env_file(s.COMPOSE_ENV_EXAMPLE)
    assert all(environ[name] == "" for name in s.CREDENTIAL_ENV), "the example ships no secrets"
    with pytest.raises(s.InterpolationError):
        s.interpolate(_raw(), environ)


def test_every_variable_is_in_the_env_example_or_has_a_default() -> None:
    text = s.COMPOSE.read_text()
    listed = set(s.read_env_file(s.COMPOSE_ENV_EXAMPLE))
    for name in s.compose_variables(text):
        assert name in listed or f"${{{name}:-" in text, name


def test_endpoints_are_those_of_make_run() -> None:
    services = _rendered()["services"]
    up = s.command_defaults("up")
    assert services["gateway"]["ports"] == [f"127.0.0.1:{up['port']}:{up['port']}"]
    assert services["store"]["ports"] == [f"127.0.0.1:{up['store_port']}:{up['store_port']}"]
    assert f"-s3.port={up['store_port']}" in services["store"]["command"]
    gateway = services["gateway"]
    assert gateway["command"] == ["serve", "--host", "0.0.0.0", "--port", str(up["port"])]
    assert gateway["environment"]["HAPI_BACKEND_URL"] == f"http://store:{up['store_port']}"


def test_gateway_environment_makes_valid_settings_with_the_defaults() -> None:
    environment = _rendered()["services"]["gateway"]["environment"]
    assert set(environment) <= s.gateway_env()
    assert s.gateway_settings(environment).backend_url == "http://store:8333"
    example = s.read_env_file(s.COMPOSE_ENV_EXAMPLE)
    assert set(example) <= s.gateway_env() | s.DEPLOY_ONLY_ENV
    for name, default in s.default_settings_env().items():
        assert example[name] == default, f"{name}: .env.example says it shows the default"


def test_store_accepts_exactly_the_gateways_backend_credentials() -> None:
    from hapi.protocol import Credentials
    from hapi.store._store import _identity_config

    rendered = _rendered()
    config = json.loads(rendered["configs"]["s3-identities"]["content"])
    environ = _environ()
    backend = Credentials(
        environ["HAPI_BACKEND_ACCESS_KEY_ID"], environ["HAPI_BACKEND_SECRET_ACCESS_KEY"]
    )
    # The same identity document `hapi store` writes for the embedded store.
    assert config == _identity_config(backend)
    (mount,) = rendered["services"]["store"]["configs"]
    assert f"-s3.config={mount['target']}" in rendered["services"]["store"]["command"]


def test_healthchecks_and_image_agree_with_the_dockerfile() -> None:
    services = _raw()["services"]
    instructions = s.dockerfile_instructions()
    (healthcheck,) = [i for i in s.final_stage(instructions) if i.keyword == "HEALTHCHECK"]
    assert services["gateway"]["healthcheck"]["test"] == ["CMD", *healthcheck.exec_form()]
    build = services["gateway"]["build"]
    assert (s.COMPOSE.parent / build["context"]).resolve() == s.ROOT
    assert (s.ROOT / build["dockerfile"]).resolve() == s.DOCKERFILE
    assert set(build["args"]) <= set(s.dockerfile_args())
    stages = {i.stage for i in instructions}
    for variant in ("cpu", "gpu"):
        assert f"runtime-{variant}" in stages
    assert "/healthz" in " ".join(services["store"]["healthcheck"]["test"])


def test_store_runs_weed_mini_like_hapi_store() -> None:
    from hapi.store._store import _DISABLED_FEATURES

    store = _raw()["services"]["store"]
    command = store["command"]
    assert command[:2] == ["-logtostderr", "mini"]
    # Every feature `hapi store` (behind `make run`) switches off is off here too.
    assert set(_DISABLED_FEATURES) <= set(command)
    entrypoint = s.interpolate(store["entrypoint"], {})
    assert entrypoint[:2] == ["/bin/sh", "-c"]
    assert entrypoint[2] == 'rm -f /data/mini.options && exec /usr/bin/weed "$@"'
    assert "-dir=/data" in command
    assert store["volumes"] == ["store-data:/data"]


def test_gpu_reservation_is_there_to_uncomment() -> None:
    commented = "\n".join(
        line.strip().removeprefix("#")
        for line in s.COMPOSE.read_text().splitlines()
        if line.strip().startswith("# ")
    )
    assert "driver: nvidia" in commented
    assert "capabilities: [gpu]" in commented


def test_gateway_runs_locked_down() -> None:
    gateway = _raw()["services"]["gateway"]
    assert gateway["read_only"] is True
    assert gateway["tmpfs"] == ["/tmp"]
    assert gateway["cap_drop"] == ["ALL"]


# --- the services' commands, run here with the same binaries --------------------------


def _free_ports(count: int) -> list[int]:
    from hapi.store._store import _free_ports as pick

    return pick(count, "127.0.0.1", exclude=0)


@contextlib.contextmanager
def _process(
    command: list[str], env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_for(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
            return
        time.sleep(0.2)
    raise AssertionError(
        f"{url} not ready in {timeout}s:\n" + log.read_text(errors="replace")[-3000:]
    )


def _store_command(weed: str, store: dict[str, Any], tmp: Path, ports: list[int]) -> list[str]:
    """Compose's store command for this machine: local paths, loopback, free ports."""
    config = tmp / "s3.json"
    config.write_text(_rendered()["configs"]["s3-identities"]["content"])
    (mount,) = store["configs"]
    replace = {
        "-dir=/data": f"-dir={tmp / 'data'}",
        "-ip.bind=0.0.0.0": "-ip.bind=127.0.0.1",
        "-s3.port=8333": f"-s3.port={ports[0]}",
        f"-s3.config={mount['target']}": f"-s3.config={config}",
    }
    command = [replace.get(arg, arg) for arg in store["command"]]
    assert all(arg not in command for arg in replace), "every replaced flag was there"
    names = ("master", "volume", "filer", "admin")
    flags = [f"-{n}.port={p}" for n, p in zip(names, ports[1:5], strict=True)]
    flags += [f"-{n}.port.grpc={p}" for n, p in zip((*names, "s3"), ports[5:10], strict=True)]
    (tmp / "data").mkdir()
    return [weed, f"-config_dir={tmp}", *command, *flags]


def _isolated_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAPI_", "AWS_", "S3_"))}
    return {**env, **extra}


@pytest.mark.slow
def test_services_start_from_the_compose_commands(tmp_path: Path) -> None:
    """The store's flags work with this SeaweedFS, the gateway's environment with this hapi."""
    from hapi.store._store import StoreError, locate_weed

    try:
        weed = str(locate_weed())
    except StoreError:
        pytest.skip("no SeaweedFS `weed` binary")
    hapi = s.executable("hapi")
    assert hapi, "the hapi console script is installed"
    services = _rendered()["services"]
    ports = _free_ports(11)
    store_url = f"http://127.0.0.1:{ports[0]}"
    store_log, gateway_log = tmp_path / "weed.log", tmp_path / "gateway.log"
    store_command = _store_command(weed, services["store"], tmp_path, ports)
    gateway_env = {**services["gateway"]["environment"], "HAPI_BACKEND_URL": store_url}
    gateway_command = [hapi, *services["gateway"]["command"]]
    gateway_command[gateway_command.index("0.0.0.0")] = "127.0.0.1"
    gateway_command[-1] = str(ports[10])
    gateway_url = f"http://127.0.0.1:{ports[10]}"
    try:
        with _process(store_command, _isolated_env({}), store_log) as store:
            _wait_for(f"{store_url}/healthz", store, store_log)  # the store's healthcheck URL
            with pytest.raises(urllib.error.HTTPError) as anonymous:
                urllib.request.urlopen(store_url + "/", timeout=5)
            assert anonymous.value.code == 403
            with _process(gateway_command, _isolated_env(gateway_env), gateway_log) as gateway:
                _wait_for(f"{gateway_url}/_hapi/health", gateway, gateway_log)
                _exercise_gateway(gateway_url, services["gateway"])
    finally:
        from hapi.store._store import _remove_sockets

        _remove_sockets(tuple(ports))


def _exercise_gateway(url: str, gateway: dict[str, Any]) -> None:
    import boto3
    from botocore.config import Config

    env = gateway["environment"]
    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=env["HAPI_ACCESS_KEY_ID"],
        aws_secret_access_key=env["HAPI_SECRET_ACCESS_KEY"],
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )
    client.create_bucket(Bucket="deploy-check")
    client.put_object(Bucket="deploy-check", Key="a.txt", Body=b"through compose's settings")
    body = client.get_object(Bucket="deploy-check", Key="a.txt")["Body"].read()
    assert body == b"through compose's settings"
    # The compose healthcheck command itself, pointed at this gateway's port.
    healthcheck = gateway["healthcheck"]["test"][1:]
    healthcheck[-1] = healthcheck[-1].replace("127.0.0.1:8080", url.removeprefix("http://"))
    checked = subprocess.run(
        [sys.executable if healthcheck[0] == "python" else healthcheck[0], *healthcheck[1:]],
        capture_output=True,
        timeout=30,
        env=_isolated_env({}),
    )
    assert checked.returncode == 0, checked.stderr
    # /metrics wants a signed request from a client credential (the compose file does not
    # make it public).
    import httpx
    from botocore.credentials import Credentials as BotoCredentials

    from hapi.sdk import GatewayAuth

    credentials = BotoCredentials(env["HAPI_ACCESS_KEY_ID"], env["HAPI_SECRET_ACCESS_KEY"])
    assert httpx.get(url + "/metrics", timeout=5).status_code == 403
    metrics = httpx.get(url + "/metrics", timeout=5, auth=GatewayAuth(credentials))
    assert b"hapi_requests_total" in metrics.content
