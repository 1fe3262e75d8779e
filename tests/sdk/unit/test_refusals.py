"""What the SDK makes of a feature request answered without features: only a plain S3 store
(a reply without the gateway's mark that is neither a refusal nor a server error) is a
reason to compute locally; a refusal or a server error is raised at its batch, whoever
sent it, and pushdown stays on.

A loopback HTTP server stands in for whatever answers (a plain store, a gateway, a proxy in
front of one); the SDK's real boto3 client talks to it.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hapi import sdk
from hapi.sdk.client._endpoints import ATTEMPTS
from hapi.sdk.datasets._compute import Engine, Spec
from tests.planner.synthetic import manifest

MARK = ("x-hapi-request-id", "4F1C0FFEE00000000000")  # a gateway stamps every reply with it
AT_ONCE = ("retry-after", "0")  # server errors are retried: without waiting, here
Headers = Sequence[tuple[str, str]]


@dataclass
class _Endpoint:
    url: str
    requests: list[str]  # "METHOD /path?query", as they came

    def client(self) -> Any:
        return sdk.client(
            self.url, aws_access_key_id="K", aws_secret_access_key="s", region_name="us-east-1"
        )


@contextmanager
def _answering(status: int, code: str, headers: Headers) -> Iterator[_Endpoint]:
    """An endpoint on loopback that answers every request with one reply: S3 XML naming
    ``code``, or a body that is no S3 error (a proxy's page, the object itself)."""
    requests: list[str] = []
    body = (
        (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>no'
            "</Message><Resource>/data</Resource><RequestId>S</RequestId></Error>"
        ).encode()
        if code
        else b"<html>not S3</html>"
    )

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            requests.append(f"{self.command} {self.path}")
            self.send_response(status)
            for name, value in (*headers, ("content-length", str(len(body)))):
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass  # not on the test's stderr

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield _Endpoint(f"http://127.0.0.1:{server.server_address[1]}", requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


REFUSALS = [
    pytest.param(403, "SignatureDoesNotMatch", [MARK], id="gateway-wrong-secret"),
    pytest.param(403, "InvalidAccessKeyId", [MARK], id="gateway-unknown-key"),
    pytest.param(403, "AccessDenied", [MARK], id="gateway-access-denied"),
    pytest.param(403, "SignatureDoesNotMatch", [], id="store-wrong-secret"),
    pytest.param(401, "", [], id="proxy-unauthorized"),
]
SERVER_ERRORS = [
    pytest.param(500, "InternalError", [MARK, AT_ONCE], id="gateway-internal-error"),
    pytest.param(503, "SlowDown", [MARK, AT_ONCE], id="gateway-slow-down"),
    pytest.param(502, "", [AT_ONCE], id="proxy-bad-gateway"),
    pytest.param(500, "InternalError", [AT_ONCE], id="store-internal-error"),
]
PLAIN_STORE = [
    pytest.param(405, "MethodNotAllowed", [], id="method-not-allowed"),  # SeaweedFS's answer
    pytest.param(200, "", [], id="the-object"),
]


def _batch(endpoint: _Endpoint) -> sdk.Features:
    features: sdk.Features = endpoint.client().get_features_batch(
        "data", ["a.jpg"], model="m", split=1
    )
    return features


@pytest.mark.parametrize(("status", "code", "headers"), REFUSALS)
def test_a_refusal_is_an_access_error(status: int, code: str, headers: Headers) -> None:
    with _answering(status, code, headers) as endpoint, pytest.raises(sdk.AccessDenied) as refused:
        _batch(endpoint)
    error = refused.value
    assert (error.status, error.code) == (status, code or f"HTTP{status}")
    assert error.bucket == "data" and error.key == "a.jpg"
    assert error.request_id == (MARK[1] if MARK in headers else "")
    assert len(endpoint.requests) == 1  # not retried either


@pytest.mark.parametrize(("status", "code", "headers"), SERVER_ERRORS)
def test_a_server_error_is_raised_after_the_retries(
    status: int, code: str, headers: Headers
) -> None:
    with _answering(status, code, headers) as endpoint, pytest.raises(sdk.RequestError) as failed:
        _batch(endpoint)
    assert (failed.value.status, failed.value.code) == (status, code or f"HTTP{status}")
    assert len(endpoint.requests) == ATTEMPTS  # every attempt, then the error


@pytest.mark.parametrize(("status", "code", "headers"), PLAIN_STORE)
def test_a_plain_store_serves_no_pushdown(status: int, code: str, headers: Headers) -> None:
    with (
        _answering(status, code, headers) as endpoint,
        pytest.raises(sdk.PushdownUnavailable, match=f"HTTP {status}"),
    ):
        _batch(endpoint)


@pytest.mark.parametrize(("status", "code", "headers"), [*REFUSALS, *SERVER_ERRORS])
def test_an_engine_raises_at_the_batch_and_keeps_pushdown_on(
    status: int, code: str, headers: Headers
) -> None:
    expected = sdk.AccessDenied if status in (401, 403) else sdk.RequestError
    with _answering(status, code, headers) as endpoint:
        spec = Spec(
            endpoints=(endpoint.url,),
            registry_bucket="models",
            manifest=manifest(),
            freeze=3,
            split=2,
        )
        engine = Engine(spec, s3=endpoint.client())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):  # and again: nothing was switched off
                with pytest.raises(expected) as failed:
                    engine.fetch("data", ["a.jpg", "b.jpg"])
                assert failed.value.status == status
    assert engine.pushdown and engine.split == 2
    assert not [w for w in caught if issubclass(w.category, sdk.FallbackWarning)]
    assert {request.split("?")[0] for request in endpoint.requests} == {"POST /data"}
