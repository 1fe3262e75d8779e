"""``split=auto`` prices an answer in the ``zeros`` encoding at the bytes it sends: the
features less the zero values the manifest counted on the export's photos."""

from __future__ import annotations

import dataclasses

import numpy as np

from hapi import planner
from hapi.gateway.pushdown._batcher import MemoryBudget
from hapi.gateway.pushdown._params import Params
from hapi.gateway.pushdown._plan import choose_split
from hapi.models import Manifest
from hapi.protocol import StorageLoad, StorageProfile
from tests.planner.synthetic import manifest

DENSE = manifest(freeze=9)
# A ReLU network's features are about half zeros (ResNet18's measured 0.3-0.7).
COUNTED = dataclasses.replace(
    DENSE,
    blocks=tuple(
        dataclasses.replace(block, zeros=share)
        for block, share in zip(
            DENSE.blocks, (0.45, 0.5, 0.55, 0.5, 0.6, 0.55, 0.65, 0.7, 0.8, 0.0), strict=True
        )
    ),
)
STORAGE = StorageProfile(blocks=[], decode=None, load=StorageLoad(available=1.0, source="manifest"))
LINKS = [float(b) for b in np.geomspace(1e6, 1e10, 60)]  # 1 Mbit/s to 10 Gbit/s


def _auto(model: Manifest, encoding: str, link: float) -> int:
    params = Params(model=model.name, split=None, bandwidth_bps=link, encoding=encoding)
    return choose_split(model, params, MemoryBudget(8 << 30), link, STORAGE)


def _planned(model: Manifest, link: float, zeros: tuple[float, ...] | None) -> int:
    view = planner.GatewayProfile(
        model=model.ref,
        cpu_ms=tuple(block.cpu_ms for block in model.blocks[: model.freeze]),
        storage=STORAGE,
        memory_bytes=MemoryBudget(8 << 30).share(),
        busy_tenants=0,
    )
    profile = view.apply(planner.profile_from_manifest(model, zeros=zeros))
    split = planner.plan(model, profile, link, features_only=True).split
    assert split is not None
    return split


def test_zeros_answers_are_planned_at_their_encoded_bytes_and_dense_ones_at_theirs() -> None:
    assert COUNTED.zeros is not None
    chosen = {
        link: (_auto(COUNTED, "zeros", link), _auto(COUNTED, "dense", link)) for link in LINKS
    }
    for link, (zeros, dense) in chosen.items():
        assert zeros == _planned(COUNTED, link, COUNTED.zeros), link
        assert dense == _planned(COUNTED, link, None), link
    # Somewhere on the way from a slow link to a fast one, the bytes left out change the choice.
    assert any(zeros != dense for zeros, dense in chosen.values())


def test_a_manifest_without_counts_prices_zeros_answers_dense() -> None:
    assert DENSE.zeros is None
    for link in LINKS:
        assert _auto(DENSE, "zeros", link) == _auto(DENSE, "dense", link), link
