"""``split=auto`` plans on the storage side's measured figures, not the manifest's alone."""

from __future__ import annotations

from hapi.gateway._batcher import MemoryBudget
from hapi.gateway._pushdown_params import Params
from hapi.gateway._pushdown_plan import choose_split
from hapi.models import BlockTime, Manifest, StorageLoad, StorageProfile
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
