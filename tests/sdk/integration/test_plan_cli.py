"""``hapi plan`` with click's CliRunner against the session's real store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from PIL import Image

from hapi.models import Manifest
from hapi.sdk.cli._plan_cli import plan
from tests.support import store_env


@pytest.fixture
def invoke(store: Any, planned_model: tuple[str, Manifest]):
    """Run ``hapi plan ARGS --bucket <the model's bucket>`` with the store in the environment."""
    env = store_env(store)

    def run(*args: str, **overrides: str | None):
        arguments = [*args, "--bucket", planned_model[0]]
        return CliRunner().invoke(plan, arguments, env=env | overrides)

    return run


def test_table_and_choice(invoke, planned_model) -> None:
    manifest = planned_model[1]
    done = invoke("--model", "r18", "--bandwidth", "100mbit", "--batch", "16")
    assert done.exit_code == 0, done.output
    out = done.stdout
    assert "r18@1 at 100 Mbit/s, batch 16, 1,281,167 samples" in out
    for header in ("split", "bytes/sample", "storage ms", "transfer ms", "client ms", "epoch"):
        assert header in out
    assert "nothing (raw objects)" in out
    names = [block.name for block in manifest.blocks[: manifest.freeze]]
    assert f"decode + {names[0]}..{names[3]}" in out  # split 4 = freeze
    chosen = [line for line in out.splitlines() if line.startswith("chosen: split ")]
    assert len(chosen) == 1
    split = chosen[0].removeprefix("chosen: split ").split(".")[0]
    assert split in {"none", "0", "1", "2", "3", "4"}
    assert "is fastest at" in chosen[0]


def test_json_agrees_with_the_table(invoke) -> None:
    done = invoke("--model", "r18@1", "--bandwidth", "1gbit", "--json", "--dataset-size", "5000")
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert data["model"] == "r18@1" and data["freeze"] == 4
    assert data["bandwidth_bps"] == 1e9 and data["dataset_size"] == 5000
    assert [c["split"] for c in data["candidates"]] == [None, 0, 1, 2, 3, 4]
    best = min((c for c in data["candidates"] if c["feasible"]), key=lambda c: c["epoch_s"])
    assert data["split"] == best["split"]
    table = invoke("--model", "r18@1", "--bandwidth", "1gbit", "--dataset-size", "5000")
    assert f"chosen: split {'none' if best['split'] is None else best['split']}." in table.stdout


def test_low_bandwidth_and_a_small_storage_budget(invoke) -> None:
    done = invoke("--model", "r18", "--bandwidth", "1Mbit/s", "--storage-memory", "1MB", "--json")
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    infeasible = [c["split"] for c in data["candidates"] if not c["feasible"]]
    assert infeasible and data["split"] not in infeasible
    assert data["profile"]["storage_memory_bytes"] == 1_000_000


def test_plot_writes_a_png(invoke, tmp_path: Path) -> None:
    path = tmp_path / "plan.png"
    done = invoke("--model", "r18", "--bandwidth", "50Mbit/s", "--plot", str(path))
    assert done.exit_code == 0, done.output
    assert f"wrote {path}" in done.stderr
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 800 and image.height > 300


def test_measure_times_the_blocks_here(invoke) -> None:
    done = invoke("--model", "r18", "--bandwidth", "1gbit", "--measure", "--json")
    assert done.exit_code == 0, done.output
    profile = json.loads(done.stdout)["profile"]
    assert len(profile["client_ms"]) == 4 and all(ms > 0 for ms in profile["client_ms"])
    assert profile["client_ms"] != profile["storage_ms"]  # measured here, not the manifest's
    assert profile["client_decode_ms"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--bandwidth", "fast"), "invalid bandwidth 'fast': use a number with a unit"),
        (("--bandwidth", "100m"), "e.g. 100mbit, 1gbit"),
        (("--bandwidth", "1gbit", "--client-memory", "lots"), "invalid size 'lots'"),
        (("--bandwidth", "1gbit", "--plot", "/nonexistent/plan.png"), "cannot write"),
        (("--bandwidth", "1gbit", "--plot", "plan.xyz"), "Format 'xyz' is not supported"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(invoke, args, message) -> None:
    done = invoke("--model", "r18", *args)
    assert done.exit_code == 2, done.output
    assert message in done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_unknown_model_lists_the_registered_ones_and_how_to_export(invoke) -> None:
    done = invoke("--model", "nope", "--bandwidth", "1gbit")
    assert done.exit_code == 2
    assert done.stderr == (
        "Error: no such model: nope; registered: r18@1. "
        "Export one with `hapi models export FAMILY` (e.g. resnet18, efficientnet_lite0)\n"
    )


def test_bandwidth_without_a_unit_is_refused(invoke) -> None:
    done = invoke("--model", "r18", "--bandwidth", "100")
    assert done.exit_code == 2
    assert done.stderr == (
        "Error: --bandwidth 100 has no unit: say 100mbit (bits per second) "
        "or 100MB/s (bytes per second)\n"
    )


def test_auto_bandwidth_needs_an_endpoint(invoke) -> None:
    done = invoke("--model", "r18", "--bandwidth", "auto", AWS_ENDPOINT_URL=None)
    assert done.exit_code == 2
    assert done.stderr == "Error: --bandwidth auto probes the gateway: give --endpoint URL\n"


def test_auto_bandwidth_against_a_plain_store_says_so(invoke, store) -> None:
    done = invoke("--model", "r18", "--bandwidth", "auto", "--endpoint", store.endpoint_url)
    assert done.exit_code == 1
    # The probe is signed with the same credentials as the registry reads, so the store
    # itself answers: no bucket `_hapi` there.
    assert done.stderr.startswith(f"Error: bandwidth probe at {store.endpoint_url}: HTTP 404")
    assert "is it a hapi gateway?" in done.stderr and done.stderr.count("\n") == 1


# -- where the bandwidth comes from -------------------------------------------------------


def test_without_a_bandwidth_it_names_the_split_a_job_starts_at(invoke) -> None:
    done = invoke("--model", "r18")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("chosen: split 4 (default). split 4 sends the fewest bytes")
    assert "--probe" in done.stdout
    data = json.loads(invoke("--model", "r18", "--json").stdout)
    assert (data["split"], data["bandwidth_source"]) == (4, "default")


def test_a_hint_from_the_environment_is_used_and_named(invoke) -> None:
    done = invoke("--model", "r18", HAPI_BANDWIDTH="50mbit")
    assert done.exit_code == 0, done.output
    assert "bandwidth 50 Mbit/s (hint)" in done.stdout
    given = invoke("--model", "r18", "--bandwidth", "50mbit", "--json")
    assert json.loads(given.stdout)["bandwidth_source"] == "given"


def test_a_remembered_figure_comes_before_the_hint(invoke, store, bandwidth_memory) -> None:
    from hapi.sdk.planning._link import BandwidthMemory

    BandwidthMemory(bandwidth_memory / "bandwidth.json").remember(store.endpoint_url, 7e6)
    done = invoke("--model", "r18", "--endpoint", store.endpoint_url, HAPI_BANDWIDTH="1gbit")
    assert done.exit_code == 0, done.output
    assert "bandwidth 7 Mbit/s (remembered, measured 0 min ago)" in done.stdout
    # A plain store has no view of the model to give: the manifest's figures stand.
    assert "storage-side figures from the manifest" in done.stderr


def test_probe_needs_an_endpoint_and_a_gateway(invoke, store) -> None:
    done = invoke("--model", "r18", "--probe", AWS_ENDPOINT_URL=None)
    assert done.exit_code == 2
    assert done.stderr == "Error: --probe probes the gateway: give --endpoint URL\n"
    done = invoke("--model", "r18", "--probe", "--endpoint", store.endpoint_url)
    assert done.exit_code == 1
    assert done.stderr.startswith(f"Error: bandwidth probe at {store.endpoint_url}: HTTP 404")


def test_without_measuring_the_manifest_counts_the_features_zeros(invoke, planned_model) -> None:
    # The SDK's answers leave the zero values out; without --measure nothing runs here to
    # count them, so the export's count prices each split, not the dense bytes.
    manifest = planned_model[1]
    assert manifest.zeros is not None and max(manifest.zeros) > 0
    done = invoke("--model", "r18", "--bandwidth", "10mbit", "--json")
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert data["profile"]["zeros"] == pytest.approx(list(manifest.zeros))
    sent = {c["split"]: c["bytes_per_sample"] for c in data["candidates"]}
    for split in range(1, manifest.freeze + 1):
        assert (
            sent[split] < manifest.blocks[split - 1].output_bytes or not manifest.zeros[split - 1]
        )
