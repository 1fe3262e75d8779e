"""Export verification: tolerances relative to the output, integer outputs, any iterable."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hapi.models import (
    ExportError,
    InvalidModelSpec,
    create_session,
    export_model,
    preprocess_batch,
)
from hapi.models.testing import Decomposition
from tests.models.support import calibrated_net


def test_large_activations_verify_relative_to_their_magnitude(photos) -> None:
    decomposition = Decomposition.custom(calibrated_net())
    exported = export_model(decomposition)
    x = torch.from_numpy(preprocess_batch(photos, decomposition.preset))
    with torch.no_grad():
        for block, done in zip(decomposition.blocks, exported.blocks, strict=True):
            want = block(x).numpy()
            got = create_session(done.data).run(None, {"input": x.numpy()})[0]
            peak = float(np.abs(want).max())
            assert np.abs(got - want).max() <= 1e-4 * max(1.0, peak)
            x = torch.from_numpy(want)
    assert peak > 200  # the case the absolute limit rejected


class _Scale(nn.Module):
    """Multiplies in torch, adds in ONNX's eyes: disagrees by a fixed relative amount."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():
            return x * 1000.0 * (1 + 1e-3)
        return x * 1000.0


def test_a_real_disagreement_names_the_tolerance() -> None:
    decomposition = Decomposition.custom([_Scale()], names=["scale"])
    with pytest.raises(
        ExportError,
        match=r"block 0 \(scale\): onnxruntime differs from torch "
        r"by [0-9.e+-]+ > [0-9.e+-]+ \(1e-04 relative to the largest output "
        r"magnitude [0-9.e+-]+\)",
    ):
        export_model(decomposition)


class _Argmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).argmax(1)


def test_integer_outputs_are_refused() -> None:
    decomposition = Decomposition.custom([nn.Conv2d(3, 4, 3, 8), _Argmax()], names=["c", "top"])
    with pytest.raises(ExportError, match=r"block 1 \(top\) returns int64 .*floating"):
        export_model(decomposition)


def test_any_iterable_of_blocks() -> None:
    modules = [nn.Conv2d(3, 4, 3, stride=8), nn.ReLU()]
    from_generator = Decomposition.custom(m for m in modules)
    assert from_generator.blocks == tuple(modules)
    assert Decomposition.custom(iter(modules)).names == ("0", "1")
    assert Decomposition.custom(nn.Sequential(*modules)).blocks == tuple(modules)


def test_a_bad_custom_freeze_is_not_called_the_default() -> None:
    with pytest.raises(InvalidModelSpec) as caught:
        Decomposition.custom([nn.ReLU(), nn.ReLU()], freeze=5)
    message = str(caught.value)
    assert "freeze 5 is out of range" in message and "choose 1..2" in message
    assert "default 5" not in message
