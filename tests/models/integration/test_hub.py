"""timm: and torchvision: networks from a weights file, cut automatically, equal to torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import save_file

from hapi.models import InvalidModelSpec, Registry, create_session, export_model, preprocess_batch
from hapi.models.testing import RandomWeightsWarning, build_hub, compose


def _trained_like(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights unlike the seeded default: other random values, non-trivial BN statistics."""
    generator = torch.Generator().manual_seed(7)
    state = {}
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            noise = torch.rand(value.shape, generator=generator)
            value = value * (0.5 + noise) if "running_var" in key else value + 0.01 * noise
        state[key] = value.clone()
    return state


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


@pytest.mark.slow
def test_torchvision_network_from_a_weights_file(
    invoke, backend_s3, unique_bucket, tmp_path: Path, photos
) -> None:
    import torchvision

    net = torchvision.models.mobilenet_v3_small(weights=None)
    weights = tmp_path / "mobilenet.pt"
    torch.save(_trained_like(net), weights)
    net.load_state_dict(torch.load(weights, weights_only=True))
    net.eval()

    done = invoke("export", "torchvision:mobilenet_v3_small", "--weights", str(weights))
    assert done.exit_code == 0, done.output
    assert "warning" not in done.stderr
    registry = Registry(backend_s3, unique_bucket)
    manifest = registry.get_manifest("mobilenet_v3_small")
    assert manifest.source == "torchvision:mobilenet_v3_small"
    assert manifest.family == "torchvision" and manifest.freeze == len(manifest.blocks)
    assert len(manifest.blocks) >= 8
    assert manifest.blocks[-1].output_shape == (1000,)

    batch = preprocess_batch(photos, manifest.preprocess)
    with torch.no_grad():
        want = net(torch.from_numpy(batch)).numpy()
    graph = registry.load_blocks(manifest)
    _close(create_session(graph).run(None, {"input": batch})[0], want)


@pytest.mark.slow
def test_timm_network_from_safetensors(tmp_path: Path, photos) -> None:
    timm = pytest.importorskip("timm")
    net = timm.create_model("resnet10t", pretrained=False)
    weights = tmp_path / "resnet10t.safetensors"
    save_file(_trained_like(net), str(weights))
    exported = export_model("timm:resnet10t", weights=weights)
    net.load_state_dict(_trained_like(net))
    net.eval()

    assert exported.source == "timm:resnet10t" and exported.family == "timm"
    preset = exported.preprocess
    assert (preset.crop, preset.interpolation) == (176, "bicubic")  # timm's evaluation setup
    infos = [block.info for block in exported.blocks]
    assert [i.name for i in infos[2:5]] == ["layer1.0", "layer2.0", "layer3.0"]
    assert infos[-1].input_shape == (512,) and infos[-1].output_shape == (1000,)

    batch = preprocess_batch(photos, preset)
    with torch.no_grad():
        want = net(torch.from_numpy(batch)).numpy()
    graphs = [onnx.load_from_string(block.data) for block in exported.blocks]
    _close(create_session(compose(graphs)).run(None, {"input": batch})[0], want)
    features = create_session(compose(graphs[:-1])).run(None, {"input": batch})[0]
    with torch.no_grad():
        _close(
            features,
            net.forward_head(
                net.forward_features(torch.from_numpy(batch)), pre_logits=True
            ).numpy(),
        )


def test_without_weights_the_network_is_random_and_says_so() -> None:
    with pytest.warns(RandomWeightsWarning, match="seeded random weights"):
        first, _ = build_hub("torchvision:resnet18")
    with pytest.warns(RandomWeightsWarning):
        second, _ = build_hub("torchvision:resnet18")
    for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # seeded: the same name exports the same blocks


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("timm:no_such_net", r"unknown timm model 'no_such_net'"),
        ("torchvision:no_such_net", r"unknown torchvision classification model 'no_such_net'"),
        ("hub:resnet18", r"not a hub name: use timm:NAME or torchvision:NAME"),
    ],
)
def test_unknown_networks(spec: str, message: str) -> None:
    with pytest.raises(InvalidModelSpec, match=message):
        build_hub(spec)


def test_weights_that_do_not_fit(tmp_path: Path) -> None:
    import torchvision

    weights = tmp_path / "resnet18.pt"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)
    with pytest.raises(InvalidModelSpec, match=r"weights do not fit torchvision:resnet34"):
        build_hub("torchvision:resnet34", weights=weights)


def test_cli_refuses_bad_hub_input_in_one_line(invoke, stored) -> None:
    unknown = invoke("export", "timm:no_such_net")
    assert unknown.exit_code == 2, unknown.output
    assert "unknown timm model 'no_such_net'" in unknown.stderr
    misplaced = invoke("export", "resnet18", "--cut-at", "x")
    assert misplaced.exit_code == 2
    assert "--preset and --cut-at are for timm:/torchvision: names" in misplaced.stderr
    half = invoke("export", "torchvision:resnet18", "--fp16")
    assert half.exit_code == 2 and "--fp16 is for the built-in families only" in half.stderr
    assert stored() == {}


@pytest.mark.slow
def test_cli_warns_about_random_weights(invoke, stored) -> None:
    done = invoke("export", "torchvision:resnet18", "--freeze", "99")
    assert done.exit_code == 2
    lines = done.stderr.strip().splitlines()
    assert "warning: torchvision:resnet18: no weights file given" in lines[0]
    assert "freeze 99 is out of range" in lines[-1]
    assert stored() == {}


def test_weights_fine_tuned_for_other_classes_build_that_head(tmp_path: Path) -> None:
    import torchvision

    tuned = torchvision.models.resnet18(weights=None, num_classes=7)
    weights = tmp_path / "tuned.safetensors"
    save_file(tuned.state_dict(), str(weights))
    model, _ = build_hub("torchvision:resnet18", weights=weights)
    assert model.fc.out_features == 7
    assert torch.equal(model.fc.weight, tuned.fc.weight)
