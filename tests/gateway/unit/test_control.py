"""The control plane in-process: the probe meter, public switches, unknown routes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials

from hapi.gateway import ClientKey, GatewaySettings, ProbeMeter, S3Error, create_app
from hapi.protocol import Credentials
from tests.gateway.support import (
    CLIENT,
    GATEWAY,
    ManualClock,
    MemoryRegistry,
    client_signed,
    memory_store,
)


def test_meter_allows_a_minutes_bytes_then_refills_at_its_rate() -> None:
    clock = ManualClock()
    meter = ProbeMeter(600, clock=clock)  # 10 bytes per second
    meter.take("a", 600)
    with pytest.raises(S3Error) as refused:
        meter.take("a", 50)
    assert (refused.value.code, refused.value.status, refused.value.retry_after) == (
        "SlowDown",
        503,
        5,
    )
    meter.take("b", 600)  # another credential has its own allowance
    clock.now = 5.0
    meter.take("a", 50)
    with pytest.raises(S3Error):
        meter.take("a", 1)
    clock.now = 1000.0
    meter.take("a", 600)  # refilled, never beyond one minute's worth
    with pytest.raises(S3Error):
        meter.take("a", 1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _app(**changes: object) -> object:
    settings = GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
        clients={CLIENT[0]: ClientKey(CLIENT[1])},
        device="cpu",
    ).with_changes(**changes)
    return create_app(
        settings,
        upstream=httpx.AsyncClient(transport=httpx.MockTransport(memory_store)),
        registry=MemoryRegistry(),
    )


async def _client(app: object) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        LifespanManager(app) as manager,  # type: ignore[arg-type]
        httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app)) as http,
    ):
        yield http


@pytest.fixture
async def public_control() -> AsyncIterator[httpx.AsyncClient]:
    async for http in _client(_app(public_control=True)):
        yield http


@pytest.fixture
async def closed() -> AsyncIterator[httpx.AsyncClient]:
    async for http in _client(_app(max_probe_bytes=1000, probe_bytes_per_minute=1500)):
        yield http


def _code(reply: httpx.Response) -> str | None:
    return ET.fromstring(reply.content).findtext("Code")


@pytest.mark.anyio
async def test_public_control_opens_hapi_but_not_metrics(public_control) -> None:
    assert (await public_control.get(GATEWAY + "/_hapi/stats")).status_code == 200
    assert (await public_control.get(GATEWAY + "/_hapi/models")).json() == []
    assert (await public_control.get(GATEWAY + "/_hapi/openapi.json")).status_code == 200
    metrics = await public_control.get(GATEWAY + "/metrics")
    assert (metrics.status_code, _code(metrics)) == (403, "AccessDenied")


@pytest.mark.anyio
async def test_probe_cap_and_meter_in_process(closed) -> None:
    async def probe(size: int) -> httpx.Response:
        url = f"{GATEWAY}/_hapi/probe?bytes={size}"
        return await closed.get(url, headers=client_signed("GET", url))

    over = await probe(1001)
    assert (over.status_code, _code(over)) == (400, "InvalidArgument")
    first = await probe(1000)
    assert first.status_code == 200 and first.content == bytes(1000)
    refused = await probe(1000)
    assert (refused.status_code, _code(refused)) == (503, "SlowDown")
    assert int(refused.headers["retry-after"]) >= 1


@pytest.mark.anyio
async def test_unknown_control_routes_are_s3_xml(closed) -> None:
    url = GATEWAY + "/_hapi/nothing"
    missing = await closed.get(url, headers=client_signed("GET", url))
    assert (missing.status_code, _code(missing)) == (404, "NotFound")
    url = GATEWAY + "/_hapi/stats"
    signed = AWSRequest(
        method="DELETE", url=url, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}
    )
    S3SigV4Auth(BotoCredentials(*CLIENT), "s3", "us-east-1").add_auth(signed)
    wrong = await closed.delete(url, headers=dict(signed.headers.items()))
    assert (wrong.status_code, _code(wrong)) == (405, "MethodNotAllowed")
