"""Model names and references: what may name a model, and ``NAME@VERSION``."""

from __future__ import annotations

import re

from ._errors import InvalidModelSpec

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_name(name: str) -> str:
    """Return ``name`` if it can name a model, else raise :class:`InvalidModelSpec`.

    A name is 1 to 128 characters: letters, digits, ``.``, ``_`` and ``-``, starting
    with a letter or digit, so that it is one plain S3 key segment.
    """
    if not _NAME.fullmatch(name):
        raise InvalidModelSpec(
            f"invalid model name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def parse_ref(ref: str) -> tuple[str, int | None]:
    """Split ``NAME``, ``NAME@latest`` or ``NAME@VERSION`` into name and version (or None).

    Raises:
        InvalidModelSpec: Not a valid reference.
    """
    name, sep, version = ref.partition("@")
    check_name(name)
    if not sep or version == "latest":
        return name, None
    if not version.isdigit() or int(version) < 1:
        raise InvalidModelSpec(f"invalid version in {ref!r}: use NAME@N with N >= 1")
    return name, int(version)
