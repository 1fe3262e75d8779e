"""The cost model on recorded testbed cells: the pick must be (near) the best measured.

Every ``recorded/*.json`` is a ``results.json`` written by ``hapi bench``. Each cell
holds what the planner knew (``plan.profile``, and ``profile``: both sides' per-block
times, decode times, the storage side's figures as the gateway served them, availability,
bandwidth, bytes per split) and the epoch each configuration took. The plan is made
again offline from those figures, and its pick must be a split whose measured epoch is
within 5% of the best measured in that cell.

Where a recording shows the planner cannot meet that, the fixture lists the cell under
``known_misses`` (``{"model": ..., "regime": ..., "pick": ..., "why": ...}``): the test
then asserts that exact pick, so a change of the planner's behaviour there still fails
and the entry is revisited.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hapi_bench._report import best_run, configurations, ratio
from hapi_bench._results import CellResult, RunResult

from hapi.models import BlockInfo, InputSpec, Manifest, get_preset
from hapi.planner import Plan, Profile, Trial, plan

RECORDED = Path(__file__).parent / "recorded"
TOLERANCE = 0.05


def _cells() -> list[Any]:
    found = []
    for path in sorted(RECORDED.glob("*.json")):
        data = json.loads(path.read_text())
        misses = {(m["model"], m["regime"]): m for m in data.get("known_misses", [])}
        for cell in data["cells"]:
            miss = misses.get((cell["model"], cell["regime"]))
            found.append(
                pytest.param(cell, miss, id=f"{path.stem}:{cell['model']}:{cell['regime']}")
            )
    return found


def profile_of(cell: Mapping[str, Any]) -> Profile:
    """The profile the planner used, with the cell's recorded figures where present."""
    fields = {f.name for f in dataclasses.fields(Profile)}
    values = {k: v for k, v in cell["plan"]["profile"].items() if k in fields}
    recorded = cell.get("profile") or {}
    for name in ("client_ms", "client_decode_ms", "storage_ms", "storage_decode_ms"):
        if name in recorded:
            values[name] = recorded[name]
    for name in ("storage_available", "storage_load", "raw_bytes"):
        if name in recorded:
            values[name] = recorded[name]
    if "wire_bytes" in recorded:
        values["input_bytes"] = recorded["wire_bytes"][0]
        values["output_bytes"] = recorded["wire_bytes"][1:]
    return Profile(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def manifest_of(cell: Mapping[str, Any], profile: Profile) -> Manifest:
    """A manifest with the cell's frozen blocks (only what the planner reads of it)."""
    names = cell["plan"]["block_names"]
    blocks = tuple(
        BlockInfo(
            name=name,
            hash=f"{index:064x}",
            size=profile.weight_bytes[index],
            input_shape=(1,),
            output_shape=(profile.output_bytes[index] // 4,),
            dtype="float32",
            params=0,
            output_bytes=profile.output_bytes[index],
            peak_activation_bytes=profile.peak_activation_bytes[index],
            cpu_ms=profile.client_ms[index],
        )
        for index, name in enumerate(names)
    )
    return Manifest(
        name=cell["model"],
        version=1,
        family=cell["model"],
        freeze=cell["freeze"],
        preprocess=get_preset("imagenet"),
        input=InputSpec(shape=(3, 224, 224)),
        blocks=blocks,
    )


def replan(cell: Mapping[str, Any]) -> Plan:
    """The cell planned again from its recorded figures."""
    profile = profile_of(cell)
    recorded = cell.get("profile") or {}
    return plan(
        manifest_of(cell, profile),
        profile,
        recorded.get("bandwidth_bps") or cell["plan"]["bandwidth_bps"],
        batch_size=recorded.get("batch_size") or cell["plan"]["batch_size"],
        dataset_size=recorded.get("dataset_size") or cell["plan"]["dataset_size"],
    )


def judged(cell: Mapping[str, Any]) -> tuple[dict[int | None, RunResult], RunResult]:
    """The measured run of each configuration and the best of them, as ``hapi bench``
    judges a pick (``hapi_bench._report.configurations`` and ``best_run``): every
    configuration timed through ``hapi.sdk``, no pushdown (``None``) by its
    ``split=None`` path, the baseline loader only where that was not measured."""
    result = CellResult.from_dict(cell)
    return {run.split: run for run in configurations(result)}, best_run(result)


def test_recordings_are_there() -> None:
    assert list(RECORDED.glob("*.json")), "no recorded testbed run in tests/planner/unit/recorded"


@pytest.mark.parametrize(("cell", "miss"), _cells())
def test_replanned_pick_is_within_5_percent_of_the_best(cell: Any, miss: Any) -> None:
    runs, best = judged(cell)
    pick = replan(cell).split
    if miss is not None:  # the recording shows the planner cannot meet it here
        assert pick == miss["pick"], f"known miss changed: {miss['why']}"
        return
    assert pick in runs, f"the pick, split {pick}, was not measured in this cell"
    regret = ratio(runs[pick], best) - 1.0  # by paired rounds where there were rounds
    assert regret <= TOLERANCE + 1e-9, (
        f"pick {pick} took {runs[pick].epoch_s:.2f} s, {regret:+.1%} over the best "
        f"({best.label}, {best.epoch_s:.2f} s)"
    )
    assert math.isfinite(replan(cell).chosen.epoch_s)


def test_known_misses_name_recorded_cells() -> None:
    for path in RECORDED.glob("*.json"):
        data = json.loads(path.read_text())
        cells = {(cell["model"], cell["regime"]) for cell in data["cells"]}
        for miss in data.get("known_misses", []):
            assert (miss["model"], miss["regime"]) in cells, f"{path.name}: {miss}"
            assert miss.get("why"), f"{path.name}: a known miss says why"


def _cells_with_trials() -> list[Any]:
    """Cells recorded since the bench runs near ties' trials (``trial`` is present,
    ``None`` where the plan had no near tie)."""
    return [p for p in _cells() if "trial" in p.values[0]]


@pytest.mark.parametrize(("cell", "miss"), _cells_with_trials())
def test_a_recorded_trial_replays_and_keeps_a_split_within_5_percent(cell: Any, miss: Any) -> None:
    chosen = replan(cell)
    recorded = cell["trial"]
    trial = Trial.start(chosen)
    if recorded is None:
        assert trial is None, f"the planner now sees a near tie with split {trial.rival.split}"
        return
    assert trial is not None and trial.rival.split == recorded["rival"]
    for split, seconds in zip(trial.schedule, recorded["epochs_s"], strict=True):
        trial.record(split, seconds, CellResult.from_dict(cell).samples)
    assert trial.kept().split == recorded["kept"]
    if miss is not None and miss.get("kept") == recorded["kept"]:
        return  # the recording shows the trial cannot meet it here (it says why)
    runs, best = judged(cell)
    regret = ratio(runs[recorded["kept"]], best) - 1.0
    assert regret <= TOLERANCE + 1e-9, (
        f"the trial kept split {recorded['kept']}, {regret:+.1%} over the best ({best.label})"
    )
