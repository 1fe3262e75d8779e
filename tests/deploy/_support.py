"""What the deployment checks read: the files under ``deploy/`` and the facts of the code.

The code is the reference: environment variable names come from ``hapi.gateway._settings``,
ports and the listen address from the click commands, routes from the app itself, metric
names from the metrics registry. Small readers for the formats involved (Compose
interpolation, env files, Dockerfile instructions) live here too.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
COMPOSE_ENV_EXAMPLE = DEPLOY / ".env.example"
UNIT = DEPLOY / "systemd" / "hapi-gateway.service"
UNIT_ENV_EXAMPLE = DEPLOY / "systemd" / "hapi-gateway.env.example"
README = DEPLOY / "README.md"

# Variables the deployment files define for themselves (Compose knobs), not the gateway's.
DEPLOY_ONLY_ENV = frozenset({"HAPI_IMAGE_VARIANT", "HAPI_PUBLISH_ADDRESS"})
# Variables of the SDK (training pods); the gateway reads HAPI_PLACEMENT as well.
SDK_ENV = frozenset({"HAPI_PLACEMENT"})
# The four variables that carry the two credential pairs.
CREDENTIAL_ENV = (
    "HAPI_BACKEND_ACCESS_KEY_ID",
    "HAPI_BACKEND_SECRET_ACCESS_KEY",
    "HAPI_ACCESS_KEY_ID",
    "HAPI_SECRET_ACCESS_KEY",
)
HAPI_NAME = re.compile(r"\bHAPI_[A-Z0-9_]*[A-Z0-9]\b")


# --- facts of the code ---------------------------------------------------------------


@functools.cache
def gateway_env() -> frozenset[str]:
    """Every environment variable ``hapi serve`` reads."""
    from hapi.gateway import environment_variables

    return environment_variables()


@functools.cache
def command_defaults(name: str) -> dict[str, Any]:
    """The option defaults of one ``hapi`` subcommand (``serve``, ``store``, ``up``)."""
    from hapi.cli._main import store
    from hapi.cli._up import up
    from hapi.gateway._cli import serve

    command = {"serve": serve, "store": store, "up": up}[name]
    return {param.name: param.default for param in command.params}


@functools.cache
def gateway_routes() -> frozenset[str]:
    """The paths of the operations endpoints (``/_hapi/...``, ``/metrics``)."""
    from hapi.gateway._app import create_app
    from hapi.gateway._settings import GatewaySettings
    from hapi.protocol import Credentials

    settings = GatewaySettings(
        backend_url="http://127.0.0.1:9",
        backend_credentials=Credentials("key", "secret"),
        allow_anonymous=True,
    )
    return frozenset(route.path for route in create_app(settings).control.app.routes)


@functools.cache
def metric_samples() -> frozenset[str]:
    """Every sample name ``/metrics`` can show (``hapi_requests_total``, ``..._sum``...), and
    the histograms' own names."""
    from hapi.gateway._metrics import Metrics

    metrics = Metrics()
    metrics.observe("GetObject", 200, 0.01, 1, 1)
    metrics.upstream_errors.labels("reset").inc()
    families = list(metrics.registry.collect())
    histograms = {family.name for family in families if family.type == "histogram"}
    return frozenset({s.name for family in families for s in family.samples} | histograms)


def gateway_settings(environ: Mapping[str, str]) -> Any:
    """``GatewaySettings.from_env`` on ``environ``: raises ValueError where the gateway would."""
    from hapi.gateway._settings import GatewaySettings

    return GatewaySettings.from_env(environ)


def default_settings_env() -> dict[str, str]:
    """The gateway's defaults for the tunables, written the way deployment files write them."""
    from hapi.gateway._settings import GatewaySettings

    defaults = {f.name: f.default for f in GatewaySettings.__dataclass_fields__.values()}
    return {
        "HAPI_DEVICE": defaults["device"],
        "HAPI_MEMORY_BUDGET": f"{defaults['memory_budget_bytes'] // 2**30}GiB",
        "HAPI_MAX_QUEUE_DELAY_MS": f"{defaults['max_queue_delay_ms']:g}",
        "HAPI_MAX_QUEUE_SAMPLES": str(defaults["max_queue_samples"]),
        "HAPI_REGISTRY_BUCKET": defaults["registry_bucket"],
    }


def dummy_credentials() -> dict[str, str]:
    """Values for the four credential variables."""
    return {name: f"test-{name.lower().replace('_', '-')}" for name in CREDENTIAL_ENV}


# --- YAML and env files ----------------------------------------------------------------


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``path``."""
    with path.open(encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def k8s_manifests() -> list[Path]:
    """Every Kubernetes object file under ``deploy/k8s`` (not kustomizations, not values)."""
    return sorted(
        path
        for path in K8S.rglob("*.yaml")
        if path.name != "kustomization.yaml" and not path.name.endswith("-values.yaml")
    )


def k8s_objects() -> dict[tuple[str, str], dict[str, Any]]:
    """The objects of every manifest, keyed by (kind, name)."""
    objects = {}
    for path in k8s_manifests():
        for doc in yaml_documents(path):
            objects[doc["kind"], doc["metadata"]["name"]] = doc
    return objects


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of an env file (Compose ``.env``, systemd ``EnvironmentFile``)."""
    values = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path}: not KEY=value: {line!r}"
            values[key.strip()] = value.strip()
    return values


class InterpolationError(ValueError):
    """A required variable (``${VAR:?message}``) is unset or empty."""


_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(value: Any, environ: Mapping[str, str]) -> Any:
    """Substitute variables in every string of ``value`` the way Compose does.

    Supports ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
    ``${VAR:?message}``, ``${VAR?message}`` and ``$$``.

    Raises:
        InterpolationError: A required variable is missing.
    """
    if isinstance(value, dict):
        return {k: interpolate(v, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, environ) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["plain"]
        current, op = environ.get(name), match["op"] or ""
        missing = current is None or (op.startswith(":") and current == "")
        if op.endswith("?") and missing:
            raise InterpolationError(f"{name}: {match['arg']}")
        if op.endswith("-") and missing:
            return str(match["arg"])
        return current or ""

    return _INTERPOLATION.sub(substitute, value)


def compose_variables(text: str) -> set[str]:
    """The names of the variables a Compose file refers to."""
    return {m["braced"] or m["plain"] for m in _INTERPOLATION.finditer(text) if not m["escaped"]}


# --- Dockerfile --------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: keyword, its argument text, and its stage."""

    keyword: str
    argument: str
    stage: str

    def exec_form(self) -> list[str]:
        """The JSON (exec) form of CMD, ENTRYPOINT or HEALTHCHECK CMD as a list."""
        text = self.argument
        if self.keyword == "HEALTHCHECK":
            text = text.split(" CMD ", 1)[1]
        return list(json.loads(text))


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    """The instructions of a Dockerfile, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].strip() + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    instructions, stage = [], ""
    for line in lines:
        keyword, _, argument = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = argument.split()
            stage = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else words[0]
        instructions.append(Instruction(keyword, argument.strip(), stage))
    return instructions


def dockerfile_args() -> dict[str, str]:
    """Global ``ARG`` defaults (before the first ``FROM``)."""
    args = {}
    for instruction in dockerfile_instructions():
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG":
            name, _, default = instruction.argument.partition("=")
            args[name] = default
    return args


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    """The instructions of the last stage (the image that ships)."""
    last = instructions[-1].stage
    return [i for i in instructions if i.stage == last]


# --- workloads -----------------------------------------------------------------------------


def workloads() -> list[dict[str, Any]]:
    """The gateway's Deployment and DaemonSet."""
    found = [
        obj
        for (kind, name), obj in k8s_objects().items()
        if kind in ("Deployment", "DaemonSet") and name == "hapi-gateway"
    ]
    assert {w["kind"] for w in found} == {"Deployment", "DaemonSet"}, "both flavours exist"
    return found


def gateway_container(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The ``gateway`` container of a workload's pod template."""
    containers = workload["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "gateway"]
    return dict(container)


def split_command(text: str) -> list[str]:
    """A command line as a list of words (shell rules)."""
    return shlex.split(text)


def walk(value: Any) -> Iterator[Any]:
    """Every nested value of a YAML document, depth first."""
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


def executable(name: str) -> str | None:
    """``name`` next to this interpreter (the venv's console scripts), else on PATH."""
    import shutil
    import sys

    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)
