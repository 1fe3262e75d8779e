"""Units, both ways: ``"100mbit"`` to bits per second, ``"4GB"`` to bytes, and back.

The unit's case decides bits or bytes, as is conventional in networking: a lowercase
``b`` (or the word ``bit``) means bits, an uppercase ``B`` (or the word ``byte``) means
bytes. Prefixes are decimal (``k``, ``M``, ``G``, ``T``, either case: ``m`` never means
milli here) or binary (``Ki``, ``Mi``, ``Gi``, ``Ti``). A per-second suffix (``/s``,
``ps``) is optional. A bare number is bits per second.
"""

from __future__ import annotations

import math
import re

from ._errors import InvalidValue

_PATTERN = re.compile(
    r"""
    \s*(?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)
    \s*(?:(?P<prefix>[kKmMgGtT])(?P<binary>i)?)?
    (?P<unit>bits?|bytes?|Bits?|Bytes?|b|B)?
    (?:/s|/sec|ps)?\s*
    """,
    re.VERBOSE,
)
_DECIMAL = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BINARY = {"k": 2.0**10, "m": 2.0**20, "g": 2.0**30, "t": 2.0**40}
ACCEPTED_FORMS = (
    "a number with a unit, e.g. 100mbit, 1gbit, 50Mbit/s, 100Mbps (bits: b, bit) or "
    "2.5GB/s, 12MB/s (bytes: B, byte); prefixes k, M, G, T (x1000) or Ki, Mi, Gi, Ti "
    "(x1024); a bare number is bits/s"
)


def parse_bandwidth(text: str) -> float:
    """Parse a bandwidth into bits per second.

    Args:
        text: ``100mbit``, ``1gbit``, ``50Mbit/s``, ``100Mbps``, ``2.5GB/s``, ``1e9``...

    Returns:
        Bits per second, a positive finite float.

    Raises:
        InvalidValue: Not one of the accepted forms (the message lists them), or not positive.
    """
    match = _PATTERN.fullmatch(text)
    if match is None or (match["prefix"] and not match["unit"]):
        raise InvalidValue(f"invalid bandwidth {text!r}: use {ACCEPTED_FORMS}")
    value = float(match["number"])
    if match["prefix"]:
        table = _BINARY if match["binary"] else _DECIMAL
        value *= table[match["prefix"].lower()]
    unit = match["unit"] or "b"
    if unit == "B" or unit.lower().startswith("byte"):
        value *= 8
    if not 0 < value < math.inf:
        raise InvalidValue(f"invalid bandwidth {text!r}: it must be positive and finite")
    return value


_SIZE = re.compile(
    r"\s*(?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*"
    r"(?:(?P<prefix>[kKmMgGtT])(?P<binary>i)?)?B?\s*"
)


def parse_size(text: str) -> int:
    """Parse a memory size into bytes: ``4GB``, ``512MiB``, ``8G``, ``1000000``.

    Raises:
        InvalidValue: Not a positive size in one of those forms.
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise InvalidValue(
            f"invalid size {text!r}: use bytes with an optional prefix, e.g. 4GB, 512MiB, 8G"
        )
    value = float(match["number"])
    if match["prefix"]:
        value *= (_BINARY if match["binary"] else _DECIMAL)[match["prefix"].lower()]
    if not 1 <= value < math.inf:
        raise InvalidValue(f"invalid size {text!r}: it must be at least one byte")
    return int(value)


def format_bandwidth(bits_per_second: float) -> str:
    """``1e8`` -> ``"100 Mbit/s"`` (decimal prefixes, three significant digits)."""
    if math.isinf(bits_per_second):
        return "unlimited"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bits_per_second >= scale:
            return f"{bits_per_second / scale:.3g} {prefix}bit/s"
    return f"{bits_per_second:.3g} bit/s"


def format_bytes(count: float, *, binary: bool = False) -> str:
    """``802816`` -> ``"802.8 KB"`` (decimal units, like ``hapi models show``), or with
    ``binary`` -> ``"784.0 KiB"`` (powers of 1024, like ``hapi serve``'s memory figures)."""
    base, units = (1024, ("B", "KiB", "MiB", "GiB")) if binary else (1000, ("B", "KB", "MB", "GB"))
    for unit in units:
        if abs(count) < base or unit == units[-1]:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= base
    raise AssertionError("unreachable")
