"""Bandwidth and size strings."""

from __future__ import annotations

import math

import pytest

from hapi.protocol import InvalidValue, format_bandwidth, format_bytes, parse_bandwidth, parse_size


@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("100mbit", 100e6),
        ("1gbit", 1e9),
        ("50Mbit/s", 50e6),
        ("50 Mbit/s", 50e6),
        ("100Mbps", 100e6),
        ("100mbps", 100e6),
        ("10Gb", 10e9),
        ("2.5GB/s", 2.5e9 * 8),
        ("12MB/s", 12e6 * 8),
        ("100MBps", 100e6 * 8),
        ("1 gigabit", None),
        ("1Mibit", 2**20),
        ("1MiB/s", 2**20 * 8),
        ("3kbit", 3e3),
        ("1e9", 1e9),
        ("1000", 1000.0),
        ("1.5e2Mbit", 150e6),
        ("2 bytes/s", 16.0),
        (".5Gbit", 0.5e9),
    ],
)
def test_parse_bandwidth(text: str, bits: float | None) -> None:
    if bits is None:
        with pytest.raises(InvalidValue):
            parse_bandwidth(text)
    else:
        assert parse_bandwidth(text) == pytest.approx(bits)


@pytest.mark.parametrize("text", ["", "fast", "100m", "100 G", "mbit", "-5mbit", "1e400", "0"])
def test_bad_bandwidth_lists_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError) as caught:  # InvalidValue is a ValueError
        parse_bandwidth(text)
    message = str(caught.value)
    assert message.startswith(f"invalid bandwidth {text!r}")
    if text not in {"1e400", "0"}:
        assert "100mbit, 1gbit, 50Mbit/s" in message and "2.5GB/s" in message
        assert "bits: b, bit" in message and "bytes: B, byte" in message


@pytest.mark.parametrize(
    ("bits", "text"),
    [(100e6, "100 Mbit/s"), (1e9, "1 Gbit/s"), (2.5e10, "25 Gbit/s"), (5e4, "50 kbit/s")],
)
def test_format_bandwidth(bits: float, text: str) -> None:
    assert format_bandwidth(bits) == text
    assert format_bandwidth(math.inf) == "unlimited"


@pytest.mark.parametrize(
    ("text", "size"),
    [("4GB", 4_000_000_000), ("512MiB", 512 * 2**20), ("8G", 8e9), ("1000000", 1_000_000)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "4Gbit", "0", "-1GB"])
def test_bad_size(text: str) -> None:
    with pytest.raises(InvalidValue, match="invalid size"):
        parse_size(text)


def test_byte_sizes_are_written_one_way_in_decimal_or_binary_units() -> None:
    assert format_bytes(999) == "999 B"
    assert format_bytes(802_816) == "802.8 KB"
    assert format_bytes(802_816, binary=True) == "784.0 KiB"
    assert format_bytes(4 * 2**30, binary=True) == "4.0 GiB"
    assert format_bytes(5e12) == "5000.0 GB"
