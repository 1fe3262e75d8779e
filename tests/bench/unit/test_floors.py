"""``hapi-bench floors``: the layers it adds up, and the floor it times in-process."""

from __future__ import annotations

import httpx

from hapi_bench.micro import _floors


def test_the_layers_are_the_floors_medians_and_the_rest_is_the_gateway_s_own(tmp_path):
    cpu = {
        "protocol": [12.0, 10.0, 11.0],
        "edge": [30.0, 26.0, 28.0],
        "gateway": [220.0, 200.0, 216.0],
        "app": [112.0, 114.0, 110.0],
    }
    rates = {"protocol": [90000.0, 80000.0, 85000.0], "edge": [], "gateway": [4200.0]}
    results = _floors.summarize(cpu, rates)
    assert results["layers"] == {
        "parser, loop and sockets (protocol)": 11.0,
        "ASGI server (edge - protocol)": 17.0,
        "the app and its store exchange (app)": 112.0,
    }
    assert results["sum_of_layers_us"] == 140.0
    assert results["gateway_us"] == 216.0
    assert results["unexplained_us"] == 76.0
    assert results["floors"]["protocol"]["range"] == [10.0, 12.0]
    assert results["floors"]["protocol"]["requests_per_s"] == 85000.0
    assert "requests_per_s" not in results["floors"]["edge"]  # none measured
    assert results["floors"]["app"]["runs"] == [112.0, 114.0, 110.0]
    _floors.plot(tmp_path / "floors.png", results)
    assert (tmp_path / "floors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = _floors.table(results).splitlines()
    assert lines[-2].split()[-1] == "140.0" and lines[-1].split()[-1] == "216.0"


def test_the_in_process_app_floor_is_the_gateway_serving_the_object_whole(tmp_path):
    # a floor is only a floor if the request it times is served: verified, forwarded to
    # the store (here the bare protocol server) and its 4 KiB relayed; a refusal raises
    with _floors._server("protocol", tmp_path / "protocol.log") as (url, _pid):
        assert len(httpx.get(url + "/any", trust_env=False).content) == _floors.BODY_BYTES
        assert _floors.app_cpu_us(url, 64) > 0
