"""Block decompositions: every family chains back to the original network."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

from hapi.models import InvalidModelSpec
from hapi.models.testing import FAMILIES, Decomposition, build


def _reference(family: str) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return getattr(torchvision.models, family)(weights=None).eval()


def _chained(decomposition: Decomposition, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        for block in decomposition.blocks:
            x = block(x)
    return x


# resnet50 shares its builder with resnet18 (and is exported in test_registry); vgg11 and
# vgg19 share theirs with alexnet. Leaving them out saves 20 s of weight initialisation.
@pytest.mark.parametrize(
    "family", ["resnet18", "alexnet", "densenet121", "mobilenet_v3_large", "vit_b_16"]
)
def test_torchvision_blocks_chain_to_the_whole_network(family: str) -> None:
    decomposition = build(family)
    side = 224 if family == "vit_b_16" else 64  # convnets pool adaptively; smaller is faster
    x = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _reference(family)(x)
    torch.testing.assert_close(_chained(decomposition, x), expected, rtol=0, atol=1e-5)
    assert len(decomposition.blocks) == len(decomposition.names) >= 9
    assert 1 <= decomposition.freeze < len(decomposition.blocks)
    assert decomposition.names[decomposition.freeze - 1] in {"pool", "class_token"}


def test_efficientnet_lite0_has_real_weights_and_sees_a_cat(
    effnet: Decomposition, photo_batch
) -> None:
    logits = _chained(effnet, torch.from_numpy(photo_batch(effnet)))
    assert logits.shape == (4, 1000)
    assert (
        281 <= int(logits[0].argmax()) <= 285
    )  # chelsea: tabby/tiger/Persian/Siamese/Egyptian cat
    assert effnet.preset.name == "efficientnet-lite"
    assert sum(p.numel() for b in effnet.blocks for p in b.parameters()) == 4_652_008


def test_random_weights_are_seeded_so_exports_repeat() -> None:
    first, second = build("resnet18"), build("resnet18")
    for a, b in zip(first.blocks, second.blocks, strict=True):
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa, pb)


def test_all_families_are_known() -> None:
    assert set(FAMILIES) == {
        "resnet18", "resnet50", "vgg11", "vgg19", "alexnet", "densenet121",
        "mobilenet_v3_large", "vit_b_16", "efficientnet_lite0",
    }  # fmt: skip


def test_unknown_family_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown model family 'resnet9'.*resnet18.*vit_b_16"):
        build("resnet9")


def test_weights_file_and_state_dict(tmp_path: Path) -> None:
    model = torchvision.models.resnet18(weights=None)
    path = tmp_path / "r18.safetensors"
    save_file(model.state_dict(), str(path))
    from_file = build("resnet18", weights=path)
    from_dict = build("resnet18", weights=model.state_dict())
    assert torch.equal(from_file.blocks[-1].weight, model.fc.weight)
    assert torch.equal(from_dict.blocks[-1].weight, model.fc.weight)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "r18.pt")
    assert torch.equal(
        build("resnet18", weights=tmp_path / "r18.pt").blocks[-1].weight, model.fc.weight
    )


def test_bad_weights_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelSpec, match="weights file not found"):
        build("resnet18", weights=tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(InvalidModelSpec, match="expected a state dict"):
        build("resnet18", weights=tmp_path / "junk.pt")
    with pytest.raises(InvalidModelSpec, match="pass a resnet18 state dict"):
        build("resnet18", weights={"fc.weight": torch.zeros(3, 3)})
    with pytest.raises(InvalidModelSpec, match="missing"):
        build("resnet18", weights={})


def test_custom_sequential_and_list() -> None:
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten())
    decomposition = Decomposition.custom(net, preset="imagenet")
    assert decomposition.names == ("0", "1", "2") and decomposition.freeze == 3
    as_list = Decomposition.custom(list(net), freeze=2, names=["conv", "relu", "flat"])
    assert as_list.blocks == decomposition.blocks and as_list.freeze == 2
    with pytest.raises(InvalidModelSpec, match=r"choose 1\.\.3"):
        decomposition.check_freeze(4)
    with pytest.raises(InvalidModelSpec, match="preset"):
        Decomposition.custom(net, preset="nope")
