"""``hapi-bench servers``: the same gateway app under two ASGI servers, in pass-through.

What a 4 KiB GET costs the gateway is partly its ASGI server's: the HTTP parser, the
protocol class around it and the ASGI cycle. This runs, in front of one real store and
interleaved round by round (the order swapped every other round), the gateway as
``hapi serve`` runs it (uvicorn with httptools and the edge's own protocol class, see
``hapi.gateway.edge._http``) and the same app under granian (its HTTP layer in Rust, one
worker, uvloop), and drives both with presigned 4 KiB GETs from wrk (``--connections``,
150 by default). Per server and round: requests/s, p50/p99, and the server's CPU per
request (its process and descendants). Writes ``bench-servers.json``.

granian is not one of hapi's dependencies: ``pip install granian`` (the benchmarks'
``servers`` extra) before running this. Run as ``hapi-bench servers --out DIR``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

from hapi_bench.core._errors import BenchError, TestbedUnavailable
from hapi_bench.core._host import cpu_model
from hapi_bench.micro._gateway import BenchGateway, bench_store, gateway_subprocess
from hapi_bench.micro._proxy import _presigner
from hapi_bench.micro._wrk import WrkResult, run_wrk, wrk_binary, wrk_main

SERVERS = ("uvicorn", "granian")


def gateway_app() -> Any:
    """The gateway's ASGI app from ``HAPI_*`` variables (granian's ``--factory`` target)."""
    from hapi.gateway import GatewaySettings, create_app

    return create_app(GatewaySettings.from_env(os.environ))


def _granian(port: int) -> list[str]:
    """granian serving :func:`gateway_app` on ``port``: one worker, uvloop."""
    return [
        sys.executable, "-m", "granian", "--interface", "asgi", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--loop", "uvloop",
        "--log-level", "warning", "--no-ws", f"{__name__}:gateway_app",
    ]  # fmt: skip


def _target(gw: BenchGateway) -> tuple[str, str]:
    """A presigned GET of the small object through ``gw``: the URL, and its Host."""
    return _presigner(gw.url, gw.key, gw.secret)("GET", "small"), httpx.URL(gw.url).netloc.decode()


def _same_answer(gateways: dict[str, BenchGateway], body: bytes) -> None:
    """Every server answers the object's bytes (a check before any timing)."""
    for name, gw in gateways.items():
        url, _ = _target(gw)
        reply = httpx.get(url, timeout=30, trust_env=False)
        if reply.status_code != 200 or reply.content != body:
            raise BenchError(f"{name} answered {reply.status_code}: {reply.text[:200]}")


def run(out: Path, rounds: int, seconds: float, connections: int) -> dict[str, Any]:
    """Measure both servers; returns (and writes) the results."""
    wrk_binary()
    if importlib.util.find_spec("granian") is None:
        raise TestbedUnavailable(
            "granian is not installed (pip install -e './benchmarks[servers]', "
            "or pip install granian)"
        )
    runs: dict[str, list[WrkResult]] = {name: [] for name in SERVERS}
    with bench_store() as bench, contextlib.ExitStack() as running:
        body = os.urandom(4096)
        bench.s3.create_bucket(Bucket="bench")
        bench.s3.put_object(Bucket="bench", Key="small", Body=body)
        gateways = {
            "uvicorn": running.enter_context(bench.gateway("gateway.log")),
            "granian": running.enter_context(
                gateway_subprocess(
                    bench.tmp / "granian.log",
                    bench.store.endpoint_url,
                    bench.key,
                    bench.secret,
                    command=_granian,
                )
            ),
        }
        _same_answer(gateways, body)
        for index in range(rounds):
            order = SERVERS if index % 2 == 0 else tuple(reversed(SERVERS))
            for name in order:
                url, host = _target(gateways[name])
                result = run_wrk(
                    url,
                    host=host,
                    connections=connections,
                    seconds=seconds,
                    server_pid=gateways[name].pid,
                )
                if result.non_2xx or result.errors:
                    raise BenchError(f"{name}: {result.non_2xx} non-2xx, {result.errors} errors")
                runs[name].append(result)
                print(f"round {index + 1}/{rounds} {name}: {_line(result)}", flush=True)
    servers = {name: _summary(measured) for name, measured in runs.items()}
    results = {
        "load": f"wrk, presigned 4 KiB GETs, {connections} connections, {seconds:g} s a run",
        "rounds": rounds,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "servers": servers,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-servers.json").write_text(json.dumps(results, indent=2) + "\n")
    for name, summary in servers.items():
        print(f"{name}: median {summary['median']}")
    return results


def _line(result: WrkResult) -> str:
    cpu = result.cpu_us_per_request
    return (
        f"{result.requests_per_s:,.0f} requests/s, p99 {result.p99_ms:.1f} ms, "
        f"{'?' if cpu is None else f'{cpu:.0f}'} us of server CPU a request"
    )


def _summary(results: list[WrkResult]) -> dict[str, Any]:
    cpus = [r.cpu_us_per_request for r in results if r.cpu_us_per_request is not None]
    return {
        "median": {
            "requests_per_s": statistics.median(r.requests_per_s for r in results),
            "p99_ms": statistics.median(r.p99_ms for r in results),
            "cpu_us_per_request": statistics.median(cpus) if cpus else None,
        },
        "runs": [r.to_dict() for r in results],
    }


def main(argv: list[str] | None = None) -> None:
    wrk_main("hapi-bench servers", __doc__, run, argv, rounds=4, seconds=8.0)


if __name__ == "__main__":
    main()
