"""A connection's writes within one turn of the event loop leave in one send."""

from __future__ import annotations

import asyncio
from typing import Any

from hapi.gateway.edge._http import _CoalescedWrites


class _Transport:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append([data])

    def writelines(self, lines: Any) -> None:
        self.sent.append(list(lines))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_a_head_and_body_written_in_one_turn_leave_together() -> None:
    async def main() -> _Transport:
        transport = _Transport()
        writes = _CoalescedWrites(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        writes.write(b"HTTP/1.1 200 OK\r\n\r\n")
        writes.write(b"body")
        assert transport.sent == [] and writes.get_write_buffer_size() == 23
        await asyncio.sleep(0)
        writes.write(b"next")
        await asyncio.sleep(0)
        assert writes.get_extra_info("peername") == "info:peername"  # the rest is the transport's
        return transport

    sent = asyncio.run(main()).sent
    assert sent == [[b"HTTP/1.1 200 OK\r\n\r\n", b"body"], [b"next"]]


def test_closing_sends_what_is_pending_first_and_nothing_after() -> None:
    async def main() -> _Transport:
        transport = _Transport()
        writes = _CoalescedWrites(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        writes.write(b"last words")
        writes.close()
        writes.write(b"too late")
        await asyncio.sleep(0)
        return transport

    transport = asyncio.run(main())
    assert transport.sent == [[b"last words"]] and transport.closed


def test_aborting_drops_what_is_pending() -> None:
    async def main() -> _Transport:
        transport = _Transport()
        writes = _CoalescedWrites(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        writes.write(b"never sent")
        writes.abort()
        await asyncio.sleep(0)
        return transport

    transport = asyncio.run(main())
    assert transport.sent == [] and transport.aborted
