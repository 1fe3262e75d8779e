"""Importing ONNX graphs: cut points, block extraction, verification, registration."""

from __future__ import annotations

import hashlib
import itertools
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from hapi.models import (
    ExportError,
    InvalidModelSpec,
    Preset,
    Registry,
    create_session,
    import_onnx,
    preprocess_batch,
)
from hapi.models._cli import models
from hapi.models.testing import compose, cut_points

# A small input keeps these tests quick; the graphs take any spatial size.
SMALL = Preset(
    name="small", resize=73, crop=64, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)
)


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(x + y)


class Attention(nn.Module):
    """A transformer layer over the pixels of a feature map (pre-norm, two residuals)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(channels)
        self.attn = nn.MultiheadAttention(channels, 4, batch_first=True)
        self.norm2 = nn.LayerNorm(channels)
        self.mlp = nn.Sequential(
            nn.Linear(channels, 2 * channels), nn.GELU(), nn.Linear(2 * channels, channels)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        normed = self.norm1(tokens)
        tokens = tokens + self.attn(normed, normed, normed, need_weights=False)[0]
        tokens = tokens + self.mlp(self.norm2(tokens))
        return tokens.transpose(1, 2).reshape(n, c, h, w)


def multi_branch() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 16, 3, stride=4, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
        Residual(16),
        nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU()),
        Residual(32),
        Attention(32),
        Attention(32),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
        nn.Linear(32, 10),
    ).eval()


def save_onnx(net: nn.Module, path: Path, size: int = 64, dynamic: bool = True) -> Path:
    """Export as a user would: their own tensor names, a dynamic batch axis."""
    axes = {"pixels": {0: "n"}, "logits": {0: "n"}} if dynamic else None
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # its fused operator has no ONNX form
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer and deprecation warnings
            torch.onnx.export(
                net,
                (torch.zeros(2, 3, size, size),),
                str(path),
                dynamo=False,
                opset_version=18,
                input_names=["pixels"],
                output_names=["logits"],
                dynamic_axes=axes,
            )
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return path


@pytest.fixture(scope="module")
def branchy(tmp_path_factory) -> Path:
    return save_onnx(multi_branch(), tmp_path_factory.mktemp("onnx") / "branchy.onnx")


def _intermediates(path: Path, names: list[str], batch: np.ndarray) -> dict[str, np.ndarray]:
    """onnxruntime's own values of ``names`` in the original graph (exposed as outputs)."""
    model = onnx.load(str(path))
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    values = create_session(model).run(names, {"pixels": batch})
    return dict(zip(names, values, strict=True))


def _run(graph: onnx.ModelProto | bytes, batch: np.ndarray) -> np.ndarray:
    return create_session(graph).run(None, {"input": batch})[0]


def test_cut_points_never_fall_inside_a_skip_connection(branchy: Path) -> None:
    model = onnx.load(str(branchy))
    names = cut_points(model)
    nodes = list(model.graph.node)
    made_by = {out: i for i, node in enumerate(nodes) for out in node.output}
    cuts = sorted(made_by[name] for name in names)
    assert len(cuts) >= 6
    for module in ("1", "3", "4", "5"):  # the residual and attention layers
        inside = [i for i, node in enumerate(nodes) if node.name.startswith(f"/{module}/")]
        # The skip connections close at the module's own Add nodes (not attn's bias Adds).
        skips = [i for i in inside if re.fullmatch(rf"/{module}/Add(_\d+)?", nodes[i].name)]
        assert skips, module
        assert not [c for c in cuts if inside[0] <= c < skips[-1]], module
        assert inside[-1] in cuts, module  # its output is a cut point
    assert "logits" not in names and "pixels" not in names


def test_cut_points_of_a_hand_built_graph() -> None:
    make = onnx.helper.make_node
    nodes = [
        make("Shape", ["x"], ["s"]),  # a side branch on the input that dies unused
        make("Cast", ["s"], ["sf"], to=onnx.TensorProto.FLOAT),
        make("ReduceSum", ["sf"], ["unused"], keepdims=0),
        make("Relu", ["x"], ["a"]),
        make("Neg", ["a"], ["dead"]),  # a dead end: "a" is alone again after it
        make("Exp", ["a"], ["b"]),
        make("Add", ["a", "b"], ["c"]),  # a skip connection: nothing between a and c
        make("Constant", [], ["k"], value_float=2.0),  # constants are not state
        make("Mul", ["c", "k"], ["d"]),
        make("Sigmoid", ["d"], ["y"]),
    ]
    io = [
        onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["n", 3, 4, 4]) for n in "xy"
    ]
    graph = onnx.helper.make_graph(nodes, "g", [io[0]], [io[1]])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    assert cut_points(model) == ["a", "c", "d"]


def test_features_at_every_cut_point_equal_the_original_graph(branchy: Path, photos) -> None:
    names = cut_points(onnx.load(str(branchy)))
    exported = import_onnx(branchy, preset=SMALL, cut_at=names)
    assert len(exported.blocks) == len(names) + 1
    batch = preprocess_batch(photos, SMALL)
    want = _intermediates(branchy, [*names, "logits"], batch)
    graphs = [onnx.load_from_string(block.data) for block in exported.blocks]
    for k, name in enumerate([*names, "logits"], start=1):
        got = _run(compose(graphs[:k]), batch)
        peak = max(1.0, float(np.abs(want[name]).max()))
        assert got.shape == want[name].shape, name
        assert np.abs(got - want[name]).max() <= 1e-5 * peak, name
        assert exported.blocks[k - 1].info.output_shape == want[name].shape[1:]
    assert exported.family == "onnx" and exported.freeze == len(exported.blocks)
    digest = hashlib.sha256(branchy.read_bytes()).hexdigest()
    assert exported.source == f"onnx:{digest}"


def test_tiny_blocks_merge_and_the_head_stays_apart(branchy: Path, photos) -> None:
    names = cut_points(onnx.load(str(branchy)))
    exported = import_onnx(branchy, preset=SMALL)
    infos = [block.info for block in exported.blocks]
    assert 3 <= len(infos) < len(names) + 1
    assert infos[-1].input_shape == (32,) and infos[-1].output_shape == (10,)  # the head
    assert infos[0].input_shape == (3, 64, 64)
    for before, after in itertools.pairwise(infos):
        assert before.output_shape == after.input_shape
    assert sum(info.params for info in infos) > 0 and all(i.cpu_ms > 0 for i in infos)
    batch = preprocess_batch(photos, SMALL)
    graphs = [onnx.load_from_string(block.data) for block in exported.blocks]
    np.testing.assert_allclose(_run(compose(graphs), batch), want_logits(branchy, batch), atol=1e-5)


def want_logits(path: Path, batch: np.ndarray) -> np.ndarray:
    return create_session(onnx.load(str(path))).run(None, {"pixels": batch})[0]


def test_calibrated_activations_import_and_verify(tmp_path: Path, photos) -> None:
    from tests.models.support import calibrated_net

    path = save_onnx(nn.Sequential(*calibrated_net()).eval(), tmp_path / "calibrated.onnx")
    exported = import_onnx(path, preset=SMALL)
    batch = preprocess_batch(photos, SMALL)
    graphs = [onnx.load_from_string(block.data) for block in exported.blocks]
    want = want_logits(path, batch)
    assert float(np.abs(want).max()) > 100
    got = _run(compose(graphs), batch)
    assert np.abs(got - want).max() <= 1e-4 * float(np.abs(want).max())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dynamic": False}, r"fixed batch size 2; export the graph with a dynamic batch"),
        ({"size": 48}, r"is 3x48x48 per sample, but preset small gives 3x64x64"),
    ],
)
def test_graphs_that_do_not_fit(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.Flatten(1), nn.Linear(4 * 16 * 16, 3))
    if "size" in change:
        net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.Flatten(1), nn.Linear(4 * 144, 3))
    path = save_onnx(net.eval(), tmp_path / "net.onnx", **change)
    with pytest.raises(InvalidModelSpec, match=message):
        import_onnx(path, preset=SMALL)


class _Top(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).argmax(1)


def test_integer_outputs_are_refused(tmp_path: Path) -> None:
    path = save_onnx(nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), _Top()), tmp_path / "top.onnx")
    with pytest.raises(InvalidModelSpec, match=r"output 'logits' is int64, not float32"):
        import_onnx(path, preset=SMALL)


def test_unknown_cut_tensor_lists_the_cut_points(branchy: Path) -> None:
    with pytest.raises(InvalidModelSpec, match=r"'nowhere' is not a cut point .* there are \d+: "):
        import_onnx(branchy, preset=SMALL, cut_at=["nowhere"])
    with pytest.raises(InvalidModelSpec, match=r"freeze 99 is out of range: choose 1\.\.\d+"):
        import_onnx(branchy, preset=SMALL, freeze=99)


def test_a_file_that_is_not_onnx(tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("not a model")
    with pytest.raises(InvalidModelSpec, match=r"is not a valid ONNX model"):
        import_onnx(path)
    with pytest.raises(InvalidModelSpec, match=r"ONNX file not found"):
        import_onnx(tmp_path / "missing.onnx")


def test_weights_in_external_files_are_refused(branchy: Path, tmp_path: Path) -> None:
    split = tmp_path / "split.onnx"
    onnx.save_model(
        onnx.load(str(branchy)), str(split), save_as_external_data=True, size_threshold=0
    )
    with pytest.raises(InvalidModelSpec, match=r"keeps its weights in external data files"):
        import_onnx(split, preset=SMALL)


def test_a_wrong_graph_fails_verification(branchy: Path, photos) -> None:
    from hapi.models._import import blocks_from_onnx

    def wrong(batch: np.ndarray) -> np.ndarray:
        return want_logits(branchy, batch) + 1.0

    with pytest.raises(ExportError, match=r"the whole graph: onnxruntime differs from torch"):
        blocks_from_onnx(
            onnx.load(str(branchy)), family="onnx", source="x", preset=SMALL, reference=wrong
        )


@pytest.mark.slow
def test_cli_import_registers_the_blocks(
    invoke, backend_s3, unique_bucket, tmp_path: Path, photos
) -> None:
    path = save_onnx(multi_branch(), tmp_path / "branchy224.onnx", size=224)
    done = invoke("import", str(path), "--name", "branchy", "--freeze", "2")
    assert done.exit_code == 0, done.output
    assert "registered branchy@1:" in done.stdout
    manifest = Registry(backend_s3, unique_bucket).get_manifest("branchy")
    assert manifest.source == f"onnx:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    assert manifest.family == "onnx" and manifest.freeze == 2
    assert manifest.blocks[-1].output_shape == (10,)
    graph = Registry(backend_s3, unique_bucket).load_blocks(manifest)
    batch = preprocess_batch(photos, manifest.preprocess)
    np.testing.assert_allclose(_run(graph, batch), want_logits(path, batch), atol=1e-5)

    whole = invoke("import", str(path), "--name", "whole")
    assert whole.exit_code == 0, whole.output
    assert "uploaded 0 new blocks" in whole.stdout  # the same blocks, already stored
    manifest = Registry(backend_s3, unique_bucket).get_manifest("whole")
    assert manifest.freeze == len(manifest.blocks)


def test_cli_import_refuses_bad_input_in_one_line(invoke, tmp_path: Path, stored) -> None:
    path = save_onnx(multi_branch(), tmp_path / "branchy224.onnx", size=224)
    done = invoke("import", str(path), "--name", "x", "--cut-at", "nowhere")
    assert done.exit_code == 2
    assert "'nowhere' is not a cut point" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    wrong = invoke("import", str(path), "--name", "x", "--preset", "nope")
    assert wrong.exit_code == 2 and "unknown preprocessing preset 'nope'" in wrong.stderr
    assert stored() == {}


def test_the_source_is_recorded_and_old_manifests_read_as_unknown(resnet18_export) -> None:
    import json
    from dataclasses import replace

    from hapi.models import Manifest

    assert resnet18_export.source == "resnet18"
    manifest = Manifest(
        name="m",
        version=1,
        family="onnx",
        freeze=1,
        preprocess=SMALL,
        input=resnet18_export.input,
        blocks=(resnet18_export.blocks[0].info,),
        source="onnx:" + "0" * 64,
    )
    assert Manifest.from_json(manifest.to_json()) == manifest
    old = json.loads(manifest.to_json())
    del old["source"]  # written before hapi recorded sources
    assert Manifest.from_json(json.dumps(old)) == replace(manifest, source=None)


@pytest.mark.slow
def test_cli_cuts_lists_every_cut_point_and_marks_the_chosen(tmp_path: Path) -> None:
    path = save_onnx(multi_branch(), tmp_path / "branchy224.onnx", size=224)
    done = CliRunner().invoke(models, ["cuts", str(path)])
    assert done.exit_code == 0, done.output
    rows = [line.split() for line in done.stdout.splitlines()[1:] if line.strip()]
    assert [row[1] for row in rows] == cut_points(onnx.load(str(path)))
    chosen = [row[1] for row in rows if row[-1] == "yes"]
    exported = import_onnx(path)
    assert len(chosen) == len(exported.blocks) - 1
    assert rows[-1][1:3] == ["/7/Flatten_output_0", "32"]
