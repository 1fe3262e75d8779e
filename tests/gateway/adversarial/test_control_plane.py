"""An authenticated control plane, against the real gateway in front of the real store.

``/_hapi/*`` (but ``live`` and ``health``) and ``/metrics`` answer only SigV4-signed
requests from a configured client credential, unless the operator made them public; the
open endpoints say up or down and nothing else; the bandwidth probe is capped per call and
metered per credential; a dead store makes ``/_hapi/models`` an S3 XML 503, not a 500.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials

from hapi.gateway import sign_request
from hapi.protocol import Credentials, GatewayStats, ModelSummary
from hapi.store import free_port
from tests.support import RunningGateway, gateway_process, store_gateway

PROTECTED = (
    "/_hapi/stats",
    "/_hapi/models",
    "/_hapi/models/r18",
    "/_hapi/probe?bytes=16",
    "/_hapi/openapi.json",
    "/_hapi/docs",
    "/metrics",
)
PROBE_CAP = 1024**2
PROBE_PER_MINUTE = 3 * 1024**2
KEYS = {name: (name + secrets.token_hex(4).upper(), secrets.token_hex(20)) for name in ("A", "B")}


@pytest.fixture(scope="module")
def gateway(
    store: Any, backend_s3: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    """A gateway with a small probe cap and rate, two extra credentials, a tight clock."""
    root = tmp_path_factory.mktemp("control")
    registry = f"hapi-control-{secrets.token_hex(4)}"
    backend_s3.create_bucket(Bucket=registry)
    credentials = root / "credentials.json"
    credentials.write_text(json.dumps(dict(KEYS.values())))
    limits = ("--max-probe-bytes", "1MiB", "--probe-bytes-per-minute", "3MiB")
    with store_gateway(
        store,
        root,
        extra_args=(
            *("--credentials-file", str(credentials), "--registry-bucket", registry),
            *(*limits, "--max-skew-s", "120"),
        ),
    ) as running:
        yield running


def _signed(gw: RunningGateway, path: str, key: tuple[str, str] | None = None) -> httpx.Response:
    """GET ``path`` signed the way boto3 signs (botocore's S3 SigV4 header signer)."""
    url = gw.endpoint_url + path
    request = AWSRequest(method="GET", url=url)
    access, secret = key or (gw.access_key_id, gw.secret_access_key)
    S3SigV4Auth(BotoCredentials(access, secret), "s3", "us-east-1").add_auth(request)
    return httpx.get(url, headers=dict(request.headers.items()), timeout=30)


def _error(reply: httpx.Response) -> tuple[int, str | None]:
    assert reply.headers["content-type"].startswith("application/xml"), reply.text
    root = ET.fromstring(reply.content)
    assert root.findtext("RequestId"), reply.text
    return reply.status_code, root.findtext("Code")


@pytest.mark.parametrize("path", PROTECTED)
def test_unsigned_calls_are_refused_with_s3_xml(gateway: RunningGateway, path: str) -> None:
    assert _error(httpx.get(gateway.endpoint_url + path, timeout=30)) == (403, "AccessDenied")


@pytest.mark.parametrize("path", PROTECTED)
def test_wrong_or_unknown_credentials_are_refused(gateway: RunningGateway, path: str) -> None:
    wrong = (gateway.access_key_id, "not-the-secret")
    assert _error(_signed(gateway, path, wrong)) == (403, "SignatureDoesNotMatch")
    assert _error(_signed(gateway, path, ("NOBODY", "x"))) == (403, "InvalidAccessKeyId")


def test_signed_calls_get_typed_answers(gateway: RunningGateway) -> None:
    stats = GatewayStats.model_validate_json(_signed(gateway, "/_hapi/stats").content)
    assert stats.memory_budget.total_bytes > 0
    models = _signed(gateway, "/_hapi/models")
    assert (
        models.status_code == 200 and [ModelSummary.model_validate(m) for m in models.json()] == []
    )
    schema = _signed(gateway, "/_hapi/openapi.json").json()
    assert {"/_hapi/stats", "/_hapi/models", "/_hapi/probe"} <= set(schema["paths"])
    assert "GatewayStats" in schema["components"]["schemas"]
    docs = _signed(gateway, "/_hapi/docs")
    assert docs.status_code == 200 and "/_hapi/openapi.json" in docs.text
    assert "hapi_requests_total" in _signed(gateway, "/metrics").text
    missing = _signed(gateway, "/_hapi/models/nothing-here")
    assert _error(missing) == (404, "NoSuchModel")


def test_curl_aws_sigv4_is_accepted(gateway: RunningGateway) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl is not installed"
    done = subprocess.run(
        [
            *(curl, "-sS", "--aws-sigv4", "aws:amz:us-east-1:s3"),
            *("--user", f"{gateway.access_key_id}:{gateway.secret_access_key}"),
            gateway.endpoint_url + "/_hapi/stats",
        ],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert GatewayStats.model_validate_json(done.stdout).memory_budget.total_bytes > 0


def test_live_and_health_are_open_and_say_only_up_or_down(gateway: RunningGateway) -> None:
    live = httpx.get(gateway.endpoint_url + "/_hapi/live")
    health = httpx.get(gateway.endpoint_url + "/_hapi/health")
    assert (live.status_code, live.json()) == (200, {"status": "alive"})
    assert (health.status_code, health.json()) == (200, {"status": "ok"})


def test_a_request_outside_the_configured_clock_skew_is_refused(gateway: RunningGateway) -> None:
    creds = Credentials(gateway.access_key_id, gateway.secret_access_key)
    for path in ("/_hapi/stats", "/"):  # the control plane and the data plane alike
        url = gateway.endpoint_url + path
        then = datetime.now(UTC) - timedelta(minutes=5)  # within S3's 15, not the 2 set
        headers = sign_request(method="GET", url=url, headers={}, credentials=creds, now=then)
        assert _error(httpx.get(url, headers=headers)) == (403, "RequestTimeTooSkewed")


def test_probe_is_capped_per_call(gateway: RunningGateway) -> None:
    over = _signed(gateway, f"/_hapi/probe?bytes={PROBE_CAP + 1}", KEYS["B"])
    assert _error(over) == (400, "InvalidArgument")
    assert _error(_signed(gateway, "/_hapi/probe?bytes=lots", KEYS["B"])) == (
        400,
        "InvalidArgument",
    )
    at_cap = _signed(gateway, f"/_hapi/probe?bytes={PROBE_CAP}", KEYS["B"])
    assert at_cap.status_code == 200 and len(at_cap.content) == PROBE_CAP


def test_probe_is_metered_per_credential(gateway: RunningGateway) -> None:
    for _ in range(PROBE_PER_MINUTE // PROBE_CAP):
        reply = _signed(gateway, f"/_hapi/probe?bytes={PROBE_CAP}", KEYS["A"])
        assert reply.status_code == 200 and len(reply.content) == PROBE_CAP
    refused = _signed(gateway, f"/_hapi/probe?bytes={PROBE_CAP}", KEYS["A"])
    assert _error(refused) == (503, "SlowDown")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    other = _signed(gateway, "/_hapi/probe?bytes=1024")  # the gateway's own test credential
    assert other.status_code == 200 and len(other.content) == 1024


def test_models_with_the_store_down_is_xml_503(tmp_path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with gateway_process(
        backend_url=dead, backend_key="k", backend_secret="s", log_dir=tmp_path
    ) as gw:
        reply = _signed(gw, "/_hapi/models")
        assert _error(reply) == (503, "ServiceUnavailable")
        assert reply.headers["retry-after"] == "1"
        health = httpx.get(gw.endpoint_url + "/_hapi/health")
        assert (health.status_code, health.json()) == (503, {"status": "degraded"})


def test_public_metrics_opens_metrics_only(store: Any, tmp_path) -> None:
    with store_gateway(
        store,
        tmp_path,
        extra_args=("--public-metrics",),
    ) as gw:
        metrics = httpx.get(gw.endpoint_url + "/metrics")
        assert metrics.status_code == 200 and "hapi_requests_total" in metrics.text
        assert _error(httpx.get(gw.endpoint_url + "/_hapi/stats")) == (403, "AccessDenied")
