"""``split=auto`` plans on the storage side's measured figures, not the manifest's alone."""

from __future__ import annotations

from hapi import planner
from hapi.gateway.pushdown._batcher import MemoryBudget
from hapi.gateway.pushdown._params import Params
from hapi.gateway.pushdown._plan import choose_split
from hapi.models import Manifest
from hapi.protocol import BlockTime, StorageLoad, StorageProfile
from tests.planner.synthetic import manifest

MODEL = manifest(freeze=9)
LINK = 10e6  # bits per second


def _storage(model: Manifest, scale: float, *, measured: bool) -> StorageProfile:
    """Every frozen block at ``scale`` times the manifest's figure, measured or not."""
    return StorageProfile(
        blocks=[
            BlockTime(
                block=index,
                device="cpu",
                ms=block.cpu_ms * scale,
                source="measured" if measured else "manifest",
                samples=32 if measured else 0,
                age_s=1.0 if measured else None,
            )
            for index, block in enumerate(model.blocks[: model.freeze])
        ],
        decode=None,
        load=StorageLoad(available=1.0, source="manifest"),
    )


def _auto(storage: StorageProfile) -> int:
    params = Params(model=MODEL.name, split=None, bandwidth_bps=LINK)
    return choose_split(MODEL, params, MemoryBudget(8 << 30), LINK, storage)


def test_a_storage_side_measured_slow_pushes_fewer_blocks_down() -> None:
    as_manifest = _auto(_storage(MODEL, 1.0, measured=False))
    measured_slow = _auto(_storage(MODEL, 10.0, measured=True))
    assert measured_slow < as_manifest


def test_a_measured_storage_side_as_fast_as_the_manifest_changes_nothing() -> None:
    assert _auto(_storage(MODEL, 1.0, measured=True)) == _auto(_storage(MODEL, 1.0, measured=False))


def test_a_loaded_storage_side_pushes_fewer_blocks_down() -> None:
    quiet = _storage(MODEL, 1.0, measured=True)
    loaded = quiet.model_copy(
        update={"load": StorageLoad(available=0.1, source="measured", samples=9, age_s=2.0)}
    )
    assert _auto(loaded) < _auto(quiet)


def test_more_bytes_than_raw_must_buy_what_the_planner_asks_of_a_loaded_storage_side() -> None:
    # A busy second tenant doubles the storage side's time. Split 0 (the decoded tensor,
    # 5.5x the raw object's bytes) is predicted fastest, split 1 (1.8x) next, split 2
    # (50 KB, fewer than raw) last. From a loaded storage side the planner asks a split
    # sending r times the raw bytes to buy r times the byte margin (SHARED_BYTE_MARGIN on
    # one machine, DEFAULT_BYTE_MARGIN across machines); so must the gateway.
    model = manifest(outputs=(200_000, 50_000), cpu_ms=(1.0, 4.0), weights=(1_000, 1_000))
    budget = MemoryBudget(8 << 30)
    budget.activate("other")
    budget.activate("this")
    storage = _storage(model, 1.0, measured=True)
    loopback = 10e9

    def auto(colocated: bool) -> int:
        params = Params(model=model.name, split=None, bandwidth_bps=loopback, colocated=colocated)
        return choose_split(model, params, budget, loopback, storage)

    def splits(colocated: bool) -> tuple[float, dict[int, planner.Candidate]]:
        profile = planner.GatewayProfile(
            model=model.ref, cpu_ms=(1.0, 4.0), storage=storage, memory_bytes=None, busy_tenants=1
        ).apply(planner.profile_from_manifest(model, shared_compute=colocated))
        assert profile.storage_load > 1.0
        candidates = planner.plan(model, profile, loopback).candidates
        return profile.raw_bytes, {c.split: c for c in candidates if c.split is not None}

    for colocated, margin in (
        (True, planner.SHARED_BYTE_MARGIN),
        (False, planner.DEFAULT_BYTE_MARGIN),
    ):
        raw, by_split = splits(colocated)
        lean = by_split[2]
        assert by_split[0].bytes_per_sample > by_split[1].bytes_per_sample > raw
        assert raw > lean.bytes_per_sample
        assert by_split[0].epoch_s < by_split[1].epoch_s < lean.epoch_s
        # The fastest would pass a flat margin, not its multiple.
        assert not _pays(by_split[0], lean, raw, margin)
        assert lean.epoch_s / by_split[0].epoch_s - 1 > planner.DEFAULT_BYTE_MARGIN
        expected = 1 if _pays(by_split[1], lean, raw, margin) else 2
        assert auto(colocated) == expected
    # On one machine split 1 does not pay its multiple of 25%; across machines it pays 10%'s.
    assert auto(colocated=True) == 2
    assert auto(colocated=False) == 1


def _pays(candidate: planner.Candidate, lean: planner.Candidate, raw: float, margin: float) -> bool:
    """Whether ``candidate`` gains over ``lean`` its multiple of raw bytes times ``margin``."""
    gain = lean.epoch_s / candidate.epoch_s - 1
    return gain > margin * candidate.bytes_per_sample / raw
