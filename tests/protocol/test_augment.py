"""Augmentation policies and their views: parsing, range checks, and draws that are a pure
function of (seed, object, view) with the distribution the policy asks for."""

from __future__ import annotations

import math

import pytest

from hapi.protocol import (
    Augmentation,
    AugmentPolicy,
    InvalidAugment,
    ObjectIdentity,
    ViewParams,
    cache_key,
    draw_view,
    view_index,
)

FULL = "crop(scale=0.08:1,ratio=0.75:1.3333);flip(p=0.5);jitter(brightness=0.4,hue=0.1)"


def test_a_spec_parses_to_torchvisions_meanings_and_back() -> None:
    policy = AugmentPolicy.parse(FULL)
    assert policy.scale == (0.08, 1.0) and policy.ratio == (0.75, 1.3333)
    assert policy.flip == 0.5
    assert policy.brightness == (0.6, 1.4) and policy.hue == (-0.1, 0.1)
    assert policy.contrast is None and policy.saturation is None
    assert AugmentPolicy.parse(policy.spec()) == policy
    mapping = {"crop": {"scale": [0.08, 1], "ratio": [0.75, 1.3333]}, "flip": 0.5}
    mapping["jitter"] = {"brightness": 0.4, "hue": 0.1}
    assert AugmentPolicy.from_dict(mapping) == policy


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("rotate(degrees=10)", "rotate"),
        ("crop(scale=0:1)", "crop.scale"),
        ("crop(scale=0.5:1.5)", "crop.scale"),
        ("crop(scale=0.9:0.1)", "crop.scale"),
        ("crop(ratio=-1:2)", "crop.ratio"),
        ("crop(size=3)", "crop.size"),
        ("flip(p=1.5)", "flip.p"),
        ("jitter(hue=0.7)", "jitter.hue"),
        ("jitter(brightness=-0.1)", "jitter.brightness"),
        ("jitter(contrast=nan)", "jitter.contrast"),
        ("jitter(saturation=x)", "jitter.saturation"),
        ("flip;crop()", "augment"),
        ("flip(p=0.5);flip(p=0.2)", "flip"),
        ("", "augment"),
    ],
)
def test_bad_policies_name_the_field(spec: str, field: str) -> None:
    with pytest.raises(InvalidAugment) as caught:
        AugmentPolicy.parse(spec)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def _view(view: int = 0, key: str = "cat.jpg", seed: int = 7) -> ViewParams:
    policy = AugmentPolicy.parse(FULL)
    return draw_view(policy, seed=seed, bucket="data", key=key, view=view, size=(640, 480))


def test_a_view_is_a_pure_function_of_seed_object_and_view() -> None:
    assert _view() == _view()  # nothing is carried from one draw to the next
    assert _view(view=1) != _view(view=0)
    assert _view(key="dog.jpg") != _view()
    assert _view(seed=8) != _view()
    # Pinned: a change to the draws would change every cached view and every resumed job.
    assert _view().to_dict() == {
        "view": 0,
        "box": [45, 8, 428, 437],
        "flip": True,
        "jitter": [["brightness", 1.3400687756015333], ["hue", 0.0694101244007059]],
    }
    assert ViewParams.from_dict(_view().to_dict()) == _view()


def test_epochs_read_views_modulo_the_views_cached() -> None:
    assert [view_index(e, 0) for e in range(4)] == [0, 1, 2, 3]
    assert [view_index(e, 2) for e in range(5)] == [0, 1, 0, 1, 0]
    policy = AugmentPolicy.parse(FULL)
    cached = Augmentation(policy=policy, seed=3, epoch=5, views=2, bucket="b")
    assert cached.view == 1
    assert cached.cache_material() == {"augment": policy.spec(), "seed": 3, "view": 1}
    assert Augmentation(policy=policy, epoch=5).cache_material() is None


def test_scales_ratios_and_flips_follow_the_requested_ranges() -> None:
    policy = AugmentPolicy.parse("crop(scale=0.25:0.75,ratio=0.8:1.25);flip(p=0.3)")
    width, height = 1000, 1000
    scales, ratios, flips = [], [], 0
    n = 3000
    for index in range(n):
        view = draw_view(
            policy, seed=11, bucket="b", key=f"{index}.jpg", view=0, size=(width, height)
        )
        assert view.box is not None
        top, left, h, w = view.box
        assert 0 <= top <= height - h and 0 <= left <= width - w
        scales.append(h * w / (width * height))
        ratios.append(math.log(w / h))
        flips += view.flip
    # Every box is within the ranges (up to rounding to whole pixels) ...
    assert min(scales) >= 0.25 - 0.01 and max(scales) <= 0.75 + 0.01
    assert min(ratios) >= math.log(0.8) - 0.01 and max(ratios) <= math.log(1.25) + 0.01
    # ... the area uniform in it (mean 0.5, sd 0.144: 4.5 standard errors is 0.012) ...
    assert abs(sum(scales) / n - 0.5) < 0.012
    assert sum(s < 0.5 for s in scales) / n == pytest.approx(0.5, abs=0.04)
    # ... every draw fits at once (no retry skews it), the log-ratio uniform and symmetric,
    # and flips at p (sd of the mean 0.0084).
    assert abs(sum(ratios) / n) < 0.03
    assert abs(flips / n - 0.3) < 0.04


def test_jitter_factors_stay_in_range_in_every_order() -> None:
    policy = AugmentPolicy.parse("jitter(brightness=0.4,contrast=0.2:0.3,saturation=0.5,hue=0.1)")
    orders = set()
    for index in range(500):
        view = draw_view(policy, seed=1, bucket="b", key=str(index), view=0, size=(10, 10))
        assert view.box is None and not view.flip
        factors = dict(zip(view.order, view.factors, strict=True))
        assert sorted(factors) == ["brightness", "contrast", "hue", "saturation"]
        assert 0.6 <= factors["brightness"] <= 1.4 and 0.2 <= factors["contrast"] <= 0.3
        assert 0.5 <= factors["saturation"] <= 1.5 and -0.1 <= factors["hue"] <= 0.1
        orders.add(view.order)
    assert len(orders) == 24  # every permutation of the four, as randperm(4) gives


def test_a_crop_that_never_fits_falls_back_to_the_centre_as_torchvision_does() -> None:
    policy = AugmentPolicy.parse("crop(scale=1:1,ratio=2:3)")
    view = draw_view(policy, seed=0, bucket="b", key="k", view=0, size=(100, 400))
    assert view.box == (175, 0, 50, 100)  # in_ratio 0.25 < 2: full width, height 100 / 2


def test_the_cache_key_holds_the_view_and_is_unchanged_without_one() -> None:
    identity = ObjectIdentity(bucket="b", key="k", etag="e", size=1)
    base = {"blocks": ["h1"], "preprocess": {"name": "imagenet"}, "dtype": "float32"}
    plain = cache_key(identity, **base)  # type: ignore[arg-type]
    view = {"augment": "flip(p=0.5)", "seed": 1, "view": 0}
    keys = {
        cache_key(identity, **base, view=view),  # type: ignore[arg-type]
        cache_key(identity, **base, view={**view, "view": 1}),  # type: ignore[arg-type]
        cache_key(identity, **base, view={**view, "seed": 2}),  # type: ignore[arg-type]
        cache_key(identity, **base, view={**view, "augment": "flip(p=0.4)"}),  # type: ignore[arg-type]
    }
    assert len(keys) == 4 and plain not in keys
