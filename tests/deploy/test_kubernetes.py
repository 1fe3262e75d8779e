"""deploy/k8s: schema-valid objects that agree with each other and with the gateway."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import _support as s

kubernetes_validate = pytest.importorskip("kubernetes_validate")
from kubernetes_validate.utils import latest_version  # noqa: E402

# The oldest Kubernetes the manifests claim (deploy/README.md), and the newest bundled.
OLDEST = "1.29"
VERSIONS = (OLDEST, latest_version())
# Custom resources: no schema in kubernetes-validate; checked field by field below.
CRD_KINDS = {"ServiceMonitor"}
FLAVOURS = ("deployment", "daemonset", "storage-nodes", "monitoring", "ingress")


def _schema_objects() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.relative_to(s.K8S)}:{doc['kind']}", doc)
        for path in s.k8s_manifests()
        for doc in s.yaml_documents(path)
        if doc["kind"] not in CRD_KINDS
    ]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("name", "obj"), _schema_objects(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_manifest_matches_kubernetes_schema(name: str, obj: dict[str, Any], version: str) -> None:
    # strict: unknown fields (typos) fail, as `kubectl apply --validate=strict` would.
    kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_is_strict() -> None:
    deployment = copy.deepcopy(s.k8s_objects()["Deployment", "hapi-gateway"])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, latest_version(), strict=True)


def _kustomize() -> list[str] | None:
    if kubectl := shutil.which("kubectl"):
        return [kubectl, "kustomize"]
    if kustomize := shutil.which("kustomize"):
        return [kustomize, "build"]
    return None


def _built(flavour: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize`` (or ``kustomize build``) makes of a flavour."""
    command = _kustomize()
    if command is None:
        pytest.skip("neither kubectl nor kustomize is installed")
    built = subprocess.run(
        [*command, str(s.K8S / flavour)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    import yaml

    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_kustomization_builds_valid_objects(flavour: str) -> None:
    objects = _built(flavour)
    assert objects
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "hapi", obj["metadata"]["name"]
        if obj["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(obj, latest_version(), strict=True)


@pytest.mark.parametrize(
    "kustomization", sorted(s.K8S.rglob("kustomization.yaml")), ids=lambda p: p.parent.name
)
def test_kustomization_lists_every_manifest_beside_it(kustomization: Path) -> None:
    (doc,) = s.yaml_documents(kustomization)
    listed = {r for r in doc["resources"] if not r.startswith("..")}
    here = {
        p.name
        for p in kustomization.parent.glob("*.yaml")
        if p in s.k8s_manifests() and not p.name.endswith(".example.yaml")
    }
    assert listed == here
    assert doc["namespace"] == "hapi"


def test_no_kustomization_applies_placeholder_credentials() -> None:
    for kustomization in s.K8S.rglob("kustomization.yaml"):
        (doc,) = s.yaml_documents(kustomization)
        assert not any(r.endswith(".example.yaml") for r in doc["resources"])
        assert "secretGenerator" not in doc


def test_daemonset_and_deployment_run_the_same_pod() -> None:
    specs = {}
    for workload in s.workloads():
        spec = copy.deepcopy(workload["spec"]["template"])
        spec["spec"].pop("affinity", None)  # the Deployment spreads its replicas; one per node
        specs[workload["kind"]] = spec
    assert specs["Deployment"] == specs["DaemonSet"]


@pytest.mark.parametrize("workload", s.workloads(), ids=lambda w: w["kind"])
class TestGatewayPod:
    def test_listens_on_the_gateway_port_beyond_loopback(self, workload: dict[str, Any]) -> None:
        container = s.gateway_container(workload)
        port = s.command_defaults("serve")["port"]
        assert container["args"] == ["serve", "--host", "0.0.0.0", "--port", str(port)]
        assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port)
        assert annotations["prometheus.io/path"] in s.gateway_routes()

    def test_probes_use_the_named_port_and_real_routes(self, workload: dict[str, Any]) -> None:
        container = s.gateway_container(workload)
        readiness = container["readinessProbe"]["httpGet"]
        assert readiness == {"path": "/_hapi/health", "port": "http"}
        assert readiness["path"] in s.gateway_routes()
        # Liveness must not depend on the store: a store outage should not restart gateways.
        assert container["livenessProbe"]["tcpSocket"] == {"port": "http"}
        assert container["startupProbe"]["tcpSocket"] == {"port": "http"}
        # The health check waits up to 3 s for the store; the probe must wait longer.
        assert container["readinessProbe"]["timeoutSeconds"] > 3

    def test_environment_is_the_gateways(self, workload: dict[str, Any]) -> None:
        container = s.gateway_container(workload)
        objects = s.k8s_objects()
        (source,) = container["envFrom"]
        configmap = objects["ConfigMap", source["configMapRef"]["name"]]
        secret = objects["Secret", "hapi-credentials"]
        names = set(configmap["data"]) | {e["name"] for e in container["env"]}
        assert names <= s.gateway_env()
        for entry in container["env"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"]
            assert ref["key"] in secret["stringData"]
        assert set(secret["stringData"]) == set(s.CREDENTIAL_ENV)

    def test_asks_for_one_gpu_and_tolerates_gpu_nodes(self, workload: dict[str, Any]) -> None:
        pod = workload["spec"]["template"]["spec"]
        resources = s.gateway_container(workload)["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == 1
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        assert pod["nodeSelector"] == {"hapi/gateway": "true"}

    def test_runs_as_the_images_user_on_a_read_only_root(self, workload: dict[str, Any]) -> None:
        pod = workload["spec"]["template"]["spec"]
        container = s.gateway_container(workload)
        (user,) = [i for i in s.final_stage(s.dockerfile_instructions()) if i.keyword == "USER"]
        uid, gid = (int(n) for n in user.argument.split(":"))
        assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
            uid,
            gid,
        )
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        # The image needs a writable /tmp (CUDA's kernel cache, temporary files).
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]


def test_configmap_and_secret_make_valid_gateway_settings() -> None:
    objects = s.k8s_objects()
    environ = {**objects["ConfigMap", "hapi-gateway"]["data"], **s.dummy_credentials()}
    settings = s.gateway_settings(environ)
    assert settings.backend_url.startswith("http")
    # As shipped, the Secret's empty values must stop the gateway, not start it open.
    empty = {**objects["ConfigMap", "hapi-gateway"]["data"]}
    empty.update(objects["Secret", "hapi-credentials"]["stringData"])
    with pytest.raises(ValueError, match="no client credentials"):
        s.gateway_settings(empty)


def test_service_and_budgets_select_the_gateway_pods() -> None:
    objects = s.k8s_objects()
    pod_labels = s.workloads()[0]["spec"]["template"]["metadata"]["labels"]
    service = objects["Service", "hapi-gateway"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == (
        "http",
        s.command_defaults("serve")["port"],
        "http",
    )
    pdb = objects["PodDisruptionBudget", "hapi-gateway"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for workload in s.workloads():
        assert workload["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_servicemonitor_scrapes_metrics_on_the_services_port() -> None:
    objects = s.k8s_objects()
    monitor = objects["ServiceMonitor", "hapi-gateway"]
    service = objects["Service", "hapi-gateway"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["path"] in s.gateway_routes()


def test_hpa_scales_the_deployment_on_metrics_the_adapter_serves() -> None:
    objects = s.k8s_objects()
    hpa = objects["HorizontalPodAutoscaler", "hapi-gateway"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "hapi-gateway")
    assert hpa["spec"]["minReplicas"] >= 2  # with the PDB, a drain never takes the last one
    (values,) = s.yaml_documents(s.K8S / "monitoring" / "prometheus-adapter-values.yaml")
    rules = values["rules"]["custom"]
    served = {rule["name"]["as"] for rule in rules}
    pods_metrics = {
        m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"
    }
    assert pods_metrics and pods_metrics <= served
    for rule in rules:
        series = rule["seriesQuery"].split("{", 1)[0]
        assert series in s.metric_samples(), f"{series} is not exported by /metrics"
        assert rule["name"]["matches"] == f"^{series}$"


def test_ingress_routes_to_the_services_named_port() -> None:
    objects = s.k8s_objects()
    ingress = objects["Ingress", "hapi-gateway"]
    service = objects["Service", "hapi-gateway"]
    tls_hosts = {h for entry in ingress["spec"]["tls"] for h in entry["hosts"]}
    for rule in ingress["spec"]["rules"]:
        assert rule["host"] in tls_hosts
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            assert backend["name"] == service["metadata"]["name"]
            assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    annotations = ingress["metadata"]["annotations"]
    # Objects stream: a body size limit or request buffering would break large PUTs.
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "0"
    assert annotations["nginx.ingress.kubernetes.io/proxy-request-buffering"] == "off"


def test_storage_node_gateways_know_the_placement_and_their_nodes_address() -> None:
    objects = {(obj["kind"], obj["metadata"]["name"]): obj for obj in _built("storage-nodes")}
    container = s.gateway_container(objects["DaemonSet", "hapi-gateway"])
    sources = {e["name"]: e["valueFrom"] for e in container["env"]}
    # The node's address, what its volume server advertises as its publicUrl.
    assert sources["HAPI_NODE_ADDRESS"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    ref = sources["HAPI_PLACEMENT"]["configMapKeyRef"]
    placement = objects["ConfigMap", ref["name"]]["data"][ref["key"]]
    environ = {
        **objects["ConfigMap", "hapi-gateway"]["data"],
        **s.dummy_credentials(),
        "HAPI_PLACEMENT": placement,
        "HAPI_NODE_ADDRESS": "192.0.2.7",
    }
    settings = s.gateway_settings(environ)
    assert settings.placement.startswith("seaweedfs:") and settings.node_address == "192.0.2.7"
