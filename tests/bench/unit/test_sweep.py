"""The pure parts of the sweep: sizing, bandwidths, the link bound and the order."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hapi_bench.testbed._config import REGIMES, BenchConfig, bandwidth_for
from hapi_bench.testbed._netns import pick_subnet, tbf_burst, tbf_limit
from hapi_bench.testbed._sweep import lower_bound_s, planned_line, sweep_order


def test_bandwidth_puts_the_raw_objects_at_the_asked_ratio() -> None:
    rate = bandwidth_for(REGIMES["network-bound"], client_rate=20.0, raw_bytes=30_000)

    network_rate = rate / (30_000 * 8)
    assert 20.0 / network_rate == pytest.approx(4.0)


def test_sizing_targets_seconds_with_enough_batches() -> None:
    config = BenchConfig(out=Path("x"), seconds=4.0, min_batches=12, max_samples=256)

    assert config.sizing(40.0) == (160, 8)  # 4 s of a fast model, batches of 8
    assert config.sizing(5.0) == (48, 4)  # a slow one still gets 12 batches
    assert config.sizing(500.0) == (256, 8)  # capped by the dataset


def test_config_rejects_unknown_models_and_regimes() -> None:
    with pytest.raises(ValueError, match="unknown model nope; known: "):
        BenchConfig(out=Path("x"), models=("nope",))
    with pytest.raises(ValueError, match="unknown regime fast"):
        BenchConfig(out=Path("x"), regimes=("fast",))


def test_the_link_bound_is_bytes_over_rate() -> None:
    assert lower_bound_s(100, 100_000, 8e6) == pytest.approx(10.0)


def test_sweep_order_is_by_prediction_without_the_pick() -> None:
    predicted = {None: 5.0, 0: 50.0, 1: 9.0, 2: math.inf, 3: 4.0}

    assert sweep_order(predicted, 3, 3, None) == [1, 0, 2]
    assert sweep_order(predicted, 3, 3, (0, 2)) == [0, 2]


def test_subnets_skip_addresses_in_use() -> None:
    first = pick_subnet(0, "")
    taken = f"2: eth0    inet {next(iter(first.hosts()))}/30 scope global"

    assert str(first) == "10.203.0.0/30"
    assert str(pick_subnet(0, taken)) == "10.203.0.4/30"


def test_subnets_skip_a_route_left_behind() -> None:
    # A run that crashed before its teardown leaves its blackhole route: a link on that
    # /30 could not add its own (the route exists), and the testbed would refuse to start.
    taken = "blackhole 10.203.0.0/30 metric 4294967295 \n"
    assert str(pick_subnet(0, taken)) == "10.203.0.4/30"
    assert str(pick_subnet(0, "10.203.0.0/30 dev hb1h proto kernel scope link")) != (
        "10.203.0.0/30"
    )


def test_tbf_bucket_holds_a_frame_and_20_ms() -> None:
    assert tbf_burst(1e6) == 16 * 1024
    assert tbf_burst(100e6) == 250_000


def test_tbf_queue_holds_100_ms_and_four_flows_starting_at_once() -> None:
    assert tbf_limit(1.7e6) == 256 * 1024  # 100 ms would be 21 KB: 14 frames
    assert tbf_limit(80e6) == 1_000_000


def test_the_storage_tier_runs_in_the_namespace_on_its_core_at_its_niceness(tmp_path) -> None:
    from hapi_bench.testbed._netns import Link
    from hapi_bench.testbed._tier import StorageTier

    tier = StorageTier(Link("77"), 1, tmp_path, tmp_path / "log", fixed_batch=4, niceness=-5)

    command = tier.command()
    assert command[:8] == ["ip", "netns", "exec", "hapi-bench-77", "taskset", "-c", "1", "nice"]
    assert command[8:10] == ["-n", "-5"]
    assert command[-2:] == ["-m", "hapi_bench.testbed._tier"]
    assert tier.spec.fixed_batch == 4 and tier.spec.host == tier.link.storage_ip


def test_the_planned_line_names_a_no_pushdown_plan_as_the_sdk_runs_it() -> None:
    # split=None from the planner is hapi.sdk without pushdown, not the baseline loader
    line = planned_line("resnet50", "balanced", 2.86e6, 2.78e6, None)
    assert line == (
        "resnet50 balanced: 2.86 Mbit/s shaped, 2.78 probed; planner picks sdk, no pushdown"
    )
    assert planned_line("resnet18", "network-bound", 1.45e6, 1.43e6, 10).endswith(
        "planner picks split 10"
    )
