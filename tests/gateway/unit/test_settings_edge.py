"""Every GatewaySettings field reaches the edge: one variable, one flag, typed, documented."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hapi.gateway import (
    GatewaySettings,
    environment_variables,
    markdown_table,
    serve,
    settings_knobs,
)
from hapi.gateway import _cli as gateway_cli
from hapi.gateway._knobs import knobs
from hapi.protocol import Credentials

ROOT = Path(__file__).resolve().parents[3]
BASE_ENV = {
    "HAPI_BACKEND_URL": "http://store.internal:8333",
    "HAPI_BACKEND_ACCESS_KEY_ID": "BACKEND",
    "HAPI_BACKEND_SECRET_ACCESS_KEY": "backend-secret",
    "HAPI_ACCESS_KEY_ID": "CLIENT",
    "HAPI_SECRET_ACCESS_KEY": "client-secret",
}


def test_every_field_has_exactly_one_variable_and_one_flag() -> None:
    fields = [f.name for f in dataclasses.fields(GatewaySettings)]
    items = settings_knobs()
    assert [k.field for k in items] == fields
    assert len({k.env for k in items}) == len({k.flag for k in items}) == len(fields)
    assert all(k.env.startswith("HAPI_") and k.flag.startswith("--") and k.help for k in items)


def test_serve_help_lists_every_flag_and_variable() -> None:
    done = CliRunner().invoke(serve, ["--help"], terminal_width=400)
    assert done.exit_code == 0, done.output
    for item in settings_knobs():
        assert item.flag in done.output and item.env in done.output, item.field


def test_configuration_page_has_the_generated_table() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    table = markdown_table(settings_knobs())
    assert table in page, (
        "docs/configuration.md's table is stale; regenerate it with\n"
        "python -c 'from hapi.gateway import markdown_table, settings_knobs; "
        "print(markdown_table(settings_knobs()))'"
    )
    for name in environment_variables():
        assert f"`{name}`" in page, name


def _served(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]) -> Any:
    captured: list[GatewaySettings] = []
    monkeypatch.setattr(gateway_cli, "listen", lambda host, port: None)  # no real port
    monkeypatch.setattr(gateway_cli, "run_gateway", lambda s, host, port, **_: captured.append(s))
    for name in environment_variables() | {k.env for k in settings_knobs()}:
        monkeypatch.delenv(name, raising=False)
    done = CliRunner().invoke(serve, args, env={**BASE_ENV, **env})
    assert done.exit_code == 0, done.output
    (settings,) = captured
    return settings


FLAGS = [
    *("--region", "eu-west-1", "--max-skew-s", "60", "--decode-workers", "3"),
    *("--intra-op-threads", "2", "--max-object-bytes", "1MiB", "--connect-timeout-s", "1.5"),
    *("--read-timeout-s", "30", "--domain", "a.test", "--domain", "b.test,c.test"),
    *("--public-metrics", "--max-probe-bytes", "4MiB", "--assumed-bandwidth", "10gbit"),
]
TYPED = {
    "region": "eu-west-1",
    "max_skew_s": 60.0,
    "decode_workers": 3,
    "intra_op_threads": 2,
    "max_object_bytes": 1024**2,
    "connect_timeout_s": 1.5,
    "read_timeout_s": 30.0,
    "virtual_host_domains": ("a.test", "b.test", "c.test"),
    "public_metrics": True,
    "max_probe_bytes": 4 * 1024**2,
    "assumed_bandwidth_bps": 10e9,
}


def test_flags_arrive_as_typed_values(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _served(monkeypatch, FLAGS, {})
    assert {name: getattr(settings, name) for name in TYPED} == TYPED
    assert settings.backend_credentials == Credentials("BACKEND", "backend-secret")
    assert dict(settings.client_secrets) == {"CLIENT": "client-secret"}


def test_variables_arrive_as_the_same_typed_values(monkeypatch: pytest.MonkeyPatch) -> None:
    by_flag = {k.flag: k.env for k in settings_knobs()}
    env: dict[str, str] = {}
    pairs = iter(FLAGS)
    for flag in pairs:
        value = "true" if flag == "--public-metrics" else next(pairs)
        env[by_flag[flag]] = f"{env[by_flag[flag]]},{value}" if by_flag[flag] in env else value
    settings = _served(monkeypatch, [], env)
    assert {name: getattr(settings, name) for name in TYPED} == TYPED


def test_flags_win_over_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _served(monkeypatch, ["--region", "eu-west-1"], {"HAPI_REGION": "us-west-2"})
    assert settings.region == "eu-west-1"


def test_bad_values_name_their_variable_or_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="HAPI_MAX_SKEW_S"):
        GatewaySettings.from_env({**BASE_ENV, "HAPI_MAX_SKEW_S": "soon"})
    done = CliRunner().invoke(serve, ["--max-object-bytes", "huge"], env=BASE_ENV)
    assert done.exit_code == 2 and "--max-object-bytes" in done.output


def test_a_size_of_zero_means_none_where_the_field_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    zeros = ["--cache-max-bytes", "0", "--cache-memory-bytes", "0"]
    settings = _served(monkeypatch, [*zeros, "--identity-cache-write-bytes", "0"], {})
    assert (settings.cache_max_bytes, settings.cache_memory_bytes) == (0, 0)
    assert settings.identity_cache_write_bytes == 0
    done = CliRunner().invoke(serve, ["--max-object-bytes", "0"], env=BASE_ENV)
    assert done.exit_code != 0 and "must be positive" in done.output


def test_a_new_field_gets_its_variable_flag_help_and_parser() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Extended:
        """Settings.

        Attributes:
            max_widgets: Most widgets at once,
                for everyone.
            widget_buffer_bytes: Widget buffer size.
        """

        max_widgets: int = 3
        widget_buffer_bytes: int = 1024

    widgets, buffer = knobs(Extended)
    assert (widgets.env, widgets.flag, widgets.parse("7")) == (
        "HAPI_MAX_WIDGETS",
        "--max-widgets",
        7,
    )
    assert widgets.help == "Most widgets at once, for everyone."
    assert buffer.parse("2KiB") == 2048 and buffer.metavar == "SIZE"


def test_a_field_without_a_parser_is_refused_at_generation() -> None:
    @dataclasses.dataclass(frozen=True)
    class Odd:
        """Attributes:
        when: A complex number.
        """

        when: complex = 0j

    with pytest.raises(TypeError, match="needs a parser"):
        knobs(Odd)


def test_one_gateway_process_runs_on_the_loop_that_accepts_a_burst_at_once() -> None:
    from hapi.gateway.edge._accept import EdgeLoop
    from hapi.gateway.edge._http import edge_config

    settings = GatewaySettings.from_env(BASE_ENV)
    factory = edge_config(settings, "127.0.0.1", 8080, lambda s: lambda: None).get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, EdgeLoop)
    finally:
        loop.close()
    # worker processes sharing the socket: uvloop's own, one accept per turn spreads a
    # burst over them
    two = GatewaySettings.from_env({**BASE_ENV, "HAPI_WORKERS": "2"})
    factory = edge_config(two, "127.0.0.1", 8080, lambda s: lambda: None).get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert not isinstance(loop, EdgeLoop)
    finally:
        loop.close()


def test_the_edge_leaves_the_access_log_to_the_gateway() -> None:
    # uvicorn's own access log would format a line per request for a logger that drops
    # it (the gateway's access log is hapi.gateway.access, written by its own middleware)
    import logging

    from hapi.gateway import edge_config

    settings = GatewaySettings.from_env(BASE_ENV)
    config = edge_config(settings, "127.0.0.1", 8080, lambda s: lambda: None)
    assert config.access_log is False
    assert not logging.getLogger("uvicorn.access").handlers


def test_cudnn_search_is_one_of_three_and_heuristic_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _served(monkeypatch, [], {}).conv_search == "heuristic"
    assert _served(monkeypatch, ["--conv-search", "exhaustive"], {}).conv_search == "exhaustive"
    assert _served(monkeypatch, [], {"HAPI_CONV_SEARCH": "default"}).conv_search == "default"
    done = CliRunner().invoke(serve, ["--conv-search", "fastest"], env=BASE_ENV)
    assert done.exit_code == 2 and "'--conv-search'" in done.output, done.output
    assert "expected one of exhaustive, heuristic, default" in done.output, done.output
    with pytest.raises(ValueError, match="conv_search must be"):
        GatewaySettings.from_env(BASE_ENV).with_changes(conv_search="fastest")
