"""The example's bytes verdict gives advice the user can follow."""

from __future__ import annotations

from hapi.examples.transfer_learning import report_bytes


def test_fewer_bytes_are_reported_as_such() -> None:
    assert "2.0x fewer bytes than the raw images" in report_bytes(500, 1000, split=3, freeze=19)


def test_more_bytes_before_the_freeze_point_suggests_a_later_split() -> None:
    line = report_bytes(3000, 1000, split=3, freeze=19)
    assert "3.0x MORE bytes" in line and "a later split" in line


def test_more_bytes_at_the_freeze_point_suggests_what_can_still_help() -> None:
    # There is no later split: halve the features, or read the raw objects.
    line = report_bytes(1400, 1000, split=19, freeze=19)
    assert "a later split" not in line
    assert "--dtype float16" in line and "--split none" in line


def test_the_raw_images_themselves_are_not_called_fewer_bytes() -> None:
    line = report_bytes(1000, 1000, split=None, freeze=19)
    assert "fewer" not in line and "MORE" not in line and "the raw images themselves" in line
