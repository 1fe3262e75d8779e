"""UpstreamTransport against small real HTTP servers on loopback (asyncio and uvloop)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hapi.gateway import GatewaySettings
from hapi.gateway._app import new_upstream_client
from hapi.gateway._exchange import Outgoing
from hapi.gateway.edge._transport import UpstreamTransport
from hapi.protocol import Credentials

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return request.param


class Server:
    """A loopback server running ``handler`` per connection; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open -= 1
            writer.close()


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[Server]:
    server = Server(handler)
    listener = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    async with listener:
        yield server


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]]:
    """The request line and headers (names lowercased) of the next request."""
    head = await reader.readuntil(b"\r\n\r\n")
    line, *lines = head[:-4].split(b"\r\n")
    headers = {}
    for raw in lines:
        name, _, value = raw.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return line, headers


def reply(status: int, body: bytes = b"", *headers: bytes) -> bytes:
    extra = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


def ok_forever(body: bytes) -> Handler:
    """Answer every request on the connection with ``body``."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            line, _ = await read_request(reader)
            writer.write(reply(200, b"" if line.startswith(b"HEAD") else body))
            await writer.drain()

    return handler


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in 5 s")


def client(**limits: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=UpstreamTransport(limits=httpx.Limits(**limits)))


async def test_content_length_body_and_keep_alive_reuse():
    body = os.urandom(3 * 1024 * 1024 + 17)  # several socket reads
    async with serve(ok_forever(body)) as server, client() as http:
        first = await http.get(server.url + "/a?x=1")
        second = await http.get(server.url + "/b")
    assert first.status_code == second.status_code == 200
    assert first.content == body and second.content == body
    assert first.headers["content-length"] == str(len(body))
    assert server.connections == 1


@pytest.mark.parametrize(("expiry", "connections"), [(None, 1), (30.0, 1), (0.01, 2)])
async def test_keepalive_expiry(expiry: float | None, connections: int):
    transport = UpstreamTransport(limits=httpx.Limits(keepalive_expiry=expiry))
    async with serve(ok_forever(b"ok")) as server, httpx.AsyncClient(transport=transport) as http:
        await http.get(server.url)
        await asyncio.sleep(0.05)
        await http.get(server.url)
    assert server.connections == connections


async def test_request_line_and_headers_reach_the_server():
    seen: list[tuple[bytes, dict[bytes, bytes]]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(reply(200))

    async with serve(handler) as server, client() as http:
        await http.get(server.url + "/bucket/a%20key?list-type=2", headers={"X-Amz-Date": "now"})
    line, headers = seen[0]
    assert line == b"GET /bucket/a%20key?list-type=2 HTTP/1.1"
    assert headers[b"x-amz-date"] == b"now"
    assert headers[b"host"] == server.url.removeprefix("http://").encode()


async def test_chunked_body():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"hello ", b"chunked ", b"world"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await read_request(reader)  # the connection is reused for a second request
        writer.write(reply(200, b"again"))

    async with serve(handler) as server, client() as http:
        first = await http.get(server.url)
        second = await http.get(server.url)
    assert first.content == b"hello chunked world"
    assert second.content == b"again"
    assert server.connections == 1


async def test_head_response_has_no_body_and_connection_is_reused():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        await read_request(reader)
        writer.write(reply(200, b"next"))

    async with serve(handler) as server, client() as http:
        head = await asyncio.wait_for(http.head(server.url), 5)
        after = await asyncio.wait_for(http.get(server.url), 5)
    assert head.headers["content-length"] == "1000" and head.content == b""
    assert after.content == b"next"
    assert server.connections == 1


@pytest.mark.parametrize("status", [204, 304])
async def test_no_body_statuses(status: int):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 %d X\r\nContent-Length: 50\r\nETag: "e"\r\n\r\n' % status)
        await read_request(reader)
        writer.write(reply(200, b"next"))

    async with serve(handler) as server, client() as http:
        first = await asyncio.wait_for(http.get(server.url), 5)
        second = await asyncio.wait_for(http.get(server.url), 5)
    assert (first.status_code, first.content, first.headers["etag"]) == (status, b"", '"e"')
    assert second.content == b"next"
    assert server.connections == 1


async def test_interim_100_continue_is_skipped():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + reply(201, b"made"))

    async with serve(handler) as server, client() as http:
        response = await http.get(server.url)
    assert (response.status_code, response.content) == (201, b"made")


async def test_connection_close_response_is_not_reused():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(200, b"bye", b"Connection: close"))
        await writer.drain()
        await reader.read()  # until the client closes its side

    async with serve(handler) as server, client() as http:
        await http.get(server.url)
        await http.get(server.url)
    assert server.connections == 2


async def test_body_until_close_completes_at_eof():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")

    async with serve(handler) as server, client() as http:
        response = await http.get(server.url)
    assert response.content == b"all of it"


async def test_close_mid_body_raises_and_never_looks_complete():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 100)
        await writer.drain()

    got = bytearray()
    async with serve(handler) as server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError, match="received 100 bytes"):
            async with http.stream("GET", server.url) as response:
                async for chunk in response.aiter_raw():
                    got += chunk
    assert got == b"x" * 100


async def test_truncated_chunked_body_raises():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()

    async with serve(handler) as server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get(server.url)


async def test_close_before_response_raises():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with serve(handler) as server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await http.get(server.url)


async def test_streamed_request_body_arrives_intact():
    payload = os.urandom(5 * 1024 * 1024 + 3)
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, headers = await read_request(reader)
        received.append(await reader.readexactly(int(headers[b"content-length"])))
        writer.write(reply(200, hashlib.sha256(received[0]).hexdigest().encode()))

    async def body() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 700_000):
            await asyncio.sleep(0)
            yield payload[i : i + 700_000]

    async with serve(handler) as server, client() as http:
        response = await http.put(
            server.url, content=body(), headers={"content-length": str(len(payload))}
        )
    assert received == [payload]
    assert response.text == hashlib.sha256(payload).hexdigest()


async def test_chunked_request_body_without_length():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, headers = await read_request(reader)
        assert headers[b"transfer-encoding"] == b"chunked"
        raw = await reader.readuntil(b"0\r\n\r\n")
        writer.write(reply(200, raw))

    async def body() -> AsyncIterator[bytes]:
        yield b"abc"
        yield b"defgh"

    async with serve(handler) as server, client() as http:
        response = await http.post(server.url, content=body())
    assert response.content == b"3\r\nabc\r\n5\r\ndefgh\r\n0\r\n\r\n"


class Boom(Exception):
    pass


async def test_body_iterator_error_propagates_and_server_sees_a_reset():
    seen: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        received = 0
        try:
            while data := await reader.read(65536):
                received += len(data)
        except ConnectionResetError:
            await seen.put((received, True))
        else:
            await seen.put((received, False))

    async def body() -> AsyncIterator[bytes]:
        yield b"a" * 1000
        raise Boom("the client went away")

    async with serve(handler) as server, client() as http:
        with pytest.raises(Boom):
            await http.put(server.url, content=body(), headers={"content-length": "5000"})
        received, reset = await asyncio.wait_for(seen.get(), 5)
    # A reset, not a clean end: a store must never take the short body for a whole one.
    assert reset
    assert received <= 1000


async def test_body_longer_than_its_length_is_refused():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()

    async def body() -> AsyncIterator[bytes]:
        yield b"a" * 10

    async with serve(handler) as server, client() as http:
        with pytest.raises(httpx.LocalProtocolError):
            await http.put(server.url, content=body(), headers={"content-length": "4"})


async def test_connect_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        async with client() as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(f"http://127.0.0.1:{port}/")


async def test_read_timeout():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()

    async with serve(handler) as server, client() as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get(server.url, timeout=httpx.Timeout(5, read=0.2))


async def test_pool_bounds_concurrent_connections():
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            await release.wait()
            writer.write(reply(200, b"ok"))

    async with serve(handler) as server, client(max_connections=2) as http:
        requests = [asyncio.ensure_future(http.get(server.url)) for _ in range(6)]
        await until(lambda: server.open == 2)
        await asyncio.sleep(0.1)  # time for a third connection, were the pool to allow one
        assert server.open == 2
        release.set()
        responses = await asyncio.gather(*requests)
    assert [r.content for r in responses] == [b"ok"] * 6
    assert server.connections == 2 and server.most_open == 2


async def test_pool_timeout():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()

    async with serve(handler) as server, client(max_connections=1) as http:
        busy = asyncio.ensure_future(http.get(server.url))
        await until(lambda: server.open == 1)
        with pytest.raises(httpx.PoolTimeout):
            await http.get(server.url, timeout=httpx.Timeout(5, pool=0.1))
        busy.cancel()


async def test_unread_body_closes_the_connection():
    async with serve(ok_forever(os.urandom(4 * 1024 * 1024))) as server, client() as http:
        async with http.stream("GET", server.url) as response:
            async for _ in response.aiter_raw():
                break  # abandon the rest of the body
        await http.get(server.url)
    assert server.connections == 2


async def test_slow_consumer_pauses_reading():
    size = 64 * 1024 * 1024
    sent_all = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        writer.write(bytes(size))
        await writer.drain()
        sent_all.set()

    got = 0
    async with (
        serve(handler) as server,
        client() as http,
        http.stream("GET", server.url) as response,
    ):
        async for chunk in response.aiter_raw():
            if got == 0:
                await asyncio.sleep(0.5)  # a consumer far behind the socket
                assert not sent_all.is_set()  # the transport did not buffer it all
            got += len(chunk)
    assert got == size and sent_all.is_set()


async def test_stale_keep_alive_connection_is_retried_for_a_get():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(200, b"one"))
        if server.connections == 1:
            await read_request(reader)  # then hang up without an answer, like an idle timeout

    async with serve(handler) as server, client() as http:
        first = await http.get(server.url)
        second = await http.get(server.url)
    assert (first.content, second.content) == (b"one", b"one")
    assert server.connections == 2


async def test_stale_retry_uses_a_new_connection():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(200, b"ok"))
        if server.connections <= 2:  # the first two go stale, as after a store restart
            await read_request(reader)
            return
        await read_request(reader)
        writer.write(reply(200, b"ok"))

    async with serve(handler) as server, client() as http:
        await asyncio.gather(http.get(server.url), http.get(server.url))  # two idle connections
        response = await http.get(server.url)
    assert response.content == b"ok"
    assert server.connections == 3


async def test_stale_connection_is_not_retried_for_a_streamed_body():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(200, b"one"))
        await read_request(reader)

    async def body() -> AsyncIterator[bytes]:
        yield b"data"

    async with serve(handler) as server, client() as http:
        await http.get(server.url)
        with pytest.raises(httpx.RemoteProtocolError):
            await http.put(server.url, content=body(), headers={"content-length": "4"})


async def test_aclose_closes_idle_connections():
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(200, b"ok"))
        await reader.read()
        closed.set()

    async with serve(handler) as server:
        transport = UpstreamTransport()
        async with httpx.AsyncClient(transport=transport) as http:
            await http.get(server.url)
            assert not closed.is_set()
            await transport.aclose()
            await asyncio.wait_for(closed.wait(), 5)


async def test_header_with_a_line_break_is_refused():
    async with client() as http:
        with pytest.raises(httpx.LocalProtocolError):
            await http.get("http://127.0.0.1:9/", headers={"x-evil": "a\r\nInjected: yes"})


async def test_https_is_not_spoken_here():
    async with client() as http:
        with pytest.raises(httpx.UnsupportedProtocol, match="http://"):
            await http.get("https://127.0.0.1:9/")


async def test_gateway_client_sends_https_through_httpx_default_transport():
    settings = GatewaySettings(
        backend_url="https://127.0.0.1:9",
        backend_credentials=Credentials("k", "s"),
        allow_anonymous=True,
        connect_timeout_s=2,
    )
    async with new_upstream_client(settings) as http:
        with pytest.raises(httpx.ConnectError):  # httpcore's error, not UnsupportedProtocol
            await http.get("https://127.0.0.1:9/")


def _capture() -> tuple[Handler, list[bytes]]:
    """A server that records each request's head and body bytes, then answers 200."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lower = head.lower()
            if b"transfer-encoding: chunked" in lower:
                body = await reader.readuntil(b"0\r\n\r\n")
            elif b"content-length: " in lower:
                length = int(lower.split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
            else:
                body = b""
            seen.append(head + body)
            answer = b"" if head.startswith(b"HEAD") else b"answer"
            writer.write(reply(200, answer, b"X-Extra: 1"))
            await writer.drain()

    return handler, seen


_NAMES = st.from_regex(r"x-[a-z]{1,8}", fullmatch=True)
_VALUES = st.from_regex(r"[ -~]{0,20}", fullmatch=True).map(str.strip)


@st.composite
def _outgoing_parts(draw: st.DrawFn) -> tuple[str, bytes, list[tuple[bytes, bytes]], str, bytes]:
    method = draw(st.sampled_from(["GET", "HEAD", "PUT", "POST", "DELETE"]))
    # Targets as the gateway builds them: never a "." or ".." segment (check_key refuses
    # such keys and object_path encodes them), which httpx's models would remove and the
    # lean exchange sends as given.
    target = draw(
        st.from_regex(
            r"/[a-z0-9]{1,8}(/[a-zA-Z0-9%._~-]{0,12})?(\?[a-z=&-]{0,12})?", fullmatch=True
        ).filter(lambda t: not {".", ".."} & set(t.partition("?")[0].split("/")))
    )
    names = draw(st.lists(_NAMES, max_size=5, unique=True))
    headers = [(n.encode(), draw(_VALUES).encode()) for n in names]
    body_kind = draw(st.sampled_from(["none", "whole", "streamed"]))
    body = draw(st.binary(max_size=200)) if body_kind != "none" else b""
    return method, target.encode(), headers, body_kind, body


@settings(max_examples=60, deadline=None)
@given(parts=_outgoing_parts())
def test_an_encoded_request_goes_out_as_httpx_models_would_send_it(parts):
    """The pass-through's lean exchange puts the same bytes on the wire, and reads the same
    response, as the same request sent through httpx's request and response models."""
    method, target, headers, body_kind, body = parts

    async def main() -> None:
        handler, seen = _capture()
        async with serve(handler) as server:
            port = int(server.url.rsplit(":", 1)[1])
            framing: list[tuple[bytes, bytes]] = [(b"host", b"127.0.0.1:%d" % port)]
            if body_kind == "whole":
                framing.append((b"content-length", b"%d" % len(body)))
            elif body_kind == "streamed":
                framing.append((b"transfer-encoding", b"chunked"))
            elif method in ("PUT", "POST"):  # as httpx frames an empty body of these
                framing.append((b"content-length", b"0"))

            def outgoing() -> Outgoing:
                async def stream() -> AsyncIterator[bytes]:
                    for i in range(0, len(body), 64):
                        yield body[i : i + 64]

                content = {"none": None, "whole": body, "streamed": stream()}[body_kind]
                timeouts = {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}
                return Outgoing(
                    method,
                    "http",
                    "127.0.0.1",
                    port,
                    target,
                    [*framing, *headers],
                    content,
                    timeouts,
                )

            transport = UpstreamTransport()
            try:
                lean = await transport.exchange(outgoing())
                lean_body = b"".join([chunk async for chunk in lean.body])
                await lean.body.aclose()
                modelled = await transport.handle_async_request(outgoing().to_httpx())
                modelled_body = await modelled.aread()
                await modelled.aclose()
            finally:
                await transport.aclose()
        assert len(seen) == 2 and seen[0] == seen[1]
        assert seen[0].startswith(method.encode() + b" " + target + b" HTTP/1.1\r\n")
        assert (lean.status, list(lean.headers)) == (modelled.status_code, modelled.headers.raw)
        assert lean_body == modelled_body == (b"" if method == "HEAD" else b"answer")

    asyncio.run(main())
