"""Names that left ``hapi.models.__all__`` still resolve for one release, with a warning."""

from __future__ import annotations

import pytest

from hapi import models
from hapi.models import cli, testing


@pytest.mark.parametrize("name", sorted(testing.__all__))
def test_a_testing_name_is_a_deprecated_alias(name: str) -> None:
    with pytest.warns(DeprecationWarning, match="hapi.models.testing"):
        assert getattr(models, name) is getattr(testing, name)
    assert name not in models.__all__


@pytest.mark.parametrize("name", ["cli_errors", "open_registry"])
def test_a_cli_helper_is_a_deprecated_alias(name: str) -> None:
    with pytest.warns(DeprecationWarning, match="hapi.models.cli"):
        assert getattr(models, name) is getattr(cli, name)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        models.no_such_name  # noqa: B018


def test_the_public_surface_stays_small() -> None:
    assert len(models.__all__) <= 40
