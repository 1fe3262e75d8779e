"""``hapi-bench floors``: what a pass-through GET's CPU is made of, floor by floor.

The gateway's CPU per 4 KiB pass-through GET is the sum of layers that can each be
measured alone. This measures, on the same cores and interleaved round by round (the
order turned every round):

- ``protocol``: a bare asyncio protocol on httptools and uvloop answering 4 KiB from
  memory, driven by wrk: the HTTP parser, the event loop and the sockets, no ASGI.
- ``edge``: a trivial ASGI app answering the same 4 KiB under the gateway's own uvicorn
  configuration (``hapi.gateway.edge_config``: its protocol class, its loop),
  driven by wrk: the ASGI server's share.
- ``gateway``: ``hapi serve`` in front of a real store, presigned 4 KiB GETs from wrk:
  the whole request.
- ``app``: the gateway's ASGI app called in this process from 32 tasks, with the bare
  protocol above as its store: the gateway's own work per request (parse, SigV4
  verification, decision, the upstream request built, signed, sent and its answer read
  and relayed, access log and metrics), without a server or a client socket.

The wrk targets report the server process's CPU per request, ``app`` this process's CPU
per call. ``protocol + (edge - protocol) + app`` is what the gateway's request costs
layer by layer; the gap to ``gateway`` is what the layers cost together and not apart
(one event loop turning over a client's connection and a store's, the caches they share).
Writes ``bench-floors.json`` and ``bench-floors.png``. Run as ``hapi-bench floors --out DIR``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any, cast

import httpx

from hapi.store import free_port
from hapi_bench.core._errors import BenchError
from hapi_bench.core._host import cpu_model
from hapi_bench.micro._gateway import bench_store, server_process, wait_for_gateway
from hapi_bench.micro._proxy import _presigner
from hapi_bench.micro._wrk import run_wrk, wrk_binary, wrk_main

BODY_BYTES = 4096
WRK_TARGETS = ("protocol", "edge", "gateway")
IN_PROCESS = ("app",)
_TASKS = 32
GOAL_US = 150  # issue 40's cap on the gateway's CPU per pass-through GET


# The two servers, run as ``python -m hapi_bench.micro._floors serve KIND PORT``
# (``hapi-bench floors`` is :func:`main`).


def _serve_protocol(port: int) -> None:
    import httptools
    import uvloop

    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
        b"content-length: %d\r\n\r\n" % BODY_BYTES
    )
    answer = head + os.urandom(BODY_BYTES)

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass
            self.parser = httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            self.transport.write(answer)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Answer, "127.0.0.1", port, backlog=2048)
        await server.serve_forever()

    uvloop.run(serve())


def _serve_edge(port: int) -> None:
    import uvicorn

    from hapi.gateway import GatewaySettings, edge_config
    from hapi.protocol import Credentials

    body = os.urandom(BODY_BYTES)
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"content-length", str(BODY_BYTES).encode()),
    ]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    settings = GatewaySettings(
        backend_url="http://127.0.0.1:9", backend_credentials=Credentials("UNUSED", "unused")
    )
    uvicorn.Server(edge_config(settings, "127.0.0.1", port, lambda _: lambda: app)).run()


@contextlib.contextmanager
def _server(kind: str, log: Path) -> Iterator[tuple[str, int]]:
    """One of the floors' servers in a process of its own: its URL and pid (it answers
    every path, the gateway's health check's too)."""
    port = free_port()
    command = [sys.executable, "-m", __name__, "serve", kind, str(port)]
    with server_process(command, log) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_for_gateway(url, proc, log)
        yield url, proc.pid


# The in-process floors.


def app_cpu_us(store_url: str, calls: int) -> float:
    """The gateway's ASGI app's CPU per presigned 4 KiB GET, called in this process (no
    server, no client socket), its store the server at ``store_url``: the app's own
    Python and its store exchange (this process's CPU over ``calls`` requests from
    :data:`_TASKS` tasks; the best of three passes)."""
    import uvloop

    from hapi.gateway import ClientKey, GatewaySettings, create_app
    from hapi.protocol import Credentials

    settings = GatewaySettings(
        backend_url=store_url,
        backend_credentials=Credentials("BACKEND", "backend-secret"),
        clients={"CLIENT": ClientKey("client-secret")},
    )
    app = create_app(settings)
    presign = _presigner("http://127.0.0.1:8080", "CLIENT", "client-secret")
    url = httpx.URL(presign("GET", "small"))
    path, _, query = url.raw_path.partition(b"?")
    statuses: list[int] = []
    sent = [0]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
        else:
            sent[0] += len(message.get("body", b""))

    def scope() -> dict[str, Any]:
        return {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": path.decode(), "raw_path": path,
            "query_string": query, "root_path": "", "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080), "state": {},
            "headers": [(b"host", b"127.0.0.1:8080"), (b"user-agent", b"wrk")],
        }  # fmt: skip

    async def client(count: int) -> None:
        for _ in range(count):
            await app(scope(), receive, send)

    each = max(1, calls // _TASKS)

    async def passes() -> list[float]:
        async with app.lifespan(app):
            await asyncio.gather(*(client(max(1, each // 10)) for _ in range(_TASKS)))
            spent = []
            for _ in range(3):
                started = time.process_time()
                await asyncio.gather(*(client(each) for _ in range(_TASKS)))
                spent.append((time.process_time() - started) / (each * _TASKS) * 1e6)
            return spent

    spent = uvloop.run(passes())
    if set(statuses) != {200} or sent[0] != len(statuses) * BODY_BYTES:
        raise BenchError(
            f"the in-process gateway answered {sorted(set(statuses))}, {sent[0]} bytes "
            f"for {len(statuses)} requests"
        )
    return min(spent)


# The run.


def run(out: Path, rounds: int, seconds: float, connections: int) -> dict[str, Any]:
    """Measure every floor in interleaved rounds; returns (and writes) the results."""
    wrk_binary()
    cpu: dict[str, list[float]] = {name: [] for name in (*WRK_TARGETS, *IN_PROCESS)}
    rates: dict[str, list[float]] = {name: [] for name in WRK_TARGETS}
    with bench_store() as bench, contextlib.ExitStack() as running:
        bench.s3.create_bucket(Bucket="bench")
        bench.s3.put_object(Bucket="bench", Key="small", Body=os.urandom(BODY_BYTES))
        gw = running.enter_context(bench.gateway("gateway.log"))
        servers = {
            "protocol": running.enter_context(_server("protocol", bench.tmp / "protocol.log")),
            "edge": running.enter_context(_server("edge", bench.tmp / "edge.log")),
            "gateway": (_presigner(gw.url, gw.key, gw.secret)("GET", "small"), gw.pid),
        }
        steps: list[tuple[str, Callable[[], float]]] = [
            *((name, _wrk_step(name, *servers[name], seconds, connections, rates)) for name in WRK_TARGETS),
            ("app", lambda: app_cpu_us(servers["protocol"][0], 10000)),
        ]  # fmt: skip
        for index in range(rounds):
            turn = index % len(steps)
            for name, step in steps[turn:] + steps[:turn]:
                cpu[name].append(step())
                print(f"round {index + 1}/{rounds} {name}: {cpu[name][-1]:.1f} us", flush=True)
    results = summarize(cpu, rates)
    results.update(
        load=f"wrk, 4 KiB GETs, {connections} connections, {seconds:g} s a run",
        rounds=rounds,
        cpu=cpu_model(),
        cpu_count=os.cpu_count(),
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-floors.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(out / "bench-floors.png", results)
    print(table(results))
    return results


def plot(path: Path, results: dict[str, Any]) -> None:
    """The layers stacked in one bar beside the whole gateway's, with the 150 us goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    left = 0.0
    for name, value in results["layers"].items():
        ax.barh("layers, each alone", value, left=left, label=f"{name}: {value:.0f} us")
        left += value
    whole = results["floors"]["gateway"]
    low, high = whole["range"]
    ax.barh(
        "the gateway, whole",
        whole["cpu_us"],
        xerr=[[whole["cpu_us"] - low], [high - whole["cpu_us"]]],
        color="grey",
        label=f"the gateway: {whole['cpu_us']:.0f} us (range {low:.0f}-{high:.0f})",
    )
    ax.axvline(GOAL_US, linestyle=":", color="black", label=f"goal: {GOAL_US} us")
    ax.set(xlabel="CPU per 4 KiB pass-through GET (us), median of the rounds")
    ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _wrk_step(
    name: str, url: str, pid: int, seconds: float, connections: int, rates: dict[str, list[float]]
) -> Callable[[], float]:
    def step() -> float:
        result = run_wrk(url, connections=connections, seconds=seconds, server_pid=pid)
        if result.non_2xx or result.errors or result.cpu_us_per_request is None:
            raise BenchError(f"{name}: {result.non_2xx} non-2xx, {result.errors} errors")
        rates[name].append(result.requests_per_s)
        return result.cpu_us_per_request

    return step


def summarize(cpu: dict[str, list[float]], rates: dict[str, list[float]]) -> dict[str, Any]:
    """Medians and ranges of each floor, and the sum the floors make against the
    gateway's whole request."""
    median = {name: statistics.median(values) for name, values in cpu.items()}
    floors = {
        name: {
            "cpu_us": median[name],
            "range": [min(values), max(values)],
            "runs": values,
            **({"requests_per_s": statistics.median(rates[name])} if rates.get(name) else {}),
        }
        for name, values in cpu.items()
    }
    layers = {
        "parser, loop and sockets (protocol)": median["protocol"],
        "ASGI server (edge - protocol)": median["edge"] - median["protocol"],
        "the app and its store exchange (app)": median["app"],
    }
    summed = sum(layers.values())
    return {
        "floors": floors,
        "layers": layers,
        "sum_of_layers_us": summed,
        "gateway_us": median["gateway"],
        "unexplained_us": median["gateway"] - summed,
    }


def table(results: dict[str, Any]) -> str:
    """The layers, their sum and the gateway's whole request, one line each."""
    lines = [f"{'layer':42s} {'CPU us a request':>17s}"]
    lines += [f"{name:42s} {value:17.1f}" for name, value in results["layers"].items()]
    lines.append(f"{'sum of the layers':42s} {results['sum_of_layers_us']:17.1f}")
    lines.append(f"{'the gateway, whole (gateway)':42s} {results['gateway_us']:17.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    wrk_main("hapi-bench floors", __doc__, run, argv, rounds=5, seconds=6.0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:  # ``serve KIND PORT``: one of the floors' servers
        (_serve_protocol if sys.argv[2] == "protocol" else _serve_edge)(int(sys.argv[3]))
    else:
        main()
