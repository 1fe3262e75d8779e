"""Unsigned requests in-process: forwarded unsigned, or refused when configured so."""

from __future__ import annotations

import httpx
import pytest
from click.testing import CliRunner

from hapi.gateway import ClientKey, GatewaySettings, _cli, create_app
from hapi.gateway.edge._proxy import without_aws_chunked
from hapi.protocol import Credentials

BACKEND = Credentials("BACKENDKEY", "backend-secret")


def _settings(**changes: object) -> GatewaySettings:
    return GatewaySettings(
        backend_url="http://store.internal:8333",
        backend_credentials=BACKEND,
        clients={"CLIENTKEY": ClientKey("client-secret")},
        **changes,  # type: ignore[arg-type]
    )


async def _send(settings: GatewaySettings, request: httpx.Request) -> tuple[httpx.Response, list]:
    seen: list[httpx.Request] = []

    def backend(sent: httpx.Request) -> httpx.Response:
        seen.append(sent)
        return httpx.Response(200, stream=httpx.ByteStream(b"public"))

    app = create_app(settings, upstream=httpx.AsyncClient(transport=httpx.MockTransport(backend)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
        reply = await client.send(request)
    return reply, seen


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["GET", "OPTIONS"])
async def test_unsigned_request_goes_upstream_unsigned(method):
    request = httpx.Request(
        method,
        "http://gw.test/bucket/key",
        headers={"origin": "https://app.example", "access-control-request-method": "GET"},
    )
    reply, seen = await _send(_settings(), request)
    assert reply.status_code == 200 and reply.content == b"public"
    (sent,) = seen
    assert "authorization" not in sent.headers
    assert BACKEND.access_key_id not in str(sent.headers)
    assert sent.headers["origin"] == "https://app.example"


@pytest.mark.anyio
async def test_anonymous_requests_can_be_refused_at_the_gateway():
    request = httpx.Request("GET", "http://gw.test/bucket/key")
    reply, seen = await _send(_settings(allow_anonymous=False), request)
    assert reply.status_code == 403 and b"<Code>AccessDenied</Code>" in reply.content
    assert seen == []


@pytest.mark.anyio
async def test_partial_presign_query_is_not_anonymous():
    request = httpx.Request("GET", "http://gw.test/bucket/key?X-Amz-Credential=x")
    reply, seen = await _send(_settings(), request)
    assert reply.status_code == 400 and seen == []


def test_no_client_credentials_needs_an_explicit_allow_anonymous():
    env = {
        "HAPI_BACKEND_URL": "http://store:8333",
        "HAPI_BACKEND_ACCESS_KEY_ID": "k",
        "HAPI_BACKEND_SECRET_ACCESS_KEY": "s",
    }
    with pytest.raises(ValueError, match="no client credentials"):
        GatewaySettings.from_env(env)
    assert GatewaySettings.from_env({**env, "HAPI_ALLOW_ANONYMOUS": "1"}).allow_anonymous
    assert GatewaySettings.from_env(env, allow_anonymous=True).client_secrets == {}
    with pytest.raises(ValueError, match="HAPI_ALLOW_ANONYMOUS"):
        GatewaySettings.from_env({**env, "HAPI_ALLOW_ANONYMOUS": "maybe"})
    with pytest.raises(ValueError, match="nothing to serve"):
        GatewaySettings(backend_url="http://s", backend_credentials=BACKEND, allow_anonymous=False)


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [
        ("deflate, gzip", "deflate, gzip"),
        ("aws-chunked", ""),
        ("aws-chunked,gzip", "gzip"),
        ("deflate,  aws-chunked , gzip", "deflate, gzip"),
        ("gzip, aws-chunked", "gzip"),
    ],
)
def test_only_aws_chunked_is_removed_from_content_encoding(encoding, expected):
    assert without_aws_chunked(encoding) == expected


_ENV = {
    "HAPI_BACKEND_URL": "http://store:8333",
    "HAPI_BACKEND_ACCESS_KEY_ID": "k",
    "HAPI_BACKEND_SECRET_ACCESS_KEY": "s",
    "HAPI_ACCESS_KEY_ID": "",
    "HAPI_SECRET_ACCESS_KEY": "",
    "HAPI_CREDENTIALS_FILE": "",
    "HAPI_ALLOW_ANONYMOUS": "",
}


@pytest.mark.parametrize(
    ("arguments", "env", "allowed"),
    [
        (["--allow-anonymous"], {}, True),
        (
            ["--no-allow-anonymous"],
            {"HAPI_ACCESS_KEY_ID": "c", "HAPI_SECRET_ACCESS_KEY": "x"},
            False,
        ),
        ([], {"HAPI_ACCESS_KEY_ID": "c", "HAPI_SECRET_ACCESS_KEY": "x"}, True),
        (
            [],
            {"HAPI_ALLOW_ANONYMOUS": "0", "HAPI_ACCESS_KEY_ID": "c", "HAPI_SECRET_ACCESS_KEY": "x"},
            False,
        ),
    ],
)
def test_serve_flags(monkeypatch, arguments, env, allowed):
    served: list[GatewaySettings] = []
    monkeypatch.setattr(_cli, "listen", lambda host, port: None)  # no real port
    monkeypatch.setattr(
        _cli, "run_gateway", lambda settings, host, port, **_: served.append(settings)
    )
    result = CliRunner().invoke(_cli.serve, arguments, env={**_ENV, **env})
    assert result.exit_code == 0, result.output
    assert served[0].allow_anonymous is allowed


def test_serve_without_client_credentials_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(_cli, "listen", lambda host, port: None)
    monkeypatch.setattr(_cli, "run_gateway", lambda *args, **_: pytest.fail("must not start"))
    result = CliRunner().invoke(_cli.serve, [], env=_ENV)
    assert result.exit_code != 0
    assert "no client credentials" in result.output and "--allow-anonymous" in result.output
