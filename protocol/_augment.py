"""Augmentation policies and the random views they draw: a spec on the wire, pure functions.

A pushdown request may ask for a random view of each sample instead of the preset's centre
crop (``x-hapi-augment``). The policy names torchvision's transforms, applied in the order
of the customary training pipeline and with their parameter meanings:

- ``crop(scale=LO:HI,ratio=LO:HI)``: ``RandomResizedCrop`` to the preset's input size;
  without it the preset's resize and centre crop are kept;
- ``flip(p=P)``: ``RandomHorizontalFlip``;
- ``jitter(brightness=B,contrast=C,saturation=S,hue=H)``: ``ColorJitter`` (a number ``B``
  means factors in ``[max(0, 1 - B), 1 + B]``, ``LO:HI`` the factors themselves; ``hue`` in
  ``[-H, H]`` with ``H <= 0.5``; the four adjustments in a random order).

Transforms are separated by ``;``, e.g.
``crop(scale=0.08:1,ratio=0.75:1.3333);flip(p=0.5);jitter(brightness=0.4,hue=0.1)``.

A view's random parameters are a pure function of ``(seed, bucket, sample key, view
index)`` and the image's size: each draw is a BLAKE2b hash of that tuple, a label and a
counter (a counter-based generator), never a generator's state. So the same request gives
the same view on any gateway, after any restart, in any process, on the storage side or in
the SDK's local path, whatever the library versions.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from ._errors import InvalidValue

AUGMENT_TRANSFORMS = ("crop", "flip", "jitter")
JITTER = ("brightness", "contrast", "saturation", "hue")
MAX_SPEC_LENGTH = 1024
MAX_VIEWS = 1024  # views cached per object (``x-hapi-views``)
MAX_SEED = 2**63 - 1
_ARGUMENTS = {
    "crop": ("scale", "ratio"),
    "flip": ("p",),
    "jitter": JITTER,
}
_TRANSFORM = re.compile(r"\s*([a-z_]+)\s*\(([^()]*)\)\s*")
_CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop.get_params
_VERSION = "hapi-view-v1"  # bump when the draws change, so cached views of before miss

Range = tuple[float, float]


class InvalidAugment(InvalidValue):
    """An augmentation policy that does not parse or is out of range.

    Args:
        field: The field at fault (``augment``, ``crop.scale``, ``jitter.hue``, ...).
        reason: What is wrong with it.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class AugmentPolicy:
    """Which random transforms a view goes through, and their ranges.

    Args:
        scale: ``RandomResizedCrop``'s range of the crop's area over the image's;
            ``None``: no random crop (the preset's resize and centre crop).
        ratio: ``RandomResizedCrop``'s range of the crop's aspect ratio (width / height).
        flip: The probability of a horizontal flip.
        brightness: The range of brightness factors (``None``: not jittered).
        contrast: The range of contrast factors.
        saturation: The range of saturation factors.
        hue: The range of hue shifts, within ``[-0.5, 0.5]``.
    """

    scale: Range | None = None
    ratio: Range = (3 / 4, 4 / 3)
    flip: float = 0.0
    brightness: Range | None = None
    contrast: Range | None = None
    saturation: Range | None = None
    hue: Range | None = None

    def __post_init__(self) -> None:
        if self.scale is not None:
            _check_range("crop.scale", self.scale, 0.0, 1.0, open_low=True)
            _check_range("crop.ratio", self.ratio, 0.0, 100.0, open_low=True)
        if not 0.0 <= self.flip <= 1.0:
            raise InvalidAugment("flip.p", f"must be in [0, 1], not {self.flip!r}")
        for name in ("brightness", "contrast", "saturation"):
            value = getattr(self, name)
            if value is not None:
                _check_range(f"jitter.{name}", value, 0.0, 100.0)
        if self.hue is not None:
            _check_range("jitter.hue", self.hue, -0.5, 0.5)

    @classmethod
    def parse(cls, spec: str) -> AugmentPolicy:
        """Read a policy from its spec (see the module's docstring).

        Raises:
            InvalidAugment: An unknown transform or argument, a malformed number, or a
                value out of range; ``field`` names it.
        """
        if not isinstance(spec, str) or not spec.strip():
            raise InvalidAugment("augment", "needs at least one transform: crop, flip, jitter")
        if len(spec) > MAX_SPEC_LENGTH:
            raise InvalidAugment("augment", f"a policy is at most {MAX_SPEC_LENGTH} characters")
        fields: dict[str, Any] = {}
        seen: set[str] = set()
        for part in spec.split(";"):
            name, arguments = _transform(part)
            if name in seen:
                raise InvalidAugment(name, "named twice")
            seen.add(name)
            fields.update(_arguments(name, arguments))
        return cls(**fields)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AugmentPolicy:
        """A policy from ``{"crop": {"scale": [lo, hi], ...}, "flip": {"p": 0.5}, ...}``
        (``"flip": 0.5`` is short for ``{"p": 0.5}``).

        Raises:
            InvalidAugment: As :meth:`parse`.
        """
        if not isinstance(data, dict):
            raise InvalidAugment("augment", f"must be a spec string or a mapping, not {data!r}")
        parts = []
        for name, arguments in data.items():
            if name == "flip" and isinstance(arguments, int | float):
                arguments = {"p": arguments}
            if not isinstance(arguments, dict):
                raise InvalidAugment(str(name), "needs a mapping of its arguments")
            text = ",".join(f"{k}={_spelled(v)}" for k, v in arguments.items())
            parts.append(f"{name}({text})")
        return cls.parse(";".join(parts))

    def spec(self) -> str:
        """The canonical spec: the same policy always gives the same text (cache keys)."""
        parts = []
        if self.scale is not None:
            parts.append(f"crop(scale={_range(self.scale)},ratio={_range(self.ratio)})")
        if self.flip:
            parts.append(f"flip(p={self.flip!r})")
        jitter = [f"{n}={_range(getattr(self, n))}" for n in JITTER if getattr(self, n)]
        if jitter:
            parts.append(f"jitter({','.join(jitter)})")
        return ";".join(parts)


def _transform(part: str) -> tuple[str, str]:
    match = _TRANSFORM.fullmatch(part)
    if match is None:
        raise InvalidAugment("augment", f"{part.strip()!r} is not NAME(ARG=VALUE,...)")
    name = match.group(1)
    if name not in _ARGUMENTS:
        raise InvalidAugment(
            name, f"unknown transform; known transforms: {', '.join(AUGMENT_TRANSFORMS)}"
        )
    return name, match.group(2)


def _arguments(name: str, text: str) -> dict[str, Any]:
    given: dict[str, str] = {}
    for item in filter(None, (piece.strip() for piece in text.split(","))):
        argument, equals, value = item.partition("=")
        argument = argument.strip()
        if not equals or argument not in _ARGUMENTS[name]:
            known = ", ".join(_ARGUMENTS[name])
            raise InvalidAugment(f"{name}.{argument}", f"unknown argument; known: {known}")
        given[argument] = value.strip()
    if name == "crop":
        return {
            "scale": _number_range(f"{name}.scale", given.get("scale", "0.08:1")),
            "ratio": _number_range(f"{name}.ratio", given.get("ratio", f"{3 / 4!r}:{4 / 3!r}")),
        }
    if name == "flip":
        return {"flip": _number("flip.p", given.get("p", "0.5"))}
    return {
        argument: _factors(f"jitter.{argument}", value, hue=argument == "hue")
        for argument, value in given.items()
    }


def _number(field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidAugment(field, f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise InvalidAugment(field, f"{text!r} is not a finite number")
    return value


def _number_range(field: str, text: str) -> Range:
    low, colon, high = text.partition(":")
    if not colon:
        raise InvalidAugment(field, f"{text!r} is not a range LO:HI")
    return _number(field, low), _number(field, high)


def _factors(field: str, text: str, *, hue: bool) -> Range | None:
    """torchvision's ColorJitter argument: a number ``x`` or a range ``LO:HI``."""
    if ":" in text:
        return _number_range(field, text)
    value = _number(field, text)
    if value < 0 or (hue and value > 0.5):
        bound = "[0, 0.5]" if hue else ">= 0"
        raise InvalidAugment(field, f"must be {bound}, not {value!r}")
    if value == 0:
        return None
    return (-value, value) if hue else (max(0.0, 1 - value), 1 + value)


def _check_range(field: str, value: Range, low: float, high: float, open_low: bool = False) -> None:
    first, last = value
    below = first <= low if open_low else first < low
    if below or last > high or first > last:
        bracket = "(" if open_low else "["
        raise InvalidAugment(
            field, f"must be LO:HI with {bracket}{low:g} <= LO <= HI <= {high:g}, not {value!r}"
        )


def _range(value: Range | None) -> str:
    assert value is not None
    return f"{value[0]!r}:{value[1]!r}"


def _spelled(value: Any) -> str:
    if isinstance(value, list | tuple) and len(value) == 2:
        return f"{float(value[0])!r}:{float(value[1])!r}"
    return str(value)


def view_index(epoch: int, views: int) -> int:
    """The view an epoch reads: ``epoch mod views`` with ``views`` cached per object, else
    the epoch itself (a fresh view each epoch, never cached)."""
    return epoch % views if views else epoch


@dataclass(frozen=True, kw_only=True)
class ViewParams:
    """What one view of one sample drew: torchvision's parameters of each transform.

    Args:
        view: The view index.
        box: The crop ``(top, left, height, width)`` in the (EXIF-oriented) image, as
            ``RandomResizedCrop.get_params`` returns it; ``None`` without ``crop``.
        flip: Whether the image is flipped horizontally (after the crop).
        order: The colour adjustments in the order applied (``ColorJitter``'s
            ``fn_idx``), with their factors in ``factors``.
        factors: The factor of each adjustment in ``order`` (a hue shift for ``hue``).
    """

    view: int
    box: tuple[int, int, int, int] | None
    flip: bool
    order: tuple[str, ...] = ()
    factors: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """As reported in a response: ``{"view", "box", "flip", "jitter"}``."""
        return {
            "view": self.view,
            "box": None if self.box is None else list(self.box),
            "flip": self.flip,
            "jitter": [[n, f] for n, f in zip(self.order, self.factors, strict=True)],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ViewParams:
        """The inverse of :meth:`to_dict`."""
        box = data.get("box")
        jitter = data.get("jitter", [])
        return cls(
            view=int(data["view"]),
            box=None if box is None else (int(box[0]), int(box[1]), int(box[2]), int(box[3])),
            flip=bool(data["flip"]),
            order=tuple(str(n) for n, _ in jitter),
            factors=tuple(float(f) for _, f in jitter),
        )


class _Draws:
    """Uniform numbers in ``[0, 1)`` named by (label, counter): a hash each, no state."""

    def __init__(self, *identity: Any) -> None:
        self._material = json.dumps([_VERSION, *identity], separators=(",", ":")).encode()

    def uniform(self, label: str, index: int = 0, low: float = 0.0, high: float = 1.0) -> float:
        digest = hashlib.blake2b(
            self._material + f"|{label}|{index}".encode(), digest_size=8
        ).digest()
        unit = (int.from_bytes(digest, "little") >> 11) * 2.0**-53
        return low + (high - low) * unit

    def integer(self, label: str, index: int, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        return min(high, low + int(self.uniform(label, index) * (high - low + 1)))


def draw_view(
    policy: AugmentPolicy,
    *,
    seed: int,
    bucket: str,
    key: str,
    view: int,
    size: tuple[int, int],
) -> ViewParams:
    """The random parameters of view ``view`` of sample ``key`` (``shard#member`` for a
    shard's) of an image of ``size`` ``(width, height)``, EXIF orientation applied."""
    draws = _Draws(seed, bucket, key, view)
    box = None if policy.scale is None else _crop_box(draws, policy, *size)
    flip = policy.flip > 0 and draws.uniform("flip") < policy.flip
    present = [n for n in JITTER if getattr(policy, n) is not None]
    order = list(range(len(JITTER)))
    for i in range(len(order) - 1, 0, -1):  # Fisher-Yates: torchvision's randperm(4)
        j = draws.integer("order", i, 0, i)
        order[i], order[j] = order[j], order[i]
    names = tuple(JITTER[i] for i in order if JITTER[i] in present)
    factors = tuple(draws.uniform(n, 0, *getattr(policy, n)) for n in names)
    return ViewParams(view=view, box=box, flip=flip, order=names, factors=factors)


def _crop_box(
    draws: _Draws, policy: AugmentPolicy, width: int, height: int
) -> tuple[int, int, int, int]:
    """``RandomResizedCrop.get_params``: ten tries at a random area and aspect ratio,
    then the centre crop of the ratio's nearest bound."""
    assert policy.scale is not None
    area = width * height
    log_ratio = (math.log(policy.ratio[0]), math.log(policy.ratio[1]))
    for attempt in range(_CROP_ATTEMPTS):
        target_area = area * draws.uniform("scale", attempt, *policy.scale)
        aspect = math.exp(draws.uniform("ratio", attempt, *log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = draws.integer("top", attempt, 0, height - h)
            left = draws.integer("left", attempt, 0, width - w)
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(policy.ratio):
        w, h = width, round(width / min(policy.ratio))
    elif in_ratio > max(policy.ratio):
        w, h = round(height * max(policy.ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@dataclass(frozen=True, kw_only=True)
class Augmentation:
    """One request's augmentation: a policy, its seed and the view every sample takes.

    Args:
        policy: The transforms and their ranges.
        seed: The seed (``0 <= seed < 2**63``).
        epoch: The epoch asked for.
        views: Views cached per object (``0``: a fresh view per epoch, never cached).
        bucket: The objects' bucket (part of each sample's identity).
    """

    policy: AugmentPolicy
    seed: int = 0
    epoch: int = 0
    views: int = 0
    bucket: str = ""

    @property
    def view(self) -> int:
        """The view index every sample of the request takes (:func:`view_index`)."""
        return view_index(self.epoch, self.views)

    def draw(self, key: str, size: tuple[int, int]) -> ViewParams:
        """The view of sample ``key`` of an image of ``size`` (width, height)."""
        return draw_view(
            self.policy, seed=self.seed, bucket=self.bucket, key=key, view=self.view, size=size
        )

    def cache_material(self) -> dict[str, Any] | None:
        """What the cache key adds for this view (``None``: a view never cached)."""
        if not self.views:
            return None
        return {"augment": self.policy.spec(), "seed": self.seed, "view": self.view}
