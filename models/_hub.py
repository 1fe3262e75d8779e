"""Any timm or torchvision network, by name, cut into blocks automatically.

``timm:NAME`` and ``torchvision:NAME`` build the architecture without pretrained
weights (``pretrained=False`` / ``weights=None``: nothing is ever downloaded) and load
the weights file the user has, a torch state dict or safetensors. Without one the
weights are random, seeded so that the same name exports the same blocks, and a warning
says so. The whole network is exported to ONNX once and cut at its cut points
(:mod:`hapi.models._cuts`), so a new architecture needs no family table; the blocks are
verified against the torch network on real photos.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from PIL import Image

from ._cuts import MIN_BLOCK_SHARE
from ._errors import ExportError, InvalidModelSpec
from ._exporting import OPSET, _first_line, _import_torch, _to_onnx
from ._families import StateDict, WeightsArg, _load, _read_weights, _seeded, _weights_origin
from ._import import blocks_from_onnx
from ._manifest import ExportedModel
from ._preprocess import Preset, get_preset
from ._runtime import RuntimeSettings

if TYPE_CHECKING:
    from torch import nn

_TRACE_BATCH = 2


class RandomWeightsWarning(UserWarning):
    """A network was exported with seeded random weights: no weights file was given."""


def _timm(name: str, num_classes: int | None) -> nn.Module:
    try:
        import timm
    except ImportError as exc:
        raise InvalidModelSpec("timm: networks need timm: pip install 'hapi[timm]'") from exc
    if not timm.is_model(name):
        raise InvalidModelSpec(f"unknown timm model {name!r}; see timm.list_models()")
    extra: dict[str, Any] = {} if num_classes is None else {"num_classes": num_classes}
    model: nn.Module = timm.create_model(name, pretrained=False, **extra)
    return model


def _torchvision(name: str, num_classes: int | None) -> nn.Module:
    import torchvision

    if name not in torchvision.models.list_models(module=torchvision.models):
        raise InvalidModelSpec(
            f"unknown torchvision classification model {name!r}; "
            "see torchvision.models.list_models()"
        )
    extra: dict[str, Any] = {} if num_classes is None else {"num_classes": num_classes}
    model: nn.Module = torchvision.models.get_model(name, weights=None, **extra)
    return model


HUBS: Mapping[str, Callable[[str, int | None], nn.Module]] = {
    "timm": _timm,
    "torchvision": _torchvision,
}


def _num_classes(model: nn.Module, state: StateDict) -> int | None:
    """The class count of fine-tuned weights, where it differs from the network's head.

    The head is the network's last ``Linear`` layer; weights fine-tuned for 10 classes
    carry a ``[10, features]`` matrix there.
    """
    from torch import nn

    heads = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not heads:
        return None
    name, head = heads[-1]
    weight = state.get(f"{name}.weight")
    if weight is None or weight.ndim != 2 or weight.shape[0] == head.out_features:
        return None
    return int(weight.shape[0])


def is_hub_name(spec: str) -> bool:
    """Whether ``spec`` names a hub network (``timm:NAME``, ``torchvision:NAME``)."""
    hub, sep, name = spec.partition(":")
    return bool(sep) and hub in HUBS and bool(name)


def _timm_preset(model: nn.Module, spec: str) -> Preset | None:
    """The preprocessing timm evaluates the network with (its ``pretrained_cfg``)."""
    config = getattr(model, "pretrained_cfg", None) or {}
    size = config.get("input_size")
    if not size or len(size) != 3 or size[1] != size[2]:
        return None
    crop = int(size[1])
    return Preset(
        name=spec,
        resize=math.floor(crop / float(config.get("crop_pct", 0.875))),
        crop=crop,
        mean=tuple(config.get("mean", (0.485, 0.456, 0.406))),
        std=tuple(config.get("std", (0.229, 0.224, 0.225))),
        interpolation=config.get("interpolation", "bicubic"),
    )


def build_hub(spec: str, *, weights: WeightsArg = None) -> tuple[nn.Module, Preset]:
    """Build ``timm:NAME`` or ``torchvision:NAME`` in eval mode, with its preprocessing.

    Args:
        spec: The network's name with its hub prefix.
        weights: A state dict, or a ``.safetensors`` / ``torch.save`` file. Seeded random
            weights when omitted, with a :class:`RandomWeightsWarning`. Weights whose
            head has another number of classes (fine-tuned) build the network with it.

    Raises:
        InvalidModelSpec: Unknown hub or name, or weights that do not fit.
    """
    if not is_hub_name(spec):
        raise InvalidModelSpec(f"{spec!r} is not a hub name: use timm:NAME or torchvision:NAME")
    _import_torch()
    hub, _, name = spec.partition(":")
    state = _read_weights(Path(weights)) if isinstance(weights, str | os.PathLike) else weights
    with _seeded():
        model = HUBS[hub](name, None)
    classes = None if state is None else _num_classes(model, state)
    if classes is not None:  # weights fine-tuned for another number of classes
        with _seeded():
            model = HUBS[hub](name, classes)
    if state is None:
        warnings.warn(
            f"{spec}: no weights file given; exporting seeded random weights",
            RandomWeightsWarning,
            stacklevel=2,
        )
    _load(model, state, spec)
    preset = (_timm_preset(model, spec) if hub == "timm" else None) or get_preset("imagenet")
    return model, preset


def _reference(model: nn.Module) -> Callable[[np.ndarray], np.ndarray]:
    import torch

    def run(batch: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            output = model(torch.from_numpy(batch))
        if not isinstance(output, torch.Tensor) or not output.is_floating_point():
            raise ExportError("the network must return one floating-point tensor")
        result: np.ndarray = output.numpy()
        return result

    return run


def export_hub(
    spec: str,
    *,
    weights: WeightsArg = None,
    freeze: int | None = None,
    preset: str | Preset | None = None,
    cut_at: Sequence[str] = (),
    min_share: float = MIN_BLOCK_SHARE,
    images: Sequence[Image.Image] | None = None,
    runtime: RuntimeSettings | None = None,
    progress: bool = False,
) -> ExportedModel:
    """Export ``timm:NAME`` or ``torchvision:NAME``, cut at its cut points, verified.

    Args:
        spec: The network's name with its hub prefix.
        weights: State dict or weights file; seeded random weights (with a warning) if
            omitted. Nothing is downloaded.
        freeze: Freeze point; all blocks when omitted.
        preset: Preprocessing; timm's evaluation settings for timm networks, else
            ``imagenet``, when omitted.
        cut_at: Tensor names of the exported graph to cut at instead of choosing.
        min_share: Smallest share of the FLOPs a block may hold (automatic cuts).
        images: Real images to verify with; scikit-image's sample photos when omitted.
        runtime: onnxruntime thread settings for verification and timing.
        progress: Show a progress bar on stderr.

    Raises:
        InvalidModelSpec: Unknown network, unfitting weights, bad cut tensor or freeze.
        ExportError: The network does not export, or the blocks disagree with torch.
    """
    torch = _import_torch()
    model, default = build_hub(spec, weights=weights)
    chosen = default if preset is None else preset
    crop = (chosen if isinstance(chosen, Preset) else get_preset(chosen)).crop
    sample = torch.zeros(_TRACE_BATCH, 3, crop, crop)
    try:
        graph: onnx.ModelProto = _to_onnx(model, sample)
    except Exception as exc:  # torch raises many error types for untraceable modules
        raise ExportError(f"{spec} does not export to ONNX: {_first_line(exc)}") from exc
    origin = _weights_origin(spec, weights)
    exported = blocks_from_onnx(
        graph,
        family=spec.partition(":")[0],
        source=spec,
        preset=chosen,
        freeze=freeze,
        cut_at=cut_at,
        min_share=min_share,
        images=images,
        reference=_reference(model),
        runtime=runtime,
        exporter={"torch": torch.__version__, "opset": str(OPSET)},
        progress=progress,
    )
    return dataclasses.replace(exported, weights=origin)
