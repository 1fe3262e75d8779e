"""Co-location: which endpoints share this machine's cores."""

from __future__ import annotations

import socket

import pytest

from hapi.sdk.client._host import same_host


@pytest.mark.parametrize(
    "endpoint",
    ["http://127.0.0.1:8080", "http://localhost:9000", "http://[::1]:8080", "http://127.3.4.5"],
)
def test_loopback_endpoints_are_this_machine(endpoint: str) -> None:
    assert same_host(endpoint)


def test_this_hosts_own_name_is_this_machine_when_it_resolves() -> None:
    try:
        resolves = bool(socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        resolves = False
    assert same_host(f"http://{socket.gethostname()}:8080") == resolves


@pytest.mark.parametrize(
    "endpoint", ["http://192.0.2.10:8080", "http://no-such-host.invalid:8080", "not a url"]
)
def test_other_or_unresolvable_hosts_are_remote(endpoint: str) -> None:
    assert not same_host(endpoint)
