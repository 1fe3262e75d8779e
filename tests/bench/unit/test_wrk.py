"""Reading wrk's report, and CPU seconds of a process tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hapi_bench._errors import BenchError
from hapi_bench._wrk import cpu_seconds, parse_wrk

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
