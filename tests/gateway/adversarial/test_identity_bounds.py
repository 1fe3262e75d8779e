"""No identity starves another, and none sees another's figures.

A real store and a gateway with two tenant keys (each acting as its own store identity) and
an admin key. One tenant holds upstream connections with slow reads until it reaches its
bound; its next request is refused with 503 SlowDown at once, while the other tenant is
served. ``/metrics`` shows per-identity series to admins, a client its own, and a public
page none.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hapi.gateway import sign_request
from hapi.protocol import Credentials
from tests.conftest import TENANTS
from tests.gateway.adversarial._reading import signed_v4
from tests.gateway.adversarial._support import address
from tests.support import RunningGateway, empty_bucket, store_gateway, wait_for

BOUND = 2
BIG = 48 * 1024 * 1024  # more than the socket buffers hold: an unread GET stays open
ADMIN = Credentials("BOUNDSADMIN" + secrets.token_hex(4).upper(), secrets.token_hex(20))


@pytest.fixture(scope="module")
def bounded(store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    alice, bob = TENANTS["alice"], TENANTS["bob"]
    keys = {
        alice.access_key_id: {"secret": alice.secret_access_key, "upstream": "self"},
        bob.access_key_id: {"secret": bob.secret_access_key, "upstream": "self"},
        ADMIN.access_key_id: {"secret": ADMIN.secret_access_key, "role": "admin"},
    }
    env = {
        "HAPI_IDENTITY_UPSTREAM_REQUESTS": str(BOUND),
        "HAPI_IDENTITY_REQUESTS_PER_S": "0.001",  # a second pushdown request is refused
    }
    with store_gateway(store, tmp_path_factory.mktemp("bounds"), keys=keys, env=env) as running:
        yield running


@pytest.fixture(scope="module")
def buckets(store: Any, backend_s3: Any) -> Iterator[dict[str, str]]:
    """A bucket of alice's with one big object, and one of bob's with a small one."""
    tag = secrets.token_hex(4)
    names = {"alice": f"alice-{tag}", "bob": f"bob-{tag}"}
    for name in names.values():
        backend_s3.create_bucket(Bucket=name)
    backend_s3.put_object(Bucket=names["alice"], Key="big", Body=b"\0" * BIG)
    backend_s3.put_object(Bucket=names["bob"], Key="small", Body=b"bob")
    yield names
    for name in names.values():
        empty_bucket(backend_s3, name)
        backend_s3.delete_bucket(Bucket=name)


def _get(gw: RunningGateway, creds: Credentials, path: str) -> httpx.Response:
    url = gw.endpoint_url + path
    headers = sign_request(method="GET", url=url, headers={}, credentials=creds)
    return httpx.get(url, headers=headers, timeout=60)


@contextlib.contextmanager
def _unread(gw: RunningGateway, creds: Credentials, path: str, count: int) -> Iterator[None]:
    """``count`` GETs of ``path`` whose bodies nobody reads: each holds its upstream request."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.create_connection(address(gw.endpoint_url), timeout=30)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw = signed_v4(gw.endpoint_url, creds, "GET", path)
            sock.sendall(raw.encode())
            socks.append(sock)
        for sock in socks:  # each has its answer's head: its upstream request is open
            assert sock.recv(12).startswith(b"HTTP/1.1 200")
        yield
    finally:
        for sock in socks:
            sock.close()


def test_one_identity_at_its_bound_is_refused_while_another_is_served(bounded, buckets):
    alice, bob = TENANTS["alice"], TENANTS["bob"]
    big = f"/{buckets['alice']}/big"
    with _unread(bounded, alice, big, BOUND):
        refused = _get(bounded, alice, big)
        assert refused.status_code == 503, refused.text
        assert "<Code>SlowDown</Code>" in refused.text and refused.headers["retry-after"] == "1"
        assert "HAPI_IDENTITY_UPSTREAM_REQUESTS" in refused.text
        served = _get(bounded, bob, f"/{buckets['bob']}/small")
        assert served.status_code == 200 and served.content == b"bob"
    # The slow reads gone, alice is served again.
    wait_for(lambda: _get(bounded, alice, big).status_code == 200, "alice served again")


def _metrics(gw: RunningGateway, creds: Credentials) -> str:
    reply = _get(gw, creds, "/metrics")
    assert reply.status_code == 200, reply.text
    return reply.text


def _identities(page: str) -> set[str]:
    return set(re.findall(r'identity="([^"]+)"', page))


def test_metrics_show_a_client_its_own_identity_and_an_admin_every_one(bounded, buckets):
    alice, bob = TENANTS["alice"], TENANTS["bob"]
    for creds in (alice, bob):  # the second of each is over the rate: a series per identity
        for _ in range(2):
            _get(bounded, creds, f"/{buckets['bob']}/small?hapi-model=nosuch&hapi-split=1")
    assert {alice.access_key_id, bob.access_key_id} <= _identities(_metrics(bounded, ADMIN))
    assert _identities(_metrics(bounded, alice)) == {alice.access_key_id}
    assert _identities(_metrics(bounded, bob)) == {bob.access_key_id}
    assert "hapi_requests_total" in _metrics(bounded, alice)  # the gateway's own figures


def test_a_public_metrics_page_shows_no_identity(store, tmp_path):
    with store_gateway(store, tmp_path, env={"HAPI_PUBLIC_METRICS": "true"}) as gw:
        creds = Credentials(gw.access_key_id, gw.secret_access_key)
        for _ in range(3):
            _get(gw, creds, "/nosuchbucket/k?hapi-model=nosuch&hapi-split=1")
        page = httpx.get(gw.endpoint_url + "/metrics", timeout=30)
        assert page.status_code == 200 and "hapi_requests_total" in page.text
        assert not _identities(page.text), page.text
