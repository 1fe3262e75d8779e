"""The projection model on cases worked by hand."""

from __future__ import annotations

import math

import pytest

from hapi_bench.headtohead import _projection as model

RAW = model.PathCosts(link_bytes=100_000, client_s=0.02, serve_s=0.001)
SPLIT = model.PathCosts(link_bytes=2_000, client_s=0.001, serve_s=0.001, compute_s=0.019)
CPU4 = model.StorageNode(name="4 cores", cores=4)
GPU = model.StorageNode(name="gpu", cores=4, device_rate=10_000)


def test_raw_objects_at_one_gigabit_are_bound_by_the_link_past_a_few_clients() -> None:
    # 1000 samples: link 1000 * 100 kB * 8 / 1e9 = 0.8 s; storage 1000 * 1 ms / 4 = 0.25 s;
    # clients 1000 / N * 20 ms: 20 s for one, 0.625 s for 32.
    one = model.stages(RAW, CPU4, clients=1, bandwidth_bps=1e9, samples=1000)
    assert (one.client_s, one.link_s, one.storage_s) == pytest.approx((20.0, 0.8, 0.25))
    assert one.bottleneck == "client"
    many = model.stages(RAW, CPU4, clients=32, bandwidth_bps=1e9, samples=1000)
    assert many.epoch_s == pytest.approx(0.8)
    assert many.bottleneck == "link"


def test_a_cpu_node_runs_the_blocks_on_its_cores() -> None:
    # storage: 1000 * (1 + 19) ms / 4 cores = 5 s; link 1000 * 2 kB * 8 / 1e9 = 0.016 s.
    stages = model.stages(SPLIT, CPU4, clients=64, bandwidth_bps=1e9, samples=1000)
    assert stages.storage_s == pytest.approx(5.0)
    assert stages.link_s == pytest.approx(0.016)
    assert stages.epoch_s == pytest.approx(5.0)


def test_a_gpu_node_is_capped_by_its_device_rate_and_serves_on_its_cores() -> None:
    # device: 1000 / 10,000 = 0.1 s; serving: 1000 * 1 ms / 4 = 0.25 s.
    stages = model.stages(SPLIT, GPU, clients=1000, bandwidth_bps=100e9, samples=1000)
    assert stages.storage_s == pytest.approx(0.25)
    fast_serving = model.PathCosts(link_bytes=0, client_s=0, serve_s=0.0001, compute_s=0.01)
    assert model.epoch_s(
        fast_serving, GPU, clients=1, bandwidth_bps=1e9, samples=1000
    ) == pytest.approx(0.1)
    # Raw objects use no device time at all.
    assert model.stages(RAW, GPU, clients=1, bandwidth_bps=1e9, samples=1000).storage_s == (
        pytest.approx(0.25)
    )


def test_a_background_job_takes_a_max_min_fair_share() -> None:
    # It asks for 3 of 4 cores: it gets 2 (half), 2 are left: 1000 * 20 ms / 2 = 10 s.
    # It asks for 100 Mbit/s of 1 Gbit/s: 900 Mbit/s left: 1000 * 2 kB * 8 / 9e8.
    busy = model.Background(link_bps=100e6, storage_cores=3)
    stages = model.stages(SPLIT, CPU4, clients=1, bandwidth_bps=1e9, samples=1000, background=busy)
    assert stages.storage_s == pytest.approx(10.0)
    assert stages.link_s == pytest.approx(1000 * 2000 * 8 / 9e8)


def test_an_unlimited_link_is_never_the_bottleneck() -> None:
    stages = model.stages(RAW, CPU4, clients=1000, bandwidth_bps=math.inf, samples=1000)
    assert stages.link_s == 0.0


def test_the_table_takes_hapis_faster_path_and_the_speedup() -> None:
    rows = model.project(
        "m",
        RAW,
        [SPLIT, RAW],
        warm=model.PathCosts(link_bytes=2_000, client_s=0.001, serve_s=0.001),
        nodes=[CPU4],
        bandwidths=[1e9],
        clients=[1, 64],
        samples=1000,
    )
    one, many = rows
    # One client: raw 20 s (client); split max(1 s client, 0.016 s, 5 s storage) = 5 s.
    assert (one.contender_s, one.hapi_s) == pytest.approx((20.0, 5.0))
    assert one.speedup == pytest.approx(4.0)
    assert one.bottlenecks == ("client", "storage")
    # 64 clients: raw max(0.3125, 0.8, 0.25) = 0.8 s (link); split 5 s, so hapi reads raw.
    assert many.contender_s == pytest.approx(0.8)
    assert many.hapi_s == pytest.approx(0.8)
    # Warm: storage 1000 * 1 ms / 4 = 0.25 s; clients 1000 / 64 * 1 ms; link 0.016 s.
    assert many.hapi_warm_s == pytest.approx(0.25)


def test_check_reports_how_far_the_model_is_from_each_cell() -> None:
    cells = [
        model.MeasuredCell(label="link", costs=RAW, samples=100, bandwidth_bps=10e6, epoch_s=10.0),
        model.MeasuredCell(
            label="unshaped", costs=RAW, samples=100, bandwidth_bps=None, epoch_s=2.5
        ),
    ]
    link, unshaped = model.check(cells)
    # 100 * 100 kB * 8 / 10 Mbit/s = 8 s, against 10 measured: 20% optimistic.
    assert link.predicted_s == pytest.approx(8.0)
    assert link.error == pytest.approx(-0.2)
    # Unshaped, the client: 100 * 20 ms = 2 s; storage on one core 0.1 s.
    assert unshaped.predicted_s == pytest.approx(2.0)
    assert model.summary([link, unshaped]) == pytest.approx((0.2, 0.2))
    assert all(math.isnan(v) for v in model.summary([]))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        model.PathCosts(link_bytes=-1, client_s=0, serve_s=0)
    with pytest.raises(ValueError):
        model.StorageNode(name="x", cores=0)
    with pytest.raises(ValueError):
        model.stages(RAW, CPU4, clients=0, bandwidth_bps=1e9)
    with pytest.raises(ValueError):
        model.project("m", RAW, [])


def test_bench_device_figures_replace_the_published_blocks_rate() -> None:
    results = {
        "device": "cuda",
        "models": {
            "resnet18": {
                "splits": [
                    {"split": 3, "samples_per_s": {"1": 900.0, "64": 50_000.0}},
                    {"split": 10, "samples_per_s": {"1": 500.0, "64": 12_000.0}},
                ]
            }
        },
    }
    node = model.gpu_node_from_device(results, "resnet18")
    # The deepest split's best batch: 12,000/s, under DALI's 19,000/s decode.
    assert node.device_rate == 12_000.0
    assert node.cores == model.GPU_NODE.cores
    assert "split 10" in node.source
    results["models"]["resnet18"]["splits"][1]["samples_per_s"]["64"] = 40_000.0
    assert model.gpu_node_from_device(results, "resnet18").device_rate == model.DALI_DECODE_RATE


def test_a_measured_decode_rate_replaces_the_published_one() -> None:
    # hapi-bench device-ceiling's shape: nvJPEG's rate per batch beside the blocks.
    results = {
        "device": "NVIDIA H200",
        "runtime": "torch 2.11.0",
        "decode": {"host_one_thread": 437.0, "device": {"8": 4_590.0, "256": 7_470.0}},
        "models": {"resnet18": {"splits": [{"split": 10, "samples_per_s": {"256": 10_643.0}}]}},
    }
    node = model.gpu_node_from_device(results, "resnet18")
    # min(best decode 7,470/s, blocks 10,643/s): the decoder bounds this node.
    assert node.device_rate == 7_470.0
    assert "7,470 img/s measured (torch 2.11.0)" in node.source
    assert "DALI" not in node.source


def test_few_batches_pay_the_pipelines_fill() -> None:
    # 1000 samples, 4 cores, 1 Gbit/s: client 20 s, link 0.8 s, storage 0.25 s. In 10
    # batches: 9 batches of the client's 2 s, plus one through all three stages
    # (2 + 0.08 + 0.025 s) = 18 + 2.105 s.
    stages = model.stages(RAW, CPU4, clients=1, bandwidth_bps=1e9, samples=1000, batches=10)
    assert stages.epoch_s == pytest.approx(20.105)
    # Without batches (or in one batch per stage's worth), the pure bound / the sum.
    assert model.stages(RAW, CPU4, clients=1, bandwidth_bps=1e9, samples=1000).epoch_s == 20.0
    one = model.stages(RAW, CPU4, clients=1, bandwidth_bps=1e9, samples=1000, batches=1)
    assert one.epoch_s == pytest.approx(21.05)
