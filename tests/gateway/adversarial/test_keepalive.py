"""A rejected request leaves its kept-alive connection usable, or closes it.

A response sent before the request body is read leaves that body on the connection;
unless the gateway drains it or closes the connection, the next request is parsed from it.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import pytest

from tests.gateway.adversarial._support import connection, encode_request, read_reply
from tests.support import signed_headers


def _forged_put(gateway, bucket: str, size: int, *, expect: bool = False) -> bytes:
    path = f"/{bucket}/forged"
    extra = {"content-length": str(size)}
    if expect:
        extra["expect"] = "100-continue"
    headers = signed_headers(gateway, "PUT", path, headers=extra)
    headers["authorization"] = headers["authorization"][:-8] + "00000000"
    return encode_request("PUT", path, headers)


def _get(gateway, bucket: str) -> bytes:
    path = f"/{bucket}?list-type=2"
    return encode_request("GET", path, signed_headers(gateway, "GET", path))


@pytest.mark.parametrize("size", [1, 1000, 60_000])
def test_connection_serves_the_next_request_after_a_rejected_put(gateway, bucket, size):
    with connection(gateway) as sock:
        sock.sendall(_forged_put(gateway, bucket, size) + os.urandom(size))
        first = read_reply(sock)
        assert first.status == 403
        assert ET.fromstring(first.body).findtext("Code") == "SignatureDoesNotMatch"
        sock.sendall(_get(gateway, bucket))
        second = read_reply(sock)
        assert second.status == 200, second
        assert b"ListBucketResult" in second.body


def test_large_unread_body_closes_the_connection(gateway, bucket):
    size = 8 * 1024 * 1024
    with connection(gateway) as sock:
        sock.sendall(_forged_put(gateway, bucket, size) + os.urandom(256 * 1024))
        first = read_reply(sock)
        assert first.status == 403
        assert first.headers.get("connection") == "close"


def test_expect_continue_rejected_put_keeps_the_connection_usable(gateway, bucket):
    """The client waits for ``100 Continue``; a body it never sends must not be awaited."""
    with connection(gateway) as sock:
        sock.sendall(_forged_put(gateway, bucket, 1000, expect=True))
        first = read_reply(sock)
        if first.status == 100:  # the gateway asked for the body: send it
            sock.sendall(os.urandom(1000))
            first = read_reply(sock)
        assert first.status == 403
        if first.headers.get("connection") == "close":
            assert sock.recv(1) == b""
            return
        sock.sendall(_get(gateway, bucket))
        assert read_reply(sock).status == 200
