"""Reading wrk's report, and CPU seconds of a process tree."""

from __future__ import annotations

import http.server
import importlib
import os
import subprocess
import sys
import threading
import time

import pytest

from hapi_bench.core._errors import BenchError
from hapi_bench.micro._wrk import WrkRequest, cpu_seconds, parse_wrk, run_wrk, wrk_script

REPORT = """Running 10s test @ http://127.0.0.1:8080/bench/small?X-Amz-Signature=abc
  1 threads and 150 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    40.21ms   30.10ms   1.42s    91.00%
    Req/Sec     3.75k   400.00     4.50k    70.00%
  Latency Distribution
     50%   36.70ms
     75%   45.00ms
     90%   60.00ms
     99%  337.10ms
  37440 requests in 10.00s, 160.00MB read
  Socket errors: connect 0, read 2, write 1, timeout 7
  Non-2xx or 3xx responses: 3
Requests/sec:   3743.97
Transfer/sec:     16.00MB
"""


def test_a_report_gives_rate_percentiles_timeouts_and_errors() -> None:
    result = parse_wrk(REPORT)
    assert result.requests == 37440 and result.requests_per_s == pytest.approx(3743.97)
    assert result.p50_ms == pytest.approx(36.7) and result.p99_ms == pytest.approx(337.1)
    assert (result.timeouts, result.errors, result.non_2xx) == (7, 3, 3)
    clean = parse_wrk(REPORT.replace("Socket errors: connect 0, read 2, write 1, timeout 7\n", ""))
    assert (clean.timeouts, clean.errors) == (0, 0)
    seconds = parse_wrk(REPORT.replace("99%  337.10ms", "99%    1.50s"))
    assert seconds.p99_ms == pytest.approx(1500.0)


def test_an_unreadable_report_is_an_error() -> None:
    with pytest.raises(BenchError, match="unreadable wrk report"):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused")


def test_cpu_seconds_count_a_process_and_its_children() -> None:
    burn = (
        "import time\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\ntime.sleep(5)\n"  # alive when measured
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {burn!r}]); time.sleep(3)",
        ]
    )
    try:
        time.sleep(1.5)
        assert cpu_seconds(parent.pid) >= 0.25  # the child's burn is counted for the parent
        assert cpu_seconds(os.getpid()) > 0
    finally:
        parent.kill()
        parent.wait()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers 200 to anything and keeps what it received."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, dict[str, str], bytes]] = []

    def _answer(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size) if size else b""
        self.seen.append((self.command, self.path, dict(self.headers), body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def test_wrk_sends_the_listed_requests_exactly() -> None:
    """Signed headers and bodies reach the server byte for byte, in turn, even when they
    hold what would end a Lua long string."""
    tricky = b'{"keys": ["a]]b", "c]=]d"], "split": 1}\n'
    requests = [
        WrkRequest("POST", "/bench?hapi-batch", {"Authorization": "AWS4 x]]y", "X-A": "1"}, tricky),
        WrkRequest("GET", "/bench/k%20ey.jpg?hapi-model=m&hapi-split=3", {"X-A": "2"}),
    ]
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = run_wrk(
            f"http://127.0.0.1:{server.server_address[1]}",
            connections=1,
            seconds=1,
            requests=requests,
        )
    finally:
        server.shutdown()
    assert result.requests >= 2 and result.non_2xx == 0
    posts = [seen for seen in _Recorder.seen if seen[0] == "POST"]
    gets = [seen for seen in _Recorder.seen if seen[0] == "GET"]
    assert posts and gets and len(posts) + len(gets) == len(_Recorder.seen)
    for _, path, headers, body in posts:
        assert (path, body) == ("/bench?hapi-batch", tricky)
        assert headers["Authorization"] == "AWS4 x]]y" and headers["X-A"] == "1"
    for _, path, headers, body in gets:
        assert (path, body) == ("/bench/k%20ey.jpg?hapi-model=m&hapi-split=3", b"")
        assert headers["X-A"] == "2"
    assert abs(len(posts) - len(gets)) <= 1  # in turn


def test_a_script_needs_requests() -> None:
    with pytest.raises(BenchError, match="at least one request"):
        wrk_script([])


@pytest.mark.parametrize("command", ["servers", "floors"])
@pytest.mark.parametrize(
    "args", [["--rounds", "0"], ["--seconds", "0"], ["--connections", "0"], ["--seconds", "x"]]
)
def test_options_out_of_range_are_refused_before_anything_starts(
    command: str,
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    module = importlib.import_module(f"hapi_bench.micro._{command}")
    monkeypatch.setattr(module, "run", lambda *a: pytest.fail("started"))
    with pytest.raises(SystemExit) as stopped:
        module.main(args)
    assert stopped.value.code == 2
    assert f"hapi-bench {command}" in capsys.readouterr().err
