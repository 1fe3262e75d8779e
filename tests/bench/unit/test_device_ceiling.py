"""``hapi-bench device-ceiling``'s pure parts: its options, its report, hapi's block cuts.

The measurements themselves need a CUDA device (``--device cpu`` runs them anywhere, too
slowly for the suite); their figures are in docs/results.md.
"""

from __future__ import annotations

import pytest

from hapi_bench.micro import device_ceiling as ceiling


def _row(split: int) -> dict[str, object]:
    rates = {str(b): 100.0 * b for b in ceiling.BATCHES}
    return {
        "split": split,
        "fidelity": {"fp32": 1e-6, "tf32": 5e-4},
        "samples_per_s": rates,
        "samples_per_s_pinned": {k: 2 * v for k, v in rates.items()},
        "samples_per_s_tf32": rates,
        "samples_per_s_fp16": rates,
    }


def test_the_report_names_every_split_and_the_pinned_rate() -> None:
    results = {
        "device": "GPU",
        "runtime": "torch x",
        "host_cores": 16,
        "images": 512,
        "mean_jpeg_bytes": 29_000,
        "onnxruntime_providers": ["CPUExecutionProvider"],
        "decode": {"host_one_thread": 437.0, "device": {"64": 7151.0}},
        "models": {
            "resnet18": {
                "freeze": 10,
                "splits": [_row(2), _row(10)],
                "pipeline": {"64": 4124.0, "256": 4834.0},
            }
        },
    }
    text = ceiling.markdown(results)
    assert "| resnet18 | 2 |" in text and "| resnet18 | 10 |" in text
    # b256: 25,600/s pageable, 51,200/s into pinned memory.
    assert "25,600 (51,200, 25,600, 25,600)" in text
    assert "b64 7,151/s" in text and "| resnet18 | 4,124/s | 4,834/s |" in text


@pytest.mark.parametrize("family", ["resnet18", "efficientnet_lite0"])
def test_the_blocks_are_hapis_cut_up_to_the_freeze_point(family: str) -> None:
    import torch

    from hapi.models import testing

    hapi = testing.FAMILIES[family](None)
    parts = ceiling.blocks(family)
    assert len(parts) == hapi.freeze
    # Block by block, the same shapes out (the weights differ: both are seeded, apart).
    x = y = torch.zeros(1, 3, 64, 64)
    with torch.inference_mode():
        for ours, theirs in zip(parts, hapi.blocks[: hapi.freeze], strict=True):
            x, y = ours.eval()(x), theirs(y)
            assert x.shape == y.shape


@pytest.mark.parametrize(
    "argv",
    [
        ["--device", "cpu", "--images", "8"],
        ["--device", "cpu", "--repeats", "0"],
        ["--device", "tpu"],
    ],
)
def test_bad_options_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ceiling.main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip()
