"""The manifest's per-block zero shares: read from manifests with and without them."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hapi.models import Manifest, RegistryError
from tests.planner.synthetic import manifest as synthetic

MODEL = synthetic(freeze=6)

shares = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


def _with(values: list[float | None]) -> Manifest:
    blocks = tuple(
        dataclasses.replace(block, zeros=share)
        for block, share in zip(MODEL.blocks, values, strict=True)
    )
    return dataclasses.replace(MODEL, blocks=blocks)


@given(st.lists(shares, min_size=len(MODEL.blocks), max_size=len(MODEL.blocks)))
def test_counted_shares_survive_the_json_and_stop_at_the_freeze(values: list[float]) -> None:
    model = Manifest.from_json(_with(list(values)).to_json())
    assert model.zeros == tuple(values[: MODEL.freeze])
    assert [block.zeros for block in model.blocks] == values


def test_a_manifest_written_before_the_count_reads_as_unknown() -> None:
    data = json.loads(_with([0.5] * len(MODEL.blocks)).to_json())
    for block in data["blocks"]:
        del block["zeros"]
    old = Manifest.from_json(json.dumps(data))
    assert old.zeros is None and all(block.zeros is None for block in old.blocks)
    assert old.same_content(MODEL)


@pytest.mark.parametrize("missing", range(MODEL.freeze))
def test_one_frozen_block_without_a_count_leaves_the_model_unknown(missing: int) -> None:
    values: list[float | None] = [0.5] * len(MODEL.blocks)
    values[missing] = None
    assert _with(values).zeros is None


def test_a_block_past_the_freeze_without_a_count_does_not_matter() -> None:
    values: list[float | None] = [0.25] * MODEL.freeze + [None] * (len(MODEL.blocks) - MODEL.freeze)
    assert _with(values).zeros == (0.25,) * MODEL.freeze


@pytest.mark.parametrize("bad", [1.5, -0.1, "half", True, float("nan"), float("inf"), [0.5]])
def test_a_share_that_is_not_one_is_an_unreadable_manifest(bad: object) -> None:
    # A manifest written into the registry bucket by hand must not reach the planner.
    data = json.loads(_with([0.5] * len(MODEL.blocks)).to_json())
    data["blocks"][2]["zeros"] = bad
    with pytest.raises(RegistryError, match=r"block2.*zeros must be a share in"):
        Manifest.from_json(json.dumps(data))
