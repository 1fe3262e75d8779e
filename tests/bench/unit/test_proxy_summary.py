"""bench-proxy's load summary: medians over rounds, and the gateway against nginx's goals."""

from __future__ import annotations

from hapi_bench.micro._proxy import LoadSpec, _load_summary
from hapi_bench.micro._wrk import WrkResult


def _run(rate: float, p99: float, cpu: float | None) -> WrkResult:
    return WrkResult(
        requests=int(rate * 10),
        requests_per_s=rate,
        p50_ms=p99 / 3,
        p99_ms=p99,
        timeouts=0,
        errors=0,
        non_2xx=0,
        cpu_us_per_request=cpu,
    )


def test_the_gateway_is_judged_by_medians_against_nginx_and_its_own_cpu_a_request():
    loads = {
        "gateway": [_run(5000, 50, 180), _run(5600, 40, 160), _run(5400, 60, 170)],
        "nginx": [_run(8000, 40, 40), _run(9000, 20, 38), _run(7000, 30, 45)],
    }
    summary = _load_summary(loads, LoadSpec(150, 10))
    gateway = summary["gateway"]
    assert gateway["requests_per_s"] == 5400 and gateway["requests_per_s_range"] == [5000, 5600]
    assert gateway["cpu_us_per_request"] == 170
    versus = summary["gateway_vs_nginx"]
    assert versus["requests_per_s_ratio"] == 5400 / 8000
    assert versus["p99_ratio"] == 50 / 30
    assert versus["gateway_cpu_us_per_request"] == 170
    assert versus["goal"] == {
        "requests_per_s_ratio_min": 0.6,
        "p99_ratio_max": 2.0,
        "timeouts": 0,
        "gateway_cpu_us_per_request_max": 150,
    }


def test_a_gateway_without_cpu_figures_has_none():
    loads = {"gateway": [_run(5000, 50, None)], "nginx": [_run(8000, 40, None)]}
    versus = _load_summary(loads, LoadSpec(150, 10))["gateway_vs_nginx"]
    assert versus["gateway_cpu_us_per_request"] is None
