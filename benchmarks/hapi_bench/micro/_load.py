"""``make bench-load``: a bounded load run through the gateway, nginx and the store directly.

Starts a real embedded store, the gateway (``hapi serve``, ``--workers`` processes) and nginx
as a plain reverse proxy, all on loopback. For half of ``--seconds``, ``--mixed-clients``
concurrent Python clients load the gateway: most GET 4 KiB objects, one in five PUTs a 1-8
MiB object and reads it back (every PUT must read back byte-identical), and, when
``--model`` names a family to export and register, one in five asks for pushdown features.
Then wrk (a C load generator, so the servers and not the client are measured) sends
presigned 4 KiB GETs from ``--clients`` connections through the gateway, nginx and straight
to the store, a sixth of ``--seconds`` each: requests/s, p50/p99, timeouts and the server's
CPU per request. Prints status counts, latencies, and the gateway's RSS (all its processes)
at the start, its peak and at the end. Run as ``hapi-bench load``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hapi_bench.micro._gateway import BenchGateway, bench_store
from hapi_bench.micro._proxy import Target, _nginx, _presigner, _url
from hapi_bench.micro._wrk import run_wrk, wrk_binary

MiB = 1024 * 1024
_SMALL_OBJECTS = 64
_SMALL_BYTES = 4096
_BUCKET = "bench"  # the bucket ``_proxy``'s presigner signs for


@dataclass
class Tally:
    """What one phase saw: statuses and latencies by kind, PUTs verified."""

    statuses: Counter[str] = field(default_factory=Counter)
    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    verified_puts: int = 0
    mismatched_puts: int = 0

    def record(self, kind: str, status: int | str, started: float) -> None:
        self.statuses[f"{kind} {status}"] += 1
        self.latencies_ms[kind].append((time.perf_counter() - started) * 1000)

    def summary(self) -> dict[str, Any]:
        return {
            "statuses": dict(sorted(self.statuses.items())),
            "latency_ms": {
                kind: {"count": len(v), "p50": _percentile(v, 0.5), "p99": _percentile(v, 0.99)}
                for kind, v in sorted(self.latencies_ms.items())
            },
            "verified_puts": self.verified_puts,
            "mismatched_puts": self.mismatched_puts,
        }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0


class _RssSampler:
    """Samples the summed RSS of a process and its children until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _RssSampler:
        self.samples.append(_tree_rss(self.pid))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(_tree_rss(self.pid))

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.samples.append(_tree_rss(self.pid))

    def summary(self) -> dict[str, float]:
        mib = [s / MiB for s in self.samples]
        return {
            "start_mib": round(mib[0], 1),
            "peak_mib": round(max(mib), 1),
            "end_mib": round(mib[-1], 1),
        }


def _tree_rss(pid: int) -> int:
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if int(entry.name) == pid or parent == pid:
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
    return total


async def _small_get(
    client: httpx.AsyncClient, target: Target, tally: Tally, rng: random.Random
) -> None:
    url, headers = _url(target, "GET", f"small-{rng.randrange(_SMALL_OBJECTS)}")
    started = time.perf_counter()
    try:
        reply = await client.get(url, headers=headers)
        tally.record("small-get", reply.status_code, started)
    except httpx.HTTPError as exc:
        tally.record("small-get", type(exc).__name__, started)


async def _put_and_read_back(
    client: httpx.AsyncClient, target: Target, tally: Tally, rng: random.Random, name: str
) -> None:
    payload = rng.randbytes(rng.randint(1, 8) * MiB)
    url, headers = _url(target, "PUT", name)
    started = time.perf_counter()
    try:
        reply = await client.put(url, content=payload, headers=headers)
        tally.record("large-put", reply.status_code, started)
        if reply.status_code != 200:
            return
        url, headers = _url(target, "GET", name)
        started = time.perf_counter()
        back = await client.get(url, headers=headers)
        tally.record("large-get", back.status_code, started)
    except httpx.HTTPError as exc:
        tally.record("large", type(exc).__name__, started)
        return
    if back.content == payload:
        tally.verified_puts += 1
    else:
        tally.mismatched_puts += 1


async def _pushdown_get(
    client: httpx.AsyncClient, target: Target, tally: Tally, model: str
) -> None:
    url, headers = _url(target, "GET", "image.png")
    headers.update({"x-hapi-model": model, "x-hapi-split": "auto"})
    started = time.perf_counter()
    try:
        reply = await client.get(url, headers=headers)
        tally.record("pushdown-get", reply.status_code, started)
    except httpx.HTTPError as exc:
        tally.record("pushdown-get", type(exc).__name__, started)


async def _load(
    target: Target, clients: int, seconds: float, *, mixed: bool, model: str | None
) -> Tally:
    tally = Tally()
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    timeout = httpx.Timeout(60.0)

    async def client_loop(index: int) -> None:
        rng = random.Random(index)
        role = "small" if not mixed else ("large" if index % 5 == 0 else "small")
        if mixed and model is not None and index % 5 == 1:
            role = "pushdown"
        step = 0
        while time.monotonic() < deadline:
            step += 1
            if role == "large":
                await _put_and_read_back(http, target, tally, rng, f"load-{index}-{step}")
            elif role == "pushdown" and model is not None:
                await _pushdown_get(http, target, tally, model)
            else:
                await _small_get(http, target, tally, rng)

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        await asyncio.gather(*(client_loop(i) for i in range(clients)))
    return tally


def _prepare(s3: Any, model: str | None) -> str | None:
    """Small objects, a test image, and the model to push down (None: skipped)."""
    s3.create_bucket(Bucket=_BUCKET)
    for index in range(_SMALL_OBJECTS):
        s3.put_object(Bucket=_BUCKET, Key=f"small-{index}", Body=os.urandom(_SMALL_BYTES))
    if model is None:
        print("no --model given: pushdown GETs skipped (e.g. --model resnet18 exports one)")
        return None
    from PIL import Image

    from hapi import models

    image = io.BytesIO()
    Image.new("RGB", (224, 224), (120, 60, 200)).save(image, format="PNG")
    s3.put_object(Bucket=_BUCKET, Key="image.png", Body=image.getvalue())
    models.Registry(s3).register(model, models.export_model(model))
    return model


def run(
    out: Path | None,
    clients: int,
    seconds: float,
    workers: int,
    model: str | None,
    mixed_clients: int = 32,
) -> dict[str, Any]:
    """Run the load; returns (and, with ``out``, writes) the results."""
    wrk_binary()  # before anything starts: a missing wrk is one line
    env = {"HAPI_WORKERS": str(workers), "HAPI_MAX_CONNECTIONS": str(4 * clients)}
    with bench_store() as bench:
        store = bench.store
        with (
            bench.gateway("gateway.log", env) as gw,
            _nginx(bench.tmp, store.settings.port) as nginx,
        ):
            pushdown = _prepare(bench.s3, model)
            servers = {"gateway": gw.pid, "nginx": nginx.pid, "direct": store.pid}
            results = _phases(
                store.endpoint_url,
                gw,
                nginx.port if nginx.pid else None,
                (bench.key, bench.secret),
                (mixed_clients, clients),
                seconds,
                pushdown,
                servers,
            )
    results["config"] = {
        "clients": clients,
        "mixed_clients": mixed_clients,
        "seconds": seconds,
        "workers": workers,
    }
    _print(results)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"load-{workers}w.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"written: {path}")
    return results


def _phases(
    store_url: str,
    gw: BenchGateway,
    nginx_port: int | None,
    credentials: tuple[str, str],
    clients: tuple[int, int],
    seconds: float,
    model: str | None,
    servers: dict[str, int | None],
) -> dict[str, Any]:
    """The mixed phase (``clients[0]`` Python clients), then wrk's small GETs
    (``clients[1]`` connections) through each server."""
    key, secret = credentials
    store_host = store_url.removeprefix("http://")
    gateway = Target(
        "gateway", gw.url, gw.url.removeprefix("http://"), _cached(gw.url, gw.key, gw.secret)
    )
    direct = Target("direct", store_url, store_host, _cached(store_url, key, secret))
    results: dict[str, Any] = {}
    targets = [gateway]
    if nginx_port is not None:
        targets.append(
            Target("nginx", f"http://127.0.0.1:{nginx_port}", store_host, direct.presign)
        )
    targets.append(direct)
    with _RssSampler(gw.pid) as rss:
        mixed = _load(gateway, clients[0], seconds / 2, mixed=True, model=model)
        results["gateway mixed"] = asyncio.run(mixed).summary()
        for target in targets:
            url, headers = _url(target, "GET", "small-0")
            result = run_wrk(
                url,
                host=headers["host"],
                connections=clients[1],
                seconds=seconds / 6,
                server_pid=servers.get(target.name),
            )
            results[target.name] = {"wrk": result.to_dict()}
    results["gateway_rss"] = rss.summary()
    return results


def _cached(endpoint: str, key: str, secret: str) -> Callable[[str, str], str]:
    """A presigner that signs each (method, key) once: signing is not what is measured."""
    return functools.lru_cache(maxsize=4096)(_presigner(endpoint, key, secret))


def _print(results: dict[str, Any]) -> None:
    config = results["config"]
    print(
        f"load: {config['clients']} clients, {config['seconds']:g} s, {config['workers']} worker(s)"
    )
    print(f"  mixed phase: {config['mixed_clients']} Python clients")
    for name in ("gateway mixed", "gateway", "nginx", "direct"):
        if name not in results:
            continue
        phase = results[name]
        if "wrk" in phase:
            w = phase["wrk"]
            cpu = w["cpu_us_per_request"]
            print(
                f"  {name} (wrk, {config['clients']} connections): "
                f"{w['requests_per_s']:.0f} req/s, p50 {w['p50_ms']:.1f} ms, "
                f"p99 {w['p99_ms']:.1f} ms, {w['timeouts']} timeouts, "
                f"{w['errors'] + w['non_2xx']} errors"
                + ("" if cpu is None else f", {cpu:.0f} CPU us/request")
            )
            continue
        print(f"  {name}: statuses {phase['statuses']}")
        for kind, figures in phase["latency_ms"].items():
            rate = figures["count"] / (config["seconds"] / (2 if name == "gateway mixed" else 6))
            print(
                f"    {kind:13} n={figures['count']:6d} ({rate:7.1f}/s)  "
                f"p50 {figures['p50']:8.2f} ms  p99 {figures['p99']:8.2f} ms"
            )
        if name == "gateway mixed":
            print(
                f"    PUTs read back identical: {phase['verified_puts']}, "
                f"mismatched: {phase['mismatched_puts']}"
            )
    rss = results["gateway_rss"]
    print(
        f"  gateway RSS (all processes): start {rss['start_mib']} MiB, "
        f"peak {rss['peak_mib']} MiB, end {rss['end_mib']} MiB"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--clients", type=int, default=150, help="wrk's connections for the small GETs"
    )
    parser.add_argument(
        "--mixed-clients", type=int, default=32, help="Python clients of the mixed phase"
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the whole run")
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes")
    parser.add_argument(
        "--model", help="a model family to export and register for pushdown GETs (needs torch)"
    )
    parser.add_argument("--out", type=Path, help="directory for the JSON results")
    args = parser.parse_args(argv)
    if args.clients <= 0 or args.seconds <= 0 or args.workers <= 0:
        parser.error("--clients, --seconds and --workers must be positive")
    run(args.out, args.clients, args.seconds, args.workers, args.model, args.mixed_clients)


if __name__ == "__main__":
    main()
