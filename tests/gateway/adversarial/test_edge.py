"""The HTTP edge has limits: head size, head-read time, keep-alive, connections.

Runs against ``edge_gateway`` (16 KiB heads, 1 s to send a head, 2 s keep-alive, 8
connections), so exhausting them leaves the session's gateway alone.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
import xml.etree.ElementTree as ET

from tests.gateway.adversarial._support import address, connection, encode_request, read_reply
from tests.support import RunningGateway, signed_headers

MiB = 1024 * 1024


def _list(gw: RunningGateway, bucket: str, extra: dict[str, str] | None = None) -> bytes:
    path = f"/{bucket}?list-type=2"
    return encode_request("GET", path, signed_headers(gw, "GET", path, headers=extra))


def _healthy(gw: RunningGateway, bucket: str) -> None:
    with connection(gw) as sock:
        sock.sendall(_list(gw, bucket))
        assert read_reply(sock).status == 200


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_huge_head_is_refused_without_buffering_it(edge_gateway, bucket):
    edge_gateway.reset_peak_rss()
    before = edge_gateway.rss_bytes()
    status = None
    with connection(edge_gateway) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: ")
            filler = b"a" * MiB
            for _ in range(64):
                sock.sendall(filler)
            sock.sendall(b"\r\n\r\n")
        with contextlib.suppress(OSError, ConnectionError):
            reply = read_reply(sock)
            status = reply.status
            assert ET.fromstring(reply.body).findtext("Code") == "RequestHeaderSectionTooLarge"
            # the same request-id scheme as every other answer (20 upper-case hex digits)
            assert re.fullmatch(
                r"[0-9A-F]{20}", ET.fromstring(reply.body).findtext("RequestId") or ""
            )
    assert status in (431, None)  # None: the connection was closed before we could read
    assert edge_gateway.peak_rss_bytes() - before < 32 * MiB
    _healthy(edge_gateway, bucket)


def test_head_within_the_limit_is_served(edge_gateway, bucket):
    with connection(edge_gateway) as sock:
        sock.sendall(_list(edge_gateway, bucket, {"x-amz-meta-pad": "p" * 12_000}))
        assert read_reply(sock).status == 200


def test_body_in_the_same_read_as_the_head_is_not_counted_as_head(edge_gateway, bucket):
    path = f"/{bucket}/one-read"
    body = b"b" * MiB
    headers = signed_headers(edge_gateway, "PUT", path, headers={"content-length": str(MiB)})
    with connection(edge_gateway) as sock:
        sock.sendall(encode_request("PUT", path, headers) + body)
        assert read_reply(sock).status == 200


def test_half_sent_heads_are_reaped(edge_gateway, bucket):
    sockets = [socket.create_connection(address(edge_gateway.endpoint_url)) for _ in range(50)]
    try:
        for sock in sockets:
            sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ")
            sock.settimeout(0.05)
        deadline = time.monotonic() + 20
        open_ = list(sockets)
        while open_ and time.monotonic() < deadline:
            open_ = [sock for sock in open_ if not _closed_by_peer(sock)]
        assert not open_, f"{len(open_)} of 50 half-sent heads still held"
    finally:
        for sock in sockets:
            sock.close()
    _healthy(edge_gateway, bucket)


def test_idle_kept_alive_connection_is_closed(edge_gateway, bucket):
    with connection(edge_gateway) as sock:
        sock.sendall(_list(edge_gateway, bucket))
        assert read_reply(sock).status == 200
        sock.settimeout(0.2)
        deadline = time.monotonic() + 15
        while not _closed_by_peer(sock):
            assert time.monotonic() < deadline, "an idle connection was kept open"


def test_connections_beyond_the_limit_get_slow_down(edge_gateway, bucket):
    statuses, codes = [], set()
    with contextlib.ExitStack() as stack:
        for _ in range(12):
            sock = stack.enter_context(connection(edge_gateway))
            sock.sendall(_list(edge_gateway, bucket))
            reply = read_reply(sock)
            statuses.append(reply.status)
            if reply.status == 503:
                root = ET.fromstring(reply.body)
                codes.add(root.findtext("Code"))
                assert root.findtext("RequestId")
    # Up to 8 served (fewer if a connection of an earlier test is still being torn down),
    # then every further one refused while they are all held.
    assert 503 in statuses, statuses
    served = statuses.index(503)
    assert 1 <= served <= 8, statuses
    assert set(statuses[:served]) == {200} and set(statuses[served:]) == {503}, statuses
    assert codes == {"SlowDown"}
    _healthy(edge_gateway, bucket)


def test_a_later_half_sent_head_on_a_kept_alive_connection_is_reaped(edge_gateway, bucket):
    # The connection's one head timer, armed when it opened, is still pending when the
    # second head begins: it must measure that head from its own start, not close the
    # connection on the first head's clock (0.3 s into the second head here). The upper
    # bound holds either way: the keep-alive deadline also ends a stalled connection.
    with connection(edge_gateway) as sock:
        sock.sendall(_list(edge_gateway, bucket))
        assert read_reply(sock).status == 200
        time.sleep(0.7)  # within the 2 s keep-alive, most of the way to the first deadline
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ")
        sock.settimeout(0.6)
        assert not _closed_by_peer(sock), "closed before the second head's own second was up"
        sock.settimeout(0.2)
        deadline = time.monotonic() + 20
        while not _closed_by_peer(sock):
            assert time.monotonic() < deadline, "a half-sent second head was held"
    _healthy(edge_gateway, bucket)
