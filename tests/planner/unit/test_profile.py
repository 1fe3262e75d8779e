"""Profiles from manifests."""

from __future__ import annotations

import pytest

from hapi.planner import (
    DEFAULT_DECODE_MS,
    DEFAULT_RAW_BYTES,
    InvalidInput,
    profile_from_manifest,
)
from tests.planner.synthetic import INPUT_BYTES, R18_CPU_MS, R18_OUTPUTS, R18_WEIGHTS, manifest


def test_manifest_profile_uses_cpu_ms_on_both_sides() -> None:
    model = manifest(freeze=6)
    profile = profile_from_manifest(model)
    assert profile.blocks == 6
    assert profile.storage_ms == profile.client_ms == R18_CPU_MS[:6]
    assert profile.output_bytes == R18_OUTPUTS[:6]
    assert profile.weight_bytes == R18_WEIGHTS[:6]
    assert profile.input_bytes == INPUT_BYTES
    assert profile.raw_bytes == DEFAULT_RAW_BYTES
    assert profile.storage_decode_ms == profile.client_decode_ms == DEFAULT_DECODE_MS
    assert profile.storage_load == 1.0 and profile.storage_memory_bytes is None


def test_measured_times_replace_the_manifests() -> None:
    model = manifest(freeze=3)
    profile = profile_from_manifest(model, client_ms=[1, 2, 3, 4], storage_ms=(0.5, 0.5, 0.5))
    assert profile.client_ms == (1.0, 2.0, 3.0)  # only the frozen blocks count
    assert profile.storage_ms == (0.5, 0.5, 0.5)
    with pytest.raises(InvalidInput, match="client_ms has 2 entries; synthetic@1 has 3 frozen"):
        profile_from_manifest(model, client_ms=[1, 2])
    with pytest.raises(InvalidInput, match="unknown dtype 'int4'"):
        profile_from_manifest(model, wire_dtype="int4")


def test_activation_bytes_match_the_gateways_estimate() -> None:
    profile = profile_from_manifest(manifest())
    # Block 0 holds the input and its output at once; later blocks only their own pair.
    assert profile.activation_bytes(0, 1) == INPUT_BYTES + R18_OUTPUTS[0]
    assert profile.activation_bytes(9, 10) == R18_OUTPUTS[8] + R18_OUTPUTS[9]
    assert profile.activation_bytes(10, 10) == R18_OUTPUTS[9]  # the client holds features
    assert profile.activation_bytes(0, 0) == INPUT_BYTES
