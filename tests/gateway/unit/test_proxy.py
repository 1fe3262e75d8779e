"""The proxy in-process, with the upstream seam replaced by httpx.MockTransport."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import NoReturn

import httpx
import pytest

from hapi.gateway import ClientKey, GatewaySettings, create_app
from hapi.gateway._app import new_upstream_client
from hapi.gateway._identities import Caller, caller_of
from hapi.gateway._operation import object_path, parse_operation
from hapi.gateway.edge._proxy import Proxy
from hapi.gateway.edge._sigv4 import verify_request
from hapi.protocol import Credentials
from tests.gateway.support import CLIENT, client_signed

BACKEND = Credentials("BACKENDKEY", "backend-secret")


def _settings() -> GatewaySettings:
    return GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=BACKEND,
        clients={CLIENT[0]: ClientKey(CLIENT[1])},
    )


@pytest.mark.anyio
async def test_request_is_resigned_with_backend_credentials():
    seen: list[httpx.Request] = []

    def backend(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        # A stream (not content=) so the response is not pre-read, as from a real transport.
        return httpx.Response(200, stream=httpx.ByteStream(b"stored"), headers={"etag": '"abc"'})

    upstream = httpx.AsyncClient(transport=httpx.MockTransport(backend))
    app = create_app(_settings(), upstream=upstream)
    url = "http://gw.test/bucket/key%20with%20space?tagging"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
        reply = await client.put(url, content=b"data", headers=client_signed("PUT", url, b"data"))
    assert reply.status_code == 200 and reply.headers["etag"] == '"abc"'
    (sent,) = seen
    assert (
        sent.url.host == "store.internal"
        and sent.url.raw_path == b"/bucket/key%20with%20space?tagging="
    )
    assert CLIENT[0] not in sent.headers["authorization"]
    assert sent.headers["authorization"].startswith(
        f"AWS4-HMAC-SHA256 Credential={BACKEND.access_key_id}/"
    )
    assert sent.content == b"data"
    verified = verify_request(
        method="PUT",
        raw_path=sent.url.raw_path.split(b"?")[0].decode(),
        raw_query=sent.url.query.decode(),
        headers=[(k.lower(), v) for k, v in sent.headers.items()],
        secrets={BACKEND.access_key_id: BACKEND.secret_access_key},
    )
    assert verified.access_key_id == BACKEND.access_key_id


@pytest.mark.anyio
async def test_unreachable_backend_becomes_s3_xml():
    def backend(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    app = create_app(
        _settings(), upstream=httpx.AsyncClient(transport=httpx.MockTransport(backend))
    )
    url = "http://gw.test/bucket/key"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
        reply = await client.get(url, headers=client_signed("GET", url))
    assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    error = ET.fromstring(reply.content)
    assert error.findtext("Code") == "ServiceUnavailable"
    assert error.findtext("Resource") == "/bucket/key"
    assert error.findtext("RequestId") == reply.headers["x-hapi-request-id"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_upstream_client_adds_nothing_and_keeps_no_cookies():
    seen: list[httpx.Request] = []

    def backend(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200, stream=httpx.ByteStream(b"x"), headers={"set-cookie": "session=alice"}
        )

    settings = _settings()
    upstream = new_upstream_client(settings, transport=httpx.MockTransport(backend))
    app = create_app(settings, upstream=upstream)
    url = "http://gw.test/bucket/key"
    no_cookies = CookieJar(
        policy=DefaultCookiePolicy(allowed_domains=[])
    )  # a client that keeps none
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), cookies=no_cookies
    ) as client:
        for name in list(client.headers):  # this client sends none of httpx's defaults either
            del client.headers[name]
        for _ in range(2):
            headers = {k: v for k, v in client_signed("GET", url).items()}
            reply = await client.get(url, headers=headers)
            assert reply.status_code == 200
    first, second = seen
    for name in ("accept-encoding", "user-agent", "accept"):
        assert name not in first.headers or first.headers[name] == "", name
    assert "cookie" not in second.headers  # the first user's cookie is not replayed


@pytest.mark.parametrize(
    ("raw_path", "host", "bucket", "key", "client_path"),
    [
        ("/data/photo.jpg", "127.0.0.1:8080", "data", "photo.jpg", "/data/photo.jpg"),
        ("/data/photo.jpg", "dat.localhost:8080", "dat", "data/photo.jpg", "/dat/data/photo.jpg"),
        ("/", "data.localhost", "data", "", "/data/"),
        ("/", "127.0.0.1", "", "", "/"),
    ],
)
def test_target_keeps_the_path_the_client_signed(raw_path, host, bucket, key, client_path):
    operation = parse_operation("GET", raw_path, "", [("host", host)], ("localhost",))
    assert (operation.bucket, operation.key, operation.client_path) == (bucket, key, client_path)


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("a/../b", "/b/a/%2E%2E/b"),
        ("./x", "/b/%2E/x"),
        ("a//b", "/b/a//b"),
        ("a.b/..c", "/b/a.b/..c"),
        ("..", "/b/%2E%2E"),
    ],
)
def test_dot_segments_survive_url_normalisation(key, path):
    assert object_path("b", key) == path
    assert httpx.URL("http://store" + path).raw_path.decode() == path


async def _never_sent(outgoing: object) -> NoReturn:
    raise AssertionError("the framing test sends nothing")


_FRAMINGS = [(method, "none") for method in ("GET", "HEAD", "DELETE", "PUT", "POST")] + [
    (method, body) for method in ("PUT", "POST") for body in ("empty", "whole", "streamed")
]


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "anonymous"])
@pytest.mark.parametrize(("method", "body"), _FRAMINGS)
def test_the_upstream_request_is_framed_as_httpx_would_frame_it(method, body, signed):
    """The pass-through encodes its upstream request itself (no httpx model adds headers on
    the way): the Host header and the body's framing are those httpx would have added."""
    settings = _settings()
    query = "uploads" if method == "POST" else ""
    operation = parse_operation(method, "/bucket/key", query, [("host", "gw.test")], ())
    caller = (
        caller_of(CLIENT[0], settings.clients, settings.backend_credentials)
        if signed
        else Caller.anonymous()
    )
    data = b"x" * 1000

    async def chunks():
        yield data

    length = {"none": None, "empty": 0, "whole": len(data), "streamed": None}[body]
    content = chunks() if body in ("whole", "streamed") else None
    proxy = Proxy(settings, lambda: None, send=_never_sent)
    outgoing = proxy._upstream_request(operation, caller, length, content)
    sent = httpx.Headers(list(outgoing.headers))
    httpx_would = httpx.Request(
        method,
        outgoing.url(),
        content={"none": None, "empty": b"", "whole": data, "streamed": chunks()}[body],
    ).headers
    assert sent["host"] == "store.internal:8333" == httpx_would["host"]
    for framing in ("content-length", "transfer-encoding"):
        assert sent.get(framing) == httpx_would.get(framing), framing
    assert ("authorization" in sent) is signed
