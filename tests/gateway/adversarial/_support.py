"""Helpers for the adversarial suite: raw HTTP over sockets."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from tests.support import RunningGateway


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def address(endpoint_url: str) -> tuple[str, int]:
    parts = urlsplit(endpoint_url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def encode_request(method: str, path: str, headers: Mapping[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body and not any(name.lower() == "content-length" for name in headers):
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def read_reply(sock: socket.socket, *, head_request: bool = False) -> Reply:
    """One HTTP/1.1 response from ``sock`` (Content-Length framed, as the gateway sends)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError(f"connection closed before a response head: {buf[:200]!r}")
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head_request else int(headers.get("content-length", "0"))
    while len(rest) < length:
        data = sock.recv(65536)
        if not data:
            break
        rest += data
    return Reply(int(status_line.split()[1]), headers, rest[:length])


def exchange(gw: RunningGateway, request: bytes, *, timeout: float = 30) -> Reply:
    """Send one raw request to the gateway on a new connection; read the response."""
    return exchange_at(gw.endpoint_url, request, timeout=timeout)


def exchange_at(endpoint_url: str, request: bytes, *, timeout: float = 30) -> Reply:
    """Send one raw request to ``endpoint_url`` on a new connection; read the response."""
    with socket.create_connection(address(endpoint_url), timeout=timeout) as sock:
        sock.sendall(request)
        return read_reply(sock)


def send_and_vanish(gw: RunningGateway, data: bytes) -> None:
    """Send ``data`` and close the connection without reading anything."""
    with socket.create_connection(address(gw.endpoint_url), timeout=10) as sock:
        sock.sendall(data)


@contextlib.contextmanager
def connection(gw: RunningGateway, timeout: float = 30) -> Iterator[socket.socket]:
    with socket.create_connection(address(gw.endpoint_url), timeout=timeout) as sock:
        yield sock
