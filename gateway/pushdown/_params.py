"""Pushdown parameters, validated as a set, from headers, the query or a batch body.

A request that names any ``x-hapi-*`` header or ``hapi-*`` query parameter is a pushdown
request: every name must be a known one and the set must make sense (a split needs a
model), so that a misspelling is an error rather than a silent plain read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hapi import protocol
from hapi.models import InvalidModelSpec, Manifest, parse_ref
from hapi.protocol import (
    ENCODINGS,
    MAX_SEED,
    MAX_VIEWS,
    Augmentation,
    AugmentPolicy,
    InvalidAugment,
)
from hapi.protocol import WIRE_DTYPES as DTYPES

from .._errors import InvalidArgument, InvalidRequest

PARAMETERS = (
    "model",
    "split",
    "dtype",
    "format",
    "bandwidth",
    "cache",
    "augment",
    "seed",
    "epoch",
    "views",
    "encoding",
)
_AUGMENT_OPTIONS = ("seed", "epoch", "views")  # meaningful only with ``augment``
_MAX_EPOCH = 2**31 - 1
FORMATS = ("safetensors", "json")
MAX_BATCH_BODY = 1024 * 1024
_BATCH_FIELDS = ("keys", *PARAMETERS)
_BATCH_QUERY = ("batch", "format", "cache")  # what ``POST ?hapi-batch`` takes besides its body
_INTEGER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class Params:
    """What a pushdown request asks for."""

    model: str
    split: int | None  # None: ``auto``, the planner chooses
    dtype: str = "float32"
    format: str = "safetensors"
    bandwidth_bps: float | None = None  # the client's link, for ``auto``
    cache: str = "use"  # the feature cache: ``use``, ``bypass`` or ``refresh``
    colocated: bool = False  # the client is on the gateway's machine (for ``auto``)
    augment: Augmentation | None = None  # random views in place of the centre crop
    encoding: str = "dense"  # the answer's body: ``dense`` safetensors, or ``zeros`` frames


def known_parameters(names: tuple[str, ...] = PARAMETERS) -> str:
    """The known names, as a client may spell them (headers, then query parameters)."""
    headers = ", ".join(f"x-hapi-{n}" for n in names)
    return f"{headers} (or the query parameters {', '.join(f'hapi-{n}' for n in names)})"


def parse_params(given: Mapping[str, tuple[str, str]]) -> Params:
    """Pushdown parameters of a GET, as the edge parsed them (:class:`S3Operation.hapi`:
    short name to ``(name as spelled, value)``, from ``x-hapi-*`` headers or ``hapi-*``
    query parameters).

    Raises:
        InvalidArgument: An unknown name, a parameter without a model, or a bad value.
    """
    _known(given, PARAMETERS)
    model = given.get("model")
    if model is None or not model[1]:
        named = ", ".join(sorted(spelled for spelled, _ in given.values()))
        raise InvalidArgument(
            f"{named}: a pushdown request needs x-hapi-model (NAME or NAME@VERSION); "
            f"known parameters: {known_parameters()}"
        )

    def value(name: str) -> str | None:
        return given[name][1] if name in given else None

    return make_params(
        model[1],
        _text_split(value("split")),
        value("dtype"),
        value("format"),
        value("bandwidth"),
        value("cache"),
        augment=value("augment"),
        options={n: _text_integer(n, value(n)) for n in _AUGMENT_OPTIONS if n in given},
        encoding=value("encoding"),
    )


def _known(given: Mapping[str, tuple[str, str]], allowed: tuple[str, ...]) -> None:
    """Refuse a parameter outside ``allowed``.

    Raises:
        InvalidArgument: A name outside ``allowed``.
    """
    unknown = sorted(spelled for short, (spelled, _) in given.items() if short not in allowed)
    if unknown:
        raise InvalidArgument(
            f"unknown pushdown parameter {', '.join(unknown)}; "
            f"known parameters: {known_parameters(allowed)}"
        )


def _text_split(text: str | None) -> int | str | None:
    """A split as written in a header or query: an integer or ``auto``."""
    if text is None or text == "auto":
        return text
    if not _INTEGER.fullmatch(text.strip()):
        raise InvalidArgument(f"x-hapi-split must be an integer or auto, not {text!r}")
    return int(text)


def _text_integer(name: str, text: str | None) -> int:
    """``x-hapi-seed``, ``-epoch`` or ``-views`` as written in a header or query."""
    if text is None or not _INTEGER.fullmatch(text.strip()):
        raise InvalidArgument(f"x-hapi-{name} must be an integer, not {text!r}")
    return int(text)


def make_params(
    model: Any,
    split: Any,
    dtype: Any,
    fmt: Any,
    bandwidth: Any = None,
    cache: Any = None,
    *,
    augment: Any = None,
    options: Mapping[str, Any] | None = None,
    encoding: Any = None,
) -> Params:
    """Validate pushdown parameters; ``split`` is an ``int``, ``"auto"`` or None;
    ``augment`` a policy spec (or, from a batch body, its mapping form) and ``options``
    its ``seed``, ``epoch`` and ``views``; ``encoding`` the answer's (``dense`` or
    ``zeros``, for a safetensors answer only).

    Raises:
        InvalidArgument: A missing or invalid parameter.
    """
    model = _model(model)
    dtype, fmt = _dtype_format(dtype, fmt)
    mode = _cache_mode(cache)
    augmentation = augmentation_of(augment, options or {})
    coding = _encoding(encoding, fmt)
    if split is None:
        raise InvalidArgument(
            "a pushdown request needs x-hapi-split (an integer 0..freeze, or auto)"
        )
    if split == "auto":
        return Params(
            model,
            None,
            dtype,
            fmt,
            _bandwidth(bandwidth),
            mode,
            augment=augmentation,
            encoding=coding,
        )
    if isinstance(split, bool) or not isinstance(split, int):
        raise InvalidArgument(f"split must be an integer or auto, not {split!r}")
    if split < 0:
        raise InvalidArgument(f"x-hapi-split must be >= 0, not {split}")
    return Params(model, split, dtype, fmt, cache=mode, augment=augmentation, encoding=coding)


def augmentation_of(augment: Any, options: Mapping[str, Any]) -> Augmentation | None:
    """The request's augmentation: a policy (spec or mapping), its seed, the epoch and
    the views cached per object.

    Raises:
        InvalidArgument: A policy that does not parse or is out of range (the message names
            the field), an option out of range, or options without a policy.
    """
    if augment is None:
        if options:
            named = ", ".join(f"x-hapi-{n}" for n in options)
            raise InvalidArgument(f"{named}: only with x-hapi-augment (a policy to draw from)")
        return None
    try:
        policy = (
            AugmentPolicy.from_dict(augment)
            if isinstance(augment, dict)
            else AugmentPolicy.parse(augment)
        )
    except InvalidAugment as exc:
        raise InvalidArgument(f"x-hapi-augment: {exc}") from exc
    bounds = {"seed": MAX_SEED, "epoch": _MAX_EPOCH, "views": MAX_VIEWS}
    values = {}
    for name, high in bounds.items():
        value = options.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise InvalidArgument(f"x-hapi-{name} must be an integer in 0..{high}, not {value!r}")
        values[name] = value
    return Augmentation(
        policy=policy, seed=values["seed"], epoch=values["epoch"], views=values["views"]
    )


def _cache_mode(value: Any) -> str:
    if value is None or value == "":
        return "use"
    if value not in ("bypass", "refresh"):
        raise InvalidArgument(f"x-hapi-cache must be bypass or refresh, not {value!r}")
    return str(value)


def _encoding(value: Any, fmt: str) -> str:
    if value is None:
        return "dense"
    if not isinstance(value, str) or value not in ENCODINGS:
        raise InvalidArgument(
            f"x-hapi-encoding must be one of {', '.join(ENCODINGS)}, not {value!r}"
        )
    if value != "dense" and fmt != "safetensors":
        raise InvalidArgument(
            f"x-hapi-encoding={value} encodes safetensors answers; x-hapi-format={fmt} "
            "answers a JSON summary"
        )
    return value


def _model(model: Any) -> str:
    if not isinstance(model, str):
        raise InvalidArgument(f"the model must be NAME or NAME@VERSION, not {model!r}")
    try:
        parse_ref(model)
    except InvalidModelSpec as exc:
        raise InvalidArgument(f"x-hapi-model: {exc}") from exc
    return model


def _dtype_format(dtype: Any, fmt: Any) -> tuple[str, str]:
    dtype = "float32" if dtype is None else dtype
    if dtype not in DTYPES or not isinstance(dtype, str):
        raise InvalidArgument(f"x-hapi-dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    fmt = "safetensors" if fmt is None else fmt
    if fmt not in FORMATS or not isinstance(fmt, str):
        raise InvalidArgument(f"x-hapi-format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return dtype, fmt


def _bandwidth(text: Any) -> float | None:
    if text is None:
        return None
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise InvalidArgument(f"x-hapi-bandwidth must be a rate such as 100mbit, not {text!r}")
    try:
        return float(protocol.parse_bandwidth(str(text)))
    except ValueError as exc:
        raise InvalidArgument(f"x-hapi-bandwidth: {exc}") from exc


def parse_batch(
    body: bytes, given: Mapping[str, tuple[str, str]], *, max_keys: int
) -> tuple[list[str], Params]:
    """The keys and parameters of ``POST /{bucket}?hapi-batch``.

    The body is ``{"keys": [...], "model": ..., "split": ..., "dtype": ..., "format": ...,
    "bandwidth": ..., "augment": ..., "seed": ..., "epoch": ..., "views": ...,
    "encoding": ...}``; ``format`` may also come as ``x-hapi-format`` or ``hapi-format``.

    Raises:
        InvalidArgument: Not such a JSON object, an unknown field, or a bad value.
        InvalidRequest: More than ``max_keys`` keys, or a body over 1 MiB.
    """
    _known(given, _BATCH_QUERY)
    spec = _batch_json(body)
    unknown = sorted(set(spec) - set(_BATCH_FIELDS))
    if unknown:
        raise InvalidArgument(
            f"unknown batch field {', '.join(map(repr, unknown))}; "
            f"known fields: {', '.join(_BATCH_FIELDS)}"
        )
    keys = spec.get("keys")
    if not isinstance(keys, list) or not keys:
        raise InvalidArgument('a batch body needs "keys": a non-empty list of object keys')
    if len(keys) > max_keys:
        raise InvalidRequest(
            f"a batch may name at most {max_keys} keys (HAPI_MAX_BATCH_KEYS), not {len(keys)}"
        )
    if not all(isinstance(k, str) and k for k in keys):
        raise InvalidArgument("batch keys must be non-empty strings")
    if "model" not in spec:
        raise InvalidArgument("the batch body needs a model (NAME or NAME@VERSION)")
    fmt = spec.get("format", given["format"][1] if "format" in given else None)
    cache = spec.get("cache", given["cache"][1] if "cache" in given else None)
    params = make_params(
        spec["model"],
        spec.get("split"),
        spec.get("dtype"),
        fmt,
        spec.get("bandwidth"),
        cache,
        augment=spec.get("augment"),
        options={n: spec[n] for n in _AUGMENT_OPTIONS if n in spec},
        encoding=spec.get("encoding"),
    )
    return keys, params


def _batch_json(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_BATCH_BODY:
        raise InvalidRequest(f"a batch body is limited to {MAX_BATCH_BODY} bytes")
    try:
        spec = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"the batch body is not JSON: {exc}") from exc
    except RecursionError:
        raise InvalidArgument("the batch body is nested too deeply to be a batch") from None
    if not isinstance(spec, dict):
        raise InvalidArgument(
            'a batch body is {"keys": [...], "model": ..., "split": ..., "dtype": ...}'
        )
    return spec


def check_augment(manifest: Manifest, params: Params) -> None:
    """Refuse an augmentation the served preset's decoder cannot honour: only Pillow
    reproduces torchvision's crops, flips and colour adjustments to the bit.

    Raises:
        InvalidArgument: ``augment`` with a gateway that decodes with DALI.
    """
    decoder = manifest.preprocess.decoder
    if params.augment is not None and decoder != "pil":
        raise InvalidArgument(
            f"x-hapi-augment: this gateway decodes with {decoder} (--decoder), which cannot "
            "apply the policy with torchvision's pixels; augmented views need --decoder pil"
        )


def check_split(manifest: Manifest, split: int) -> None:
    """Refuse a split the model does not have.

    Raises:
        InvalidArgument: ``split`` is outside ``0..freeze`` of ``manifest``.
    """
    if not 0 <= split <= manifest.freeze:
        raise InvalidArgument(
            f"x-hapi-split must be in 0..{manifest.freeze} for {manifest.ref}, not {split}"
        )
