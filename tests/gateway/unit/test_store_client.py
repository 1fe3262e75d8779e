"""The gateway's one client for its own calls to the store: signing, identity, paging,
errors and retries, against httpx.MockTransport."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from hapi.gateway import ClientKey, GatewaySettings
from hapi.gateway._errors import BackendError
from hapi.gateway._store import StoreClient
from hapi.protocol import Credentials

SETTINGS = GatewaySettings(
    backend_url="http://store.internal:8333",
    backend_credentials=Credentials("BACKENDKEY", "backend-secret"),
    clients={"CLIENT": ClientKey("client-secret")},
    device="cpu",
)
NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def _store(handler: Callable[[httpx.Request], httpx.Response]) -> StoreClient:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return StoreClient.of(SETTINGS, lambda: client)


def test_requests_are_signed_as_the_identity_they_act_as() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    store = _store(handler)
    asyncio.run(store.request("GET", "data", "a b/../c.jpg"))
    asyncio.run(store.acting_as(None).request("HEAD", "data", "x"))
    asyncio.run(store.acting_as(Credentials("ALICE", "alice-secret")).request("GET", "data", "x"))
    signed, unsigned, alice = seen
    assert "Credential=BACKENDKEY/" in signed.headers["authorization"]
    assert "Credential=ALICE/" in alice.headers["authorization"]
    assert signed.url.raw_path == b"/data/a%20b/%2E%2E/c.jpg"  # dot segments reach the store
    assert "authorization" not in unsigned.headers


def test_a_listing_follows_every_page_and_a_missing_bucket_lists_nothing() -> None:
    pages = {
        None: "<IsTruncated>true</IsTruncated><NextContinuationToken>t1</NextContinuationToken>"
        "<Contents><Key>p/1</Key><Size>1</Size></Contents>",
        "t1": "<IsTruncated>false</IsTruncated><Contents><Key>p/2</Key><Size>2</Size></Contents>",
    }

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/gone":
            return httpx.Response(404, content=b"<Error><Code>NoSuchBucket</Code></Error>")
        assert request.url.params["prefix"] == "p/"
        body = pages[request.url.params.get("continuation-token")]
        return httpx.Response(200, content=f"<ListBucketResult {NS}>{body}</ListBucketResult>")

    store = _store(handler)

    async def listed(bucket: str) -> list[tuple[str, int]]:
        return [(o.key, o.size) async for o in store.list_objects(bucket, "p/")]

    assert asyncio.run(listed("b")) == [("p/1", 1), ("p/2", 2)]
    assert asyncio.run(listed("gone")) == []


def test_a_refused_listing_is_the_stores_own_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            403, content=b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>"
        )

    store = _store(handler)

    async def listed() -> list[str]:
        return [o.key async for o in store.list_objects("b", "")]

    with pytest.raises(BackendError) as caught:
        asyncio.run(listed())
    assert (caught.value.code, caught.value.status, str(caught.value)) == (
        "AccessDenied",
        403,
        "no",
    )


@pytest.mark.parametrize(("method", "attempts"), [("GET", 2), ("PUT", 2), ("POST", 1)])
def test_a_refused_connection_is_retried_once_for_idempotent_methods(
    method: str, attempts: int
) -> None:
    tries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tries.append(request.method)
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(httpx.ConnectError):
        asyncio.run(_store(handler).request(method, "b", "k"))
    assert tries == [method] * attempts


def test_the_health_check_signs_the_service_root() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    asyncio.run(_store(handler).request("GET", ""))
    assert seen[0].url.path == "/" and "authorization" in seen[0].headers
