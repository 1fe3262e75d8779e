"""``make bench-proxy``: pass-through cost of the gateway, against direct access and nginx.

Starts a real embedded store, the gateway (``hapi serve``) and nginx as a plain reverse
proxy (one worker, buffering off, upstream keep-alive), then measures in one interleaved
run: 64 MiB GET and PUT throughput, 4 KiB GET latency from one client (p50, p99), and
presigned 4 KiB GETs under load from wrk (``--connections``, 150 by default): requests/s,
p50/p99, timeouts and each server's CPU per request, medians over ``--rounds`` interleaved
rounds. Writes JSON and prints the ratios. Run as ``hapi-bench proxy --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
from botocore.config import Config
from tqdm import tqdm

from hapi.store import free_port
from hapi_bench.core._host import cpu_model
from hapi_bench.micro._gateway import BenchGateway, bench_store
from hapi_bench.micro._wrk import WrkResult, run_wrk, wrk_binary

MiB = 1024 * 1024
_NGINX_CONF = """
worker_processes 1; daemon off; pid {tmp}/nginx.pid; error_log {tmp}/nginx.err warn; user root;
events {{ worker_connections 1024; }}
http {{
  access_log off; client_max_body_size 0; proxy_request_buffering off; proxy_buffering off;
  client_body_temp_path {tmp}/b; proxy_temp_path {tmp}/p; fastcgi_temp_path {tmp}/f;
  uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;
  upstream store {{ server 127.0.0.1:{store_port}; keepalive 32; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{ proxy_pass http://store; proxy_http_version 1.1;
                 proxy_set_header Connection ""; proxy_set_header Host $http_host; }}
  }}
}}
"""


@dataclass
class Target:
    """One way to reach the store: a base URL to send to, a Host to claim, a signer."""

    name: str
    send_to: str
    host: str
    presign: Callable[[str, str], str]


def _presigner(endpoint: str, key: str, secret: str) -> Callable[[str, str], str]:
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(signature_version="s3v4"),
    )

    def presign(method: str, obj: str) -> str:
        op = {"GET": "get_object", "PUT": "put_object"}[method]
        return str(
            s3.generate_presigned_url(op, Params={"Bucket": "bench", "Key": obj}, ExpiresIn=7200)
        )

    return presign


def _url(target: Target, method: str, obj: str) -> tuple[str, dict[str, str]]:
    signed = httpx.URL(target.presign(method, obj))
    sent = httpx.URL(target.send_to).copy_with(raw_path=signed.raw_path)
    return str(sent), {"host": target.host}


def _get_mib_s(client: httpx.Client, target: Target, size: int) -> float:
    url, headers = _url(target, "GET", "big")
    start, got = time.perf_counter(), 0
    with client.stream("GET", url, headers=headers) as reply:
        reply.raise_for_status()
        for chunk in reply.iter_raw(1 * MiB):
            got += len(chunk)
    assert got == size, f"{target.name}: got {got} of {size} bytes"
    return size / MiB / (time.perf_counter() - start)


def _put_mib_s(client: httpx.Client, target: Target, payload: bytes) -> float:
    url, headers = _url(target, "PUT", f"put-{target.name}")
    view = memoryview(payload)

    def body() -> Iterator[bytes]:
        for i in range(0, len(view), MiB):
            yield bytes(view[i : i + MiB])

    start = time.perf_counter()
    reply = client.put(
        url, content=body(), headers={**headers, "content-length": str(len(payload))}
    )
    reply.raise_for_status()
    return len(payload) / MiB / (time.perf_counter() - start)


def _small_latencies_ms(client: httpx.Client, target: Target, count: int) -> list[float]:
    url, headers = _url(target, "GET", "small")
    client.get(url, headers=headers).raise_for_status()  # warm the connection
    out = []
    for _ in range(count):
        start = time.perf_counter()
        client.get(url, headers=headers).raise_for_status()
        out.append((time.perf_counter() - start) * 1000)
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# The pass-through's goals under wrk (issue 40): requests/s against nginx's in the same run,
# p99 against nginx's, no timeouts, and the gateway's CPU (user + system) per request.
_LOAD_GOAL = {
    "requests_per_s_ratio_min": 0.6,
    "p99_ratio_max": 2.0,
    "timeouts": 0,
    "gateway_cpu_us_per_request_max": 150,
}


def _us(value: object) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value:.0f}"


@dataclass(frozen=True)
class LoadSpec:
    """The wrk phase: connections and seconds per run (0 seconds: skip it)."""

    connections: int = 150
    seconds: float = 10.0


def run(
    out: Path,
    size_mib: int,
    rounds: int,
    small_count: int,
    rss_mib: int = 1024,
    load: LoadSpec = LoadSpec(),
) -> dict[str, object]:
    """Run the benchmark; returns (and writes) the results."""
    if load.seconds:
        wrk_binary()  # before anything starts: a missing wrk is one line
    with bench_store() as bench:
        store = bench.store
        with (
            bench.gateway("gateway.log") as gw,
            _nginx(bench.tmp, store.settings.port) as nginx,
        ):
            pids = {"direct": store.pid, "gateway": gw.pid, "nginx": nginx.pid}
            return _measure(
                out,
                store.endpoint_url,
                gw,
                nginx.port if nginx.pid else None,
                bench.key,
                bench.secret,
                size_mib,
                rounds,
                small_count,
                rss_mib,
                load,
                {name: pid for name, pid in pids.items() if pid},
            )


def _measure(
    out: Path,
    store_url: str,
    gw: BenchGateway,
    nginx_port: int | None,
    key: str,
    secret: str,
    size_mib: int,
    rounds: int,
    small_count: int,
    rss_mib: int,
    load: LoadSpec,
    pids: dict[str, int],
) -> dict[str, object]:
    store_host = httpx.URL(store_url).netloc.decode()
    direct = _presigner(store_url, key, secret)
    targets = [
        Target("direct", store_url, store_host, direct),
        Target(
            "gateway",
            gw[0],
            httpx.URL(gw[0]).netloc.decode(),
            _presigner(gw.url, gw.key, gw.secret),
        ),
    ]
    if nginx_port:
        targets.append(Target("nginx", f"http://127.0.0.1:{nginx_port}", store_host, direct))
    payload = os.urandom(size_mib * MiB)
    admin = boto3.client(
        "s3",
        endpoint_url=store_url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )
    admin.create_bucket(Bucket="bench")
    admin.put_object(Bucket="bench", Key="big", Body=payload)
    admin.put_object(Bucket="bench", Key="small", Body=os.urandom(4096))
    samples: dict[str, dict[str, list[float]]] = {
        t.name: {"get": [], "put": [], "lat": []} for t in targets
    }
    with httpx.Client(timeout=120, trust_env=False) as client:
        for _ in tqdm(range(rounds), desc="bench-proxy rounds", unit="round"):
            for t in targets:  # interleaved, so drift in machine load hits every target alike
                samples[t.name]["get"].append(_get_mib_s(client, t, len(payload)))
                samples[t.name]["put"].append(_put_mib_s(client, t, payload))
                samples[t.name]["lat"] += _small_latencies_ms(client, t, small_count // rounds)
        memory = _rss_growth(client, targets[1], gw, rss_mib) if rss_mib else None
    loads: dict[str, list[WrkResult]] = {t.name: [] for t in targets}
    for _ in tqdm(range(rounds if load.seconds else 0), desc="wrk rounds", unit="round"):
        for t in targets:
            url, headers = _url(t, "GET", "small")
            loads[t.name].append(
                run_wrk(
                    url,
                    host=headers["host"],
                    connections=load.connections,
                    seconds=load.seconds,
                    server_pid=pids.get(t.name),
                )
            )
    return _report(out, samples, size_mib, memory, loads, load)


def _rss_growth(
    client: httpx.Client, target: Target, gw: BenchGateway, size_mib: int
) -> dict[str, float]:
    """Peak RSS growth of the gateway while a ``size_mib`` object goes up and comes back."""
    gw.reset_peak_rss()
    base = gw.rss_bytes()
    block = os.urandom(MiB)
    url, headers = _url(target, "PUT", "rss")
    body = (block for _ in range(size_mib))
    client.put(
        url, content=body, headers={**headers, "content-length": str(size_mib * MiB)}
    ).raise_for_status()
    url, headers = _url(target, "GET", "rss")
    with client.stream("GET", url, headers=headers) as reply:
        got = sum(len(chunk) for chunk in reply.iter_raw(MiB))
    assert got == size_mib * MiB, f"read back {got} bytes"
    return {"object_mib": size_mib, "peak_rss_growth_mib": (gw.rss_bytes("VmHWM") - base) / MiB}


def _report(
    out: Path,
    samples: dict[str, dict[str, list[float]]],
    size_mib: int,
    memory: dict[str, float] | None,
    loads: dict[str, list[WrkResult]],
    load: LoadSpec,
) -> dict[str, object]:
    results: dict[str, object] = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "object_mib": size_mib,
        "gateway_memory": memory,
    }
    if any(loads.values()):
        results["under_load"] = _load_summary(loads, load)
    for name, s in samples.items():
        results[name] = {
            "get_mib_s": statistics.median(s["get"]),
            "put_mib_s": statistics.median(s["put"]),
            "small_get_p50_ms": _percentile(s["lat"], 0.5),
            "small_get_p99_ms": _percentile(s["lat"], 0.99),
        }
    direct, gw = results["direct"], results["gateway"]
    assert isinstance(direct, dict) and isinstance(gw, dict)
    results["gateway_vs_direct"] = {
        "get_ratio": gw["get_mib_s"] / direct["get_mib_s"],
        "put_ratio": gw["put_mib_s"] / direct["put_mib_s"],
        "added_p50_ms": gw["small_get_p50_ms"] - direct["small_get_p50_ms"],
        "targets": {"throughput_ratio_min": 0.8, "added_p50_ms_max": 2.0},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-proxy.json").write_text(json.dumps(results, indent=2))
    _print(results, [n for n in samples])
    return results


def _print(results: dict[str, object], names: list[str]) -> None:
    print(f"\n{'target':<10}{'GET MiB/s':>12}{'PUT MiB/s':>12}{'4KiB p50 ms':>14}{'p99 ms':>10}")
    for name in names:
        r = results[name]
        assert isinstance(r, dict)
        print(
            f"{name:<10}{r['get_mib_s']:>12.0f}{r['put_mib_s']:>12.0f}"
            f"{r['small_get_p50_ms']:>14.2f}{r['small_get_p99_ms']:>10.2f}"
        )
    ratio = results["gateway_vs_direct"]
    assert isinstance(ratio, dict)
    print(
        f"\ngateway/direct: GET {ratio['get_ratio']:.2f}x, PUT {ratio['put_ratio']:.2f}x "
        f"(target >= 0.8x); added p50 {ratio['added_p50_ms']:+.2f} ms (target <= 2 ms)"
    )
    under = results.get("under_load")
    if isinstance(under, dict):
        _print_load(under)
    memory = results.get("gateway_memory")
    if isinstance(memory, dict):
        print(
            f"gateway peak RSS growth for a {memory['object_mib']:.0f} MiB PUT + GET: "
            f"{memory['peak_rss_growth_mib']:.1f} MiB (target < 100 MiB)"
        )


def _load_summary(loads: dict[str, list[WrkResult]], load: LoadSpec) -> dict[str, object]:
    """Medians (and ranges) over the rounds, per target, and the gateway against nginx."""
    summary: dict[str, object] = {"connections": load.connections, "seconds": load.seconds}
    for name, runs in loads.items():
        rates = [r.requests_per_s for r in runs]
        cpu = [r.cpu_us_per_request for r in runs if r.cpu_us_per_request is not None]
        summary[name] = {
            "requests_per_s": statistics.median(rates),
            "requests_per_s_range": [min(rates), max(rates)],
            "p50_ms": statistics.median(r.p50_ms for r in runs),
            "p99_ms": statistics.median(r.p99_ms for r in runs),
            "timeouts": sum(r.timeouts for r in runs),
            "errors": sum(r.errors + r.non_2xx for r in runs),
            "cpu_us_per_request": statistics.median(cpu) if cpu else None,
            "runs": [r.to_dict() for r in runs],
        }
    gateway, nginx = summary.get("gateway"), summary.get("nginx")
    if isinstance(gateway, dict) and isinstance(nginx, dict):
        summary["gateway_vs_nginx"] = {
            "requests_per_s_ratio": gateway["requests_per_s"] / nginx["requests_per_s"],
            "p99_ratio": gateway["p99_ms"] / nginx["p99_ms"] if nginx["p99_ms"] else None,
            "gateway_cpu_us_per_request": gateway["cpu_us_per_request"],
            "goal": _LOAD_GOAL,
        }
    return summary


def _print_load(under: dict[str, object]) -> None:
    print(f"\n4 KiB presigned GETs from wrk, {under['connections']} connections:")
    print(
        f"{'target':<10}{'req/s':>10}{'range':>18}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'timeouts':>10}{'errors':>8}{'CPU us/req':>12}"
    )
    for name in ("direct", "nginx", "gateway"):
        r = under.get(name)
        if not isinstance(r, dict):
            continue
        low, high = r["requests_per_s_range"]
        cpu = r["cpu_us_per_request"]
        print(
            f"{name:<10}{r['requests_per_s']:>10.0f}{f'{low:.0f}-{high:.0f}':>18}"
            f"{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['timeouts']:>10}{r['errors']:>8}"
            f"{'' if cpu is None else f'{cpu:.0f}':>12}"
        )
    ratio = under.get("gateway_vs_nginx")
    if isinstance(ratio, dict):
        p99 = ratio["p99_ratio"]
        print(
            f"gateway/nginx: {ratio['requests_per_s_ratio']:.2f}x requests/s "
            f"(goal >= {_LOAD_GOAL['requests_per_s_ratio_min']}x), "
            f"p99 {'n/a' if p99 is None else f'{p99:.1f}x'} "
            f"(goal <= {_LOAD_GOAL['p99_ratio_max']:.0f}x), "
            f"gateway CPU {_us(ratio['gateway_cpu_us_per_request'])} us a request "
            f"(goal <= {_LOAD_GOAL['gateway_cpu_us_per_request_max']})"
        )


class _nginx:
    def __init__(self, tmp: Path, store_port: int) -> None:
        self.tmp, self.store_port = tmp, store_port
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int = free_port()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def __enter__(self) -> _nginx:
        nginx = shutil.which("nginx") or (
            "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
        )
        if nginx is None:
            print("nginx not found (apt-get install nginx-light): comparing with direct only")
            return self
        conf = self.tmp / "nginx.conf"
        conf.write_text(
            _NGINX_CONF.format(tmp=self.tmp, store_port=self.store_port, port=self.port)
        )
        self.proc = subprocess.Popen([nginx, "-c", str(conf)], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small-count", type=int, default=1000)
    parser.add_argument(
        "--rss-mib",
        type=int,
        default=1024,
        help="object size for the gateway memory check (0: skip)",
    )
    parser.add_argument(
        "--connections", type=int, default=150, help="wrk's connections in the load phase"
    )
    parser.add_argument(
        "--load-seconds",
        type=float,
        default=10.0,
        help="seconds of each wrk run (one per target per round; 0: skip the load phase)",
    )
    args = parser.parse_args(argv)
    load = LoadSpec(args.connections, args.load_seconds)
    run(args.out, args.size_mib, args.rounds, args.small_count, args.rss_mib, load)


if __name__ == "__main__":
    main()
