"""Load from a C load generator (wrk), so the server, not the client, is what is measured.

Python clients saturate two cores long before a server does (150 asyncio clients top out
near 100 requests/s here); wrk drives thousands per second from one thread. Each run
reports requests/s, p50/p99 latency, timeouts and errors, and the CPU the server's
processes (the pid and all its descendants) spent per request, which moves far less than
wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hapi_bench.core._errors import BenchError, TestbedUnavailable

_CLOCK_TICKS = 100  # USER_HZ: /proc/PID/stat times are in these (100 on Linux)
_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


@dataclass(frozen=True)
class WrkResult:
    """One wrk run against one server."""

    requests: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    timeouts: int
    errors: int  # connect, read and write errors
    non_2xx: int
    cpu_us_per_request: float | None  # the server's user + system CPU, all its processes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WrkRequest:
    """One request of a list wrk cycles through (signed headers, a body for a POST)."""

    method: str
    path: str  # with its query
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


def wrk_script(requests: Sequence[WrkRequest]) -> str:
    """A wrk Lua script that sends ``requests`` in turn, round-robin over all connections.

    Each request is formatted once, when the script loads, so the per-request cost in
    wrk stays a table lookup.
    """
    if not requests:
        raise BenchError("wrk needs at least one request")
    lines = ["local requests = {}"]
    for item in requests:
        headers = ", ".join(
            f"[ {_lua_string(name)} ] = {_lua_string(value)}"
            for name, value in item.headers.items()
        )
        body = _lua_string(item.body.decode("latin-1")) if item.body else "nil"
        lines.append(
            f"requests[#requests + 1] = wrk.format({_lua_string(item.method)}, "
            f"{_lua_string(item.path)}, {{{headers}}}, {body})"
        )
    lines += [
        "local sent = 0",
        "request = function()",
        "  sent = sent + 1",
        "  return requests[(sent - 1) % #requests + 1]",
        "end",
    ]
    return "\n".join(lines) + "\n"


def _lua_string(text: str) -> str:
    """A Lua long-bracket literal holding ``text`` exactly (no escapes are read inside)."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    fence = "=" * level
    # A long bracket drops a newline right after its opening: start with one of its own.
    return f"[{fence}[\n{text}]{fence}]"


def wrk_binary() -> str:
    """The wrk executable.

    Raises:
        BenchError: wrk is not installed (``apt-get install wrk``; the Makefile does it).
    """
    found = shutil.which("wrk")
    if found is None:
        raise BenchError("wrk is not installed: apt-get install wrk (make bench-load does)")
    return found


def run_wrk(
    url: str,
    *,
    host: str | None = None,
    connections: int = 150,
    seconds: float = 10.0,
    threads: int = 1,
    timeout_s: float = 2.0,
    server_pid: int | None = None,
    requests: Sequence[WrkRequest] = (),
) -> WrkResult:
    """Drive ``url`` with GETs from ``connections`` keep-alive connections for ``seconds``.

    Args:
        url: What every request GETs (a presigned URL serves: its signature is in the query),
            or, with ``requests``, the server's base URL.
        host: A ``Host`` header to claim (the URL's own by default).
        connections: Open connections, each with one request in flight.
        seconds: How long.
        threads: wrk threads (one saturates most single-process servers).
        timeout_s: A request slower than this counts as a timeout (whole seconds).
        server_pid: The server whose CPU per request is measured (its descendants too).
        requests: Send these in turn instead of GETs of ``url`` (see :func:`wrk_script`).
    """
    command = [
        wrk_binary(),
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        f"--timeout={max(1, round(timeout_s))}s",
        "--latency",
    ]
    if host is not None:
        command += ["-H", f"Host: {host}"]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="hapi-wrk-") as script:
        if requests:
            script.write(wrk_script(requests))
            script.flush()
            command += ["-s", script.name]
        before = cpu_seconds(server_pid) if server_pid else None
        done = subprocess.run(
            [*command, url], capture_output=True, text=True, timeout=seconds + 60, check=False
        )
        after = cpu_seconds(server_pid) if server_pid else None
    if done.returncode != 0:
        said = (done.stderr + done.stdout).strip()[-500:]
        raise BenchError(f"wrk failed ({done.returncode}) on {url}: {said}")
    result = parse_wrk(done.stdout)
    if before is not None and after is not None and result.requests:
        per_request = (after - before) / result.requests * 1e6
        result = WrkResult(**{**result.to_dict(), "cpu_us_per_request": per_request})
    return result


def parse_wrk(text: str) -> WrkResult:
    """The figures of wrk's report (with ``--latency``).

    Raises:
        BenchError: The report lacks the request count or the latency distribution.
    """
    total = re.search(r"^\s*(\d+) requests in", text, re.M)
    rate = re.search(r"^Requests/sec:\s*([\d.]+)", text, re.M)
    p50 = re.search(r"^\s*50%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
    p99 = re.search(r"^\s*99%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
    if not (total and rate and p50 and p99):
        raise BenchError(f"unreadable wrk report:\n{text[-1000:]}")
    sockets = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text
    )
    connect, read, write, timeouts = (int(g) for g in sockets.groups()) if sockets else (0,) * 4
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    return WrkResult(
        requests=int(total.group(1)),
        requests_per_s=float(rate.group(1)),
        p50_ms=float(p50.group(1)) * _UNITS_MS[p50.group(2)],
        p99_ms=float(p99.group(1)) * _UNITS_MS[p99.group(2)],
        timeouts=timeouts,
        errors=connect + read + write,
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        cpu_us_per_request=None,
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant."""
    total = 0.0
    for proc in [pid, *_descendants(pid)]:
        try:
            total += _stat_cpu(Path(f"/proc/{proc}/stat"))
        except OSError:
            continue  # gone meanwhile
    return total


def thread_cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of one thread of ``pid`` (its main thread by default:
    for the gateway, the event loop's)."""
    return _stat_cpu(Path(f"/proc/{pid}/task/{pid if tid is None else tid}/stat"))


def _stat_cpu(stat: Path) -> float:
    """utime + stime of a ``/proc`` ``stat`` file, in seconds."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def wrk_main(
    prog: str,
    doc: str | None,
    run: Callable[[Path, int, float, int], object],
    argv: list[str] | None,
    *,
    rounds: int,
    seconds: float,
) -> None:
    """The command line of a benchmark of interleaved wrk rounds: ``--out``, ``--rounds``,
    ``--seconds``, ``--connections``, checked before ``run(out, rounds, seconds,
    connections)`` starts anything; what stops it is one line (exit 2 if nothing could
    start, 1 if a run failed)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds")
    parser.add_argument("--seconds", type=float, default=seconds, help="seconds of each wrk run")
    parser.add_argument("--connections", type=int, default=150, help="wrk's connections")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.connections < 1:
        parser.error("--rounds and --connections must be at least 1, --seconds above 0")
    try:
        run(args.out, args.rounds, args.seconds, args.connections)
    except TestbedUnavailable as exc:  # nothing started: one line, exit 2
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except BenchError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
