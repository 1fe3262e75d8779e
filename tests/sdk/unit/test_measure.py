"""Timing this machine for the planner: decoding (the SDK measures, the planner prices)."""

from __future__ import annotations

import pytest
from PIL import Image

from hapi.models.testing import get_preset
from hapi.planner import InvalidInput
from hapi.sdk import measure_decode_ms


def test_measure_decode_ms_times_real_jpeg_decoding() -> None:
    gradient = Image.linear_gradient("L").resize((640, 480)).convert("RGB")
    tiny = Image.new("RGB", (32, 32), "red")
    preset = get_preset("imagenet")
    big = measure_decode_ms(preset, images=[gradient, gradient], runs=2)
    small = measure_decode_ms(preset, images=[tiny], runs=2)
    assert 0 < small < big < 1000
    with pytest.raises(InvalidInput):
        measure_decode_ms(preset, images=[])


def test_the_client_s_zeros_price_splits_only_for_encoded_answers() -> None:
    from hapi.sdk.planning._split import ClientTimes

    times = ClientTimes(1.5, block_ms=(2.0, 3.0), decode_ms=4.0, zeros=(0.1, 0.5))
    assert times.profile_args()["zeros"] == (0.1, 0.5)  # the SDK's default, zeros
    assert "zeros" not in times.profile_args("dense")
    assert "zeros" not in ClientTimes(1.5).profile_args()  # not measured: priced dense
