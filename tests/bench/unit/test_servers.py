"""``hapi-bench servers``: its medians, and the one line it gives where it cannot run."""

from __future__ import annotations

import importlib.util

import pytest

from hapi_bench.micro import _servers
from tests.bench.unit.test_proxy_summary import _run


def test_a_servers_figures_are_medians_of_its_rounds_and_keep_every_run():
    runs = [_run(4000, 70, 240), _run(3600, 90, None), _run(3900, 50, 230), _run(4100, 60, 260)]
    summary = _servers._summary(runs)
    assert summary["median"] == {
        "requests_per_s": 3950,
        "p99_ms": 65,
        "cpu_us_per_request": 240,  # the rounds that measured it
    }
    assert [run["requests_per_s"] for run in summary["runs"]] == [4000, 3600, 3900, 4100]


def test_without_granian_it_says_how_to_install_it_in_one_line_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path
):
    found = importlib.util.find_spec
    monkeypatch.setattr(_servers, "wrk_binary", lambda: "wrk")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "granian" else found(name)
    )
    with pytest.raises(SystemExit) as stopped:
        _servers.main(["--out", str(tmp_path), "--rounds", "1"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "granian is not installed" in err
    assert "pip install" in err
    assert not list(tmp_path.iterdir())  # nothing started, nothing written
