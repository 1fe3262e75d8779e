"""One machine: the tiers share the cores, the link is loopback, and re-planning holds still.

On one box (``hapi up`` and the training loop together) the storage and client stages
run on the same CPUs, so they do not overlap, and loopback makes every split's transfer
look free. The planner must then not pick an early split that sends many times the raw
bytes, and a re-plan must not flip the split on noise.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hapi import planner
from hapi.protocol import BlockTime, Figure, StorageLoad, StorageProfile
from tests.planner import synthetic

LOOPBACK_BPS = 20e9
JPEG_BYTES = 68_000.0


def _one_box(**overrides: object) -> tuple[object, planner.Profile]:
    model, profile = synthetic.r18(raw_bytes=JPEG_BYTES, **overrides)
    return model, profile


def test_parallel_model_on_one_box_picks_an_early_split_that_sends_more_than_raw() -> None:
    # The failure users met: with the tiers modelled as parallel machines, loopback makes
    # an early split "1.7x faster" while it sends ~12x the raw bytes.
    model, profile = _one_box()
    chosen = planner.plan(model, profile, LOOPBACK_BPS)
    assert chosen.split not in (None, synthetic.manifest().freeze)
    assert chosen.chosen.bytes_per_sample > JPEG_BYTES


def test_shared_compute_serialises_the_two_compute_stages() -> None:
    model, profile = _one_box(shared_compute=True)
    chosen = planner.plan(model, profile, LOOPBACK_BPS, batch_size=8, dataset_size=80)
    row = chosen.candidate(4)
    cycle = max(row.storage_ms + row.client_ms, row.transfer_ms)
    expected = row.storage_ms + row.transfer_ms + row.client_ms + 9 * cycle
    assert row.epoch_s == pytest.approx(expected / 1000)


def test_on_one_box_the_pick_never_sends_more_than_the_raw_objects() -> None:
    model, profile = _one_box(shared_compute=True)
    chosen = planner.plan(model, profile, LOOPBACK_BPS)
    assert chosen.chosen.bytes_per_sample <= JPEG_BYTES
    assert "share" in chosen.reason() or "same machine" in chosen.reason()


def test_on_one_box_the_gateways_share_of_the_cores_is_not_a_storage_penalty() -> None:
    # On one machine the gateway's measured share of a core is low because the client
    # computes on the same cores: the client pays the same, so it must not tilt the
    # choice towards raw-ish splits that send more bytes.
    model, quiet = _one_box(shared_compute=True)
    busy = replace(quiet, storage_available=0.3)
    picked = planner.plan(model, busy, LOOPBACK_BPS)
    assert picked.split == planner.plan(model, quiet, LOOPBACK_BPS).split
    assert picked.chosen.bytes_per_sample <= JPEG_BYTES


def test_more_bytes_than_raw_only_when_clearly_faster() -> None:
    # A slow client CPU makes decoding on the storage side worth its extra bytes: split 0
    # sends 600 KB for a 68 KB JPEG, but saves most of the epoch, so it is kept (the
    # storage side is too slow at the blocks for a later, smaller split).
    model, profile = _one_box(client_decode_ms=200.0)
    profile = replace(profile, storage_ms=tuple(ms * 50 for ms in profile.storage_ms))
    chosen = planner.plan(model, profile, LOOPBACK_BPS)
    assert chosen.split == 0
    assert chosen.chosen.bytes_per_sample > JPEG_BYTES
    assert chosen.note == ""
    # ...but a marginal gain does not buy extra bytes.
    model, profile = _one_box()
    slight = planner.plan(model, profile, LOOPBACK_BPS, byte_margin=10.0)
    assert slight.chosen.bytes_per_sample <= JPEG_BYTES
    assert "more bytes" in slight.reason()


def test_replan_keeps_the_split_when_the_gain_is_small() -> None:
    model, profile = synthetic.r18(raw_bytes=110_000.0)
    first = planner.plan(model, profile, 100e6)
    # a 30% bandwidth drift triggers a re-plan; the new best is barely better
    measured = planner.Measurement(bandwidth_bps=130e6)
    assert planner.needs_replan(first, measured)
    again = planner.replan(model, first, measured, min_gain=0.5)
    assert again.split == first.split
    assert "kept split" in again.reason().lower()


def test_hysteresis_changes_the_split_only_after_a_persistent_gain() -> None:
    model, profile = synthetic.r18(raw_bytes=110_000.0)
    first = planner.plan(model, profile, 1e9)
    keeper = planner.SplitKeeper(first, min_gain=0.10, window=2)
    slow = planner.Measurement(bandwidth_bps=20e6)  # the link collapsed: a later split wins
    proposed = planner.replan(model, first, slow, min_gain=0.0)
    assert proposed.split != first.split
    assert keeper.update(proposed).split == first.split  # one epoch is not a trend
    assert "1 of 2" in keeper.why
    changed = keeper.update(proposed)
    assert changed.split == proposed.split
    assert "changed" in keeper.why and "2 epochs" in keeper.why
    # a single noisy epoch pointing back does not flip it again
    assert keeper.update(first).split == proposed.split


def test_the_explanation_shows_what_half_precision_would_give() -> None:
    model, profile = synthetic.r18(raw_bytes=110_000.0)
    strict = planner.plan(model, profile, 50e6)
    assert strict.dtype == "float32"
    assert "float16" in strict.explain()
    loose = planner.plan(model, profile, 50e6, allow_lower_precision=True)
    assert loose.dtype == "float16"
    assert loose.chosen.bytes_per_sample < strict.chosen.bytes_per_sample
    assert loose.chosen.epoch_s < strict.chosen.epoch_s


def test_on_one_box_measured_storage_blocks_price_the_client_side_too() -> None:
    # The gateway measures its blocks on this machine's cores: the same blocks on the
    # client side cost the same there. Pricing them by the manifest on one side and by
    # a slower measurement on the other tilted the pick towards sending more than raw.
    model, profile = _one_box(shared_compute=True)
    blocks = [
        BlockTime(block=i, device="cpu", ms=3 * ms, source="measured", samples=32, age_s=1.0)
        for i, ms in enumerate(profile.storage_ms)
    ]
    view = planner.GatewayProfile(
        model=model.ref,
        cpu_ms=profile.storage_ms,
        storage=StorageProfile(
            blocks=blocks, decode=None, load=StorageLoad(available=1.0, source="manifest")
        ),
        memory_bytes=None,
        busy_tenants=0,
    )
    applied = view.apply(profile)
    assert applied.client_ms == applied.storage_ms
    assert planner.plan(model, applied, LOOPBACK_BPS).chosen.bytes_per_sample <= JPEG_BYTES


def test_on_one_box_the_gateways_measured_decode_prices_the_clients_too() -> None:
    # `hapi demo --split auto --dtype float32` chose split 19, sending 1.4x the raw bytes,
    # "1.39x faster than no pushdown": the gateway had measured decoding these small
    # digits at about 2 ms, the client side assumed an ImageNet JPEG's 10 ms. On the
    # same cores, decoding costs the same on both sides.
    model, profile = _one_box(shared_compute=True, client_decode_ms=10.0)
    view = planner.GatewayProfile(
        model=model.ref,
        cpu_ms=profile.storage_ms,
        storage=StorageProfile(
            blocks=[],
            decode=Figure(ms=2.0, source="measured", samples=64, age_s=1.0),
            load=StorageLoad(available=1.0, source="manifest"),
        ),
        memory_bytes=None,
        busy_tenants=0,
    )
    applied = view.apply(profile)
    assert applied.client_decode_ms == applied.storage_decode_ms == 2.0
    apart = view.apply(replace(profile, shared_compute=False))
    assert apart.client_decode_ms == 10.0  # on separate machines the client keeps its own


def test_on_one_box_the_reason_says_bytes_are_saved_only_when_they_are() -> None:
    model, profile = _one_box(shared_compute=True)
    fewer = planner.plan(model, profile, LOOPBACK_BPS)
    assert fewer.chosen.bytes_per_sample < JPEG_BYTES
    assert fewer.reason().endswith("pushdown saves bytes rather than time.")
    raw = planner.plan(model, replace(profile, raw_bytes=100.0), LOOPBACK_BPS)
    assert raw.split is None
    assert "saves bytes" not in raw.reason() and "share the same machine's cores" in raw.reason()


def test_on_one_box_more_bytes_than_raw_must_buy_a_quarter() -> None:
    # hapi demo in float32: the pooled features (2 KB here) outweigh tiny images, and the
    # client's CPU per GET made split 10 predicted 1.14x faster than reading the images.
    # On one machine that is within what the model leaves out (the gateway's own work per
    # object on the same cores): the raw images are kept, and the reason says why.
    model, profile = synthetic.r18(raw_bytes=1500.0, shared_compute=True, client_request_ms=6.0)
    chosen = planner.plan(model, profile, LOOPBACK_BPS)
    gain = chosen.candidate(None).epoch_s / chosen.candidate(10).epoch_s - 1
    assert 0.10 < gain < planner.SHARED_BYTE_MARGIN  # past the 10% margin of two machines
    assert chosen.split is None and "more bytes" in chosen.reason()
    assert chosen.reason().startswith("No pushdown takes")  # not "is fastest": it is not
    clearly = replace(profile, client_request_ms=16.0)  # 1.38x: worth its bytes even here
    assert planner.plan(model, clearly, LOOPBACK_BPS).split == 10
