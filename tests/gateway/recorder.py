"""A reverse proxy that records every request a gateway sends its store.

Put it between a gateway and the real store (the gateway's backend URL is the recorder's)
to count what the gateway asks of the store: the method and path of each request, in the
order they arrived. Requests are forwarded unchanged (the Host header too, which the
gateway's signature covers), one upstream connection per client connection.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass(frozen=True)
class Recorded:
    """One request as the store received it."""

    method: str
    path: str  # without the query
    query: str


class Recorder:
    """The requests seen so far (thread-safe)."""

    def __init__(self, upstream: str) -> None:
        where = urlsplit(upstream)
        self.upstream = (where.hostname or "127.0.0.1", where.port or 80)
        self.url = ""
        self._lock = threading.Lock()
        self._seen: list[Recorded] = []

    def add(self, method: str, target: str) -> None:
        path, _, query = target.partition("?")
        with self._lock:
            self._seen.append(Recorded(method, path, query))

    def since(self, mark: int) -> list[Recorded]:
        """The requests after the first ``mark`` (see :meth:`mark`)."""
        with self._lock:
            return self._seen[mark:]

    def mark(self) -> int:
        with self._lock:
            return len(self._seen)


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        upstream: http.client.HTTPConnection | None = None

        def log_message(self, format: str, *args: object) -> None:
            return  # quiet: the test reads the record, not a log

        def _relay(self) -> None:
            recorder.add(self.command, self.path)
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else None
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(*recorder.upstream, timeout=60)
            self.upstream.putrequest(
                self.command, self.path, skip_host=True, skip_accept_encoding=True
            )
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    self.upstream.putheader(name, value)
            self.upstream.endheaders(body)
            reply = self.upstream.getresponse()
            content = reply.read()
            self.send_response_only(reply.status, reply.reason)
            for name, value in reply.getheaders():
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            declared = reply.getheader("content-length")
            if self.command == "HEAD":
                if declared is not None:
                    self.send_header("Content-Length", declared)
            else:
                self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(content)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay

        def finish(self) -> None:
            super().finish()
            if self.upstream is not None:
                self.upstream.close()

    return Handler


@contextmanager
def recording(upstream: str) -> Iterator[Recorder]:
    """A recorder in front of ``upstream`` (a store's URL) on a free loopback port."""
    recorder = Recorder(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorder))
    server.daemon_threads = True
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="store-recorder", daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
