"""The dataset constructors spell out the same typed options; ``stats`` is one kind of member."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from typing import Any

import pytest

from hapi import sdk

CONSTRUCTORS = [
    (sdk.FeatureDataset, "from_prefix"),
    (sdk.FeatureDataset, "from_objects"),
    (sdk.FeatureDataset, "from_shards"),
    (sdk.IterableFeatureDataset, "from_prefix"),
    (sdk.IterableFeatureDataset, "from_objects"),
    (sdk.IterableFeatureDataset, "from_shards"),
]


def _options(cls: type, name: str) -> dict[str, inspect.Parameter]:
    parameters = list(inspect.signature(getattr(cls, name)).parameters.values())[1:]
    return {p.name: p for p in parameters}


@pytest.mark.parametrize(("cls", "name"), CONSTRUCTORS, ids=lambda v: getattr(v, "__name__", v))
def test_constructors_take_the_same_keyword_only_options(cls: type, name: str) -> None:
    reference = _options(sdk.FeatureDataset, "from_prefix")
    options = _options(cls, name)
    assert list(options) == list(reference)
    for option, parameter in options.items():
        assert parameter.annotation == reference[option].annotation, option
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            assert parameter.annotation == "Unpack[DatasetOptions]"  # typed, never Any
        else:
            assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, option


def test_dataset_options_are_typed() -> None:
    hints = typing.get_type_hints(sdk.DatasetOptions)
    assert hints == {
        "prefetch": int,
        "shuffle": bool,
        "seed": int,
        "rank": int | None,
        "world_size": int | None,
        "progress": bool,
        "drop_last": bool,
        "shuffle_buffer": int,
        "batch_size": int | None,
        "with_info": bool,
        "augment": sdk.AugmentPolicy | str | Mapping[str, Any] | None,
        "views": int,
    }


def test_stats_is_a_property_on_both_dataset_classes() -> None:
    for cls in (sdk.FeatureDataset, sdk.IterableFeatureDataset):
        assert isinstance(inspect.getattr_static(cls, "stats"), property), cls.__name__
