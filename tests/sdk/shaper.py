"""A bandwidth-limited link on loopback, in user space: a TCP relay that carries what the
server sends at a fixed rate and counts the bytes both ways (``tc`` needs root; this does
not). It relays real connections to a real server; nothing is answered by the relay."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType

_CHUNK = 8 * 1024


class _Pace:
    """One link's clock: a chunk leaves once the chunks before it have."""

    def __init__(self, rate_bps: float) -> None:
        self._bytes_per_s = rate_bps / 8
        self._free_at = time.monotonic()
        self._lock = threading.Lock()

    def wait(self, size: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._free_at = max(self._free_at, now) + size / self._bytes_per_s
            done = self._free_at
        time.sleep(max(0.0, done - time.monotonic()))


class Shaper:
    """Relays ``127.0.0.1:<port>`` to ``target``; the server's bytes go at ``rate_bps``.

    Args:
        target: The server's ``(host, port)``.
        rate_bps: The downstream link's bits per second, shared by every connection.
    """

    def __init__(self, target: tuple[str, int], rate_bps: float) -> None:
        self._target = target
        self._pace = _Pace(rate_bps)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.down_bytes = 0
        self.up_bytes = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> Shaper:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._target)
            # A link delays nothing it was given: without this, the relay's small writes
            # waited for the peer's delayed ACK (40 ms stalls in responses of a few chunks).
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, down: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(_CHUNK):
                if down:
                    self._pace.wait(len(chunk))
                with self._lock:
                    if down:
                        self.down_bytes += len(chunk)
                    else:
                        self.up_bytes += len(chunk)
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
