"""ONNX export: verified blocks, canonical bytes, profiles, composition, failures."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from hapi.models import ExportedModel, ExportError, create_session, export_model
from hapi.models.testing import Decomposition, compose


def _run(graph: onnx.ModelProto | bytes, batch: np.ndarray) -> np.ndarray:
    return create_session(graph).run(None, {"input": batch})[0]


def test_every_block_matches_torch_on_real_photos(
    effnet: Decomposition, effnet_export: ExportedModel, photo_batch, torch_upto
) -> None:
    batch = photo_batch(effnet)
    for index, block in enumerate(effnet_export.blocks):
        x = torch_upto(effnet, batch, index)
        want = torch_upto(effnet, batch, index + 1)
        got = _run(block.data, x)
        assert got.shape == want.shape
        assert np.max(np.abs(got - want)) <= 1e-4, block.info.name


def test_profiles_describe_the_blocks(effnet_export: ExportedModel, effnet: Decomposition) -> None:
    infos = [block.info for block in effnet_export.blocks]
    assert [i.name for i in infos] == list(effnet.names)
    assert infos[0].input_shape == (3, 224, 224) == effnet_export.input.shape
    assert infos[0].output_shape == (32, 112, 112)
    assert infos[-1].output_shape == (1000,)
    for before, after in itertools.pairwise(infos):
        assert before.output_shape == after.input_shape
    for info, block in zip(infos, effnet.blocks, strict=True):
        assert info.output_bytes == 4 * int(np.prod(info.output_shape))
        assert info.params == sum(p.numel() for p in block.parameters())
        # Input and output are alive together at least at the last node.
        assert info.peak_activation_bytes >= info.output_bytes
        assert info.cpu_ms > 0 and info.dtype == "float32"
    assert sum(i.params for i in infos) == 4_652_008
    assert effnet_export.freeze == 19 and effnet_export.preprocess.name == "efficientnet-lite"


def test_exporting_again_gives_identical_bytes(resnet18, resnet18_export: ExportedModel) -> None:
    again = export_model(Decomposition.custom(resnet18.blocks[:3], preset="imagenet"))
    for first, second in zip(resnet18_export.blocks, again.blocks, strict=False):
        assert first.data == second.data
        assert first.info.hash == second.info.hash


def test_canonical_graphs_carry_no_exporter_fingerprints(resnet18_export: ExportedModel) -> None:
    graph = onnx.load_from_string(resnet18_export.blocks[1].data)
    assert graph.producer_name == "hapi" and graph.producer_version == ""
    assert [v.name for v in graph.graph.input] == ["input"]
    assert [v.name for v in graph.graph.output] == ["output"]
    assert graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    names = {t.name for t in graph.graph.initializer}
    assert names and all(n[0] == "w" and n[1:].isdigit() for n in names)


def test_changed_weights_change_only_that_hash() -> None:
    blocks = [nn.Conv2d(3, 4, 3, stride=8), nn.ReLU()]
    first = export_model(Decomposition.custom(blocks))
    with torch.no_grad():
        blocks[0].weight[0, 0] += 1.0
    second = export_model(Decomposition.custom(blocks))
    assert first.blocks[0].info.hash != second.blocks[0].info.hash
    assert first.blocks[1].info.hash == second.blocks[1].info.hash


def test_composed_blocks_equal_chained_blocks(
    resnet18_export: ExportedModel, resnet18, photo_batch, torch_upto
) -> None:
    batch = photo_batch(resnet18)
    graphs = [onnx.load_from_string(b.data) for b in resnet18_export.blocks]
    x = torch_upto(resnet18, batch, 2)
    chained = x
    for graph in graphs[2:6]:
        chained = _run(graph, chained)
    composed = compose(graphs[2:6])
    assert [v.name for v in composed.graph.input] == ["input"]
    assert [v.name for v in composed.graph.output] == ["output"]
    np.testing.assert_allclose(_run(composed, x), chained, rtol=0, atol=1e-5)
    # The same block twice in one graph needs distinct names: compose prefixes them.
    twice = compose([graphs[1], graphs[1]])
    np.testing.assert_allclose(_run(twice, x), _run(graphs[1], _run(graphs[1], x)), atol=1e-5)


def test_fp16_export() -> None:
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
    )
    exported = export_model(Decomposition.custom(net), fp16=True)
    assert {b.info.dtype for b in exported.blocks} == {"float16"}
    assert exported.input.dtype == "float16"
    assert exported.blocks[0].info.output_bytes == 2 * 8 * 56 * 56
    graph = onnx.load_from_string(exported.blocks[0].data)
    assert graph.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


class _Svd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.svdvals(x[:, 0, :8, :8])


class _FixedBatch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(int(x.shape[0]), -1)  # traced as a constant batch size


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (_Svd(), r"block 1 \(bad\) does not export to ONNX: .*svdvals"),
        (_FixedBatch(), r"block 1 \(bad\): onnxruntime gives shape \(2, .*torch \(4, "),
        (_Pair(), r"block 1 \(bad\) must return one tensor, not tuple"),
        (nn.Linear(4, 4), r"block 1 \(bad\) fails in torch: .*shapes cannot be multiplied"),
    ],
)
def test_modules_that_do_not_export(module: nn.Module, message: str) -> None:
    decomposition = Decomposition.custom([nn.Identity(), module], names=["id", "bad"])
    with pytest.raises(ExportError, match=message):
        export_model(decomposition)


def test_hashes_repeat_in_a_fresh_process(resnet18_export: ExportedModel) -> None:
    """Seeded weights plus canonical bytes: another process exports the same blocks."""
    code = (
        "from hapi.models import export_model\n"
        "from hapi.models.testing import Decomposition, build\n"
        "d = build('resnet18')\n"
        "print(export_model(Decomposition.custom(d.blocks[:2])).blocks[1].info.hash)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == resnet18_export.blocks[1].info.hash


def test_the_manifest_counts_each_blocks_zeros_as_the_planner_counts_them(
    registry, resnet18_export: ExportedModel, photos
) -> None:
    # The export's photos, run block by block through the registered ONNX blocks, as the
    # SDK's planner counts the zero values an answer in the zeros encoding leaves out.
    from hapi.sdk.planning._measure import run_client_blocks

    registry.register("r18", resnet18_export)
    manifest = registry.get_manifest("r18")  # through the stored JSON
    shares = manifest.zeros
    assert shares is not None and len(shares) == manifest.freeze
    _, counted = run_client_blocks(
        registry, manifest, batch_size=len(photos), runs=1, images=photos
    )
    assert shares == pytest.approx(counted, abs=0.005)
    assert max(shares) > 0.3  # a ReLU's features: about half zeros
    assert all(block.info.zeros is not None for block in resnet18_export.blocks)
