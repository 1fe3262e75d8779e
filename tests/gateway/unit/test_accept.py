"""The gateway's event loop accepts every waiting connection at each wake-up.

uvloop alone accepts one per turn of the loop: a burst of connections (which the clients
already see as open, and send their requests on) waits turn after turn in the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import uvloop

from hapi.gateway.edge._accept import AcceptingServer, EdgeLoop, new_event_loop

BURST = 50
T = TypeVar("T")


class _Counting(asyncio.Protocol):
    made: list[asyncio.BaseTransport]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(transport)


def _listener(backlog: int = 512) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    return sock


@contextlib.contextmanager
def _clients(address: tuple[str, int], count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections the kernel has completed (in the accept queue until taken)."""
    clients = [socket.create_connection(address) for _ in range(count)]
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


def _on_edge_loop(
    coroutine: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop | None = None
) -> T:
    """Run ``coroutine`` on a new :class:`EdgeLoop` (or on ``loop``), then close the loop."""
    loop = loop or new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


async def _accepted_per_turn(listener: socket.socket, turns: int) -> list[int]:
    loop = asyncio.get_running_loop()
    made: list[asyncio.BaseTransport] = []
    protocol = type("P", (_Counting,), {"made": made})
    server = await loop.create_server(protocol, sock=listener, backlog=512)
    counts = []
    with _clients(listener.getsockname(), BURST):
        for _ in range(turns):
            await asyncio.sleep(0)
            counts.append(len(made))
        server.close()
        await server.wait_closed()
        for transport in made:
            transport.close()
    return counts


def test_uvloop_alone_takes_one_connection_a_turn() -> None:
    """The defect this loop mends, as uvloop shows it (if a uvloop release changes it,
    this test says so)."""
    counts = _on_edge_loop(_accepted_per_turn(_listener(), 6), uvloop.new_event_loop())
    assert counts[-1] <= 6 < BURST


def test_a_burst_of_connections_is_accepted_in_a_few_turns() -> None:
    counts = _on_edge_loop(_accepted_per_turn(_listener(), 6))
    assert counts[-1] == BURST, counts


def test_each_connection_gets_its_own_protocol_and_answers() -> None:
    async def serve() -> list[bytes]:
        loop = asyncio.get_running_loop()

        class Echo(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = transport

            def data_received(self, data: bytes) -> None:
                self.transport.write(data.upper())  # type: ignore[attr-defined]

        listener = _listener()
        server = await loop.create_server(Echo, sock=listener, backlog=64)
        assert isinstance(server, AcceptingServer) and server.is_serving()
        assert server.sockets == (listener,)

        async def one(index: int) -> bytes:
            reader, writer = await asyncio.open_connection(*listener.getsockname())
            writer.write(f"hello {index}".encode())
            await writer.drain()
            answer = await reader.readexactly(len(f"hello {index}"))
            writer.close()
            return answer

        answers = await asyncio.gather(*(one(i) for i in range(20)))
        server.close()
        await server.wait_closed()
        assert not server.is_serving() and server.sockets == ()
        return answers

    answers = _on_edge_loop(serve())
    assert answers == [f"HELLO {i}".encode() for i in range(20)]


def test_a_closed_server_accepts_nothing_more() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        listener = _listener()
        address = listener.getsockname()
        server = await loop.create_server(asyncio.Protocol, sock=listener, backlog=8)
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*address)

    _on_edge_loop(run())


class _Exhausted(socket.socket):
    """A listening socket whose next accept fails as if the process had no descriptors."""

    failures = 1

    def accept(self) -> tuple[socket.socket, object]:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


def test_out_of_descriptors_pauses_accepting_then_resumes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("hapi.gateway.edge._accept._PAUSE_S", 0.05)

    async def run() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        made: list[asyncio.BaseTransport] = []
        listener = _Exhausted()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        protocol = type("P", (_Counting,), {"made": made})
        server = await loop.create_server(protocol, sock=listener, backlog=64)
        with _clients(listener.getsockname(), 5):
            for _ in range(5):
                await asyncio.sleep(0)
            during_pause = len(made)
            await asyncio.sleep(0.2)
            after = len(made)
        server.close()
        for transport in made:
            transport.close()
        return during_pause, after

    with caplog.at_level(logging.WARNING, logger="hapi.gateway"):
        during_pause, after = _on_edge_loop(run())
    assert during_pause == 0
    assert after == 5
    assert "cannot accept connections" in caplog.text and "Too many open files" in caplog.text


def test_serving_forever_ends_with_its_task_and_closes_the_server() -> None:
    async def run() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, sock=_listener(), backlog=8)
        task = asyncio.ensure_future(server.serve_forever())
        await asyncio.sleep(0)
        serving = server.is_serving()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return serving, server.is_serving()

    assert _on_edge_loop(run()) == (True, False)


def test_the_factory_makes_the_edge_loop() -> None:
    loop = new_event_loop()
    try:
        assert isinstance(loop, EdgeLoop) and isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_other_servers_are_uvloops_own() -> None:
    async def run() -> type:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        kind = type(server)
        server.close()
        await server.wait_closed()
        return kind

    kind = _on_edge_loop(run())
    assert kind is not AcceptingServer
