"""Every gateway setting at the edge: one environment variable and one ``hapi serve`` flag each.

The knobs are generated from :class:`~hapi.gateway.GatewaySettings`' fields, so a field
added there gets its variable (``HAPI_`` + the upper-case name), its flag (``--`` + the
name with dashes), its help (the class docstring's ``Attributes`` entry) and its parser
(from the field's type; ``*_bytes*`` fields take sizes like ``2GiB``, ``*_bps`` fields
bandwidths like ``10gbit``) without touching the CLI. A field whose type the generator
does not know, or whose edge names differ, says so in its metadata with :func:`knob`.
Values travel typed from the flag or the variable to the settings; nothing is turned back
into a string on the way.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hapi.protocol import parse_bandwidth, parse_size

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True, kw_only=True)
class Knob:
    """How one settings field is reached from the edge.

    Args:
        field: The settings field.
        env: Its environment variable.
        flag: Its ``hapi serve`` flag.
        help: One line for ``--help`` and the table of docs/configuration.md.
        parse: Turns the variable's or the flag's text into the field's typed value.
        is_bool: An on/off switch (``--flag/--no-flag``).
        repeatable: The flag may be given several times (a tuple field).
        default: The field's default, as docs/configuration.md shows it (``None``: required).
        metavar: What the flag takes, for ``--help``.
    """

    field: str
    env: str
    flag: str
    help: str
    parse: Callable[[str], Any]
    is_bool: bool = False
    repeatable: bool = False
    default: str | None = None
    metavar: str = "TEXT"


def knob(
    *,
    env: str | None = None,
    flag: str | None = None,
    parse: Callable[[str], Any] | None = None,
    shown_default: str | None = None,
) -> dict[str, Any]:
    """Field metadata overriding what the generator would derive for one field."""
    given = {"env": env, "flag": flag, "parse": parse, "default": shown_default}
    return {"knob": {name: value for name, value in given.items() if value is not None}}


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case).

    Raises:
        ValueError: Anything else.
    """
    value = text.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(f"expected true or false, not {text!r}")


def parse_list(text: str) -> tuple[str, ...]:
    """A comma-separated list; empty items dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _parse_optional_int(text: str) -> int | None:
    return int(text) if text.strip() else None


def _parse_size(text: str) -> int:
    """A size, or ``0`` (the fields that take it say it means none or no limit; the others
    refuse it when the settings are validated)."""
    return 0 if text.strip() == "0" else int(parse_size(text))


def _parse_bandwidth(text: str) -> float:
    return float(parse_bandwidth(text))


_BY_TYPE: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": parse_bool,
    "int | None": _parse_optional_int,
    "tuple[str, ...]": parse_list,
}


def knobs(settings_class: type) -> tuple[Knob, ...]:
    """The knobs of every field of ``settings_class`` (a dataclass), in field order.

    Raises:
        TypeError: A field's type has no parser and its metadata gives none.
    """
    helps = _attribute_help(settings_class.__doc__ or "")
    hints = typing.get_type_hints(settings_class)
    return tuple(
        _knob(f, helps.get(f.name, ""), hints[f.name]) for f in dataclasses.fields(settings_class)
    )


def _knob(field: dataclasses.Field[Any], help_text: str, hint: Any) -> Knob:
    given: Mapping[str, Any] = field.metadata.get("knob", {})
    kind = str(field.type)
    choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()
    parse = given.get("parse") or (_choice(choices) if choices else _parser(field.name, kind))
    if parse is None:
        raise TypeError(f"settings field {field.name} ({kind}) needs a parser: knob(parse=...)")
    return Knob(
        field=field.name,
        env=given.get("env", "HAPI_" + field.name.upper()),
        flag=given.get("flag", "--" + field.name.replace("_", "-")),
        help=help_text,
        parse=parse,
        is_bool=kind == "bool",
        repeatable=kind.startswith("tuple["),
        default=given.get("default", _shown_default(field)),
        metavar="|".join(choices) or _metavar(field.name, kind, given.get("env", "")),
    )


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, not {text!r}")
        return text

    return parse


def _metavar(name: str, kind: str, env: str) -> str:
    if env.endswith("_FILE"):
        return "FILE"
    if "_bytes" in name:
        return "SIZE"
    if name.endswith("_bps"):
        return "RATE"
    if name.endswith("_s"):
        return "SECONDS"
    return {"int": "N", "int | None": "N", "float": "NUMBER"}.get(kind, "TEXT")


def _parser(name: str, kind: str) -> Callable[[str], Any] | None:
    if "_bytes" in name and kind == "int":
        return _parse_size
    if name.endswith("_bps") and kind == "float":
        return _parse_bandwidth
    return _BY_TYPE.get(kind)


def _shown_default(field: dataclasses.Field[Any]) -> str | None:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return None
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    return "unset" if value is None else str(value)


def _attribute_help(doc: str) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Attributes:`` section, joined per entry."""
    lines = inspect.cleandoc(doc).splitlines()
    heading = next((i for i, line in enumerate(lines) if line.strip() == "Attributes:"), None)
    entries: dict[str, str] = {}
    if heading is None:
        return entries
    body = lines[heading + 1 :]
    indent = next((len(x) - len(x.lstrip()) for x in body if x.strip()), 0)
    current = None
    for line in body:
        depth = len(line) - len(line.lstrip())
        match = re.match(r"(\w+): (.*)$", line.strip())
        if line.strip() and depth < indent:
            break
        if match and depth == indent:
            current = match.group(1)
            entries[current] = match.group(2).strip()
        elif current and line.strip():
            entries[current] += " " + line.strip()
    return entries


def from_environment(all_knobs: tuple[Knob, ...], env: Mapping[str, str]) -> dict[str, Any]:
    """Typed values of the knobs whose variables are set (and not empty) in ``env``.

    Raises:
        ValueError: A variable's value does not parse (the message names the variable).
    """
    values: dict[str, Any] = {}
    for item in all_knobs:
        text = env.get(item.env)
        if not text:
            continue
        try:
            values[item.field] = item.parse(text)
        except ValueError as exc:
            raise ValueError(f"{item.env}={text!r}: {exc}") from exc
    return values


def markdown_table(all_knobs: tuple[Knob, ...]) -> str:
    """The table of docs/configuration.md: variable, flag, meaning, default, one row each."""
    rows = ["| variable | `hapi serve` flag | meaning | default |", "|---|---|---|---|"]
    for item in all_knobs:
        default = "required" if item.default is None else f"`{item.default}`"
        rows.append(f"| `{item.env}` | `{item.flag}` | {item.help} | {default} |")
    return "\n".join(rows) + "\n"
