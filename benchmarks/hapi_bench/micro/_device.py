"""``make bench-device``: the storage node on an accelerator, checked and timed.

First the gateway against the bare device loop (the same decoder, DALI where it is
installed, else Pillow on the host's cores, and onnxruntime's CUDA provider, batch 64),
for ResNet18 split 5 and ResNet50 split 9 (see ``_device_pipeline``; ``--pipeline only``
stops there). Then, for each model (seeded weights, exported here) and each split, on a
batch of real photos preprocessed as the gateway does:

- fidelity: blocks ``[0, split)`` through ``hapi.models.create_session`` on the device
  against the CPU provider, as the largest absolute error over the largest CPU
  activation; with TF32 math off (hapi's default) and on (onnxruntime's, ``--tf32``);
- speed: samples/s of the composed session at each batch size, TF32 off and on (the
  median of repeats, each run ending with its output on the host, as the gateway's runs
  do), through IO binding with the output in one reused host buffer, pinned on a GPU
  (``_iobinding``; it lost to ``session.run`` on the H200), and on the CPU provider with one thread at
  batch 4, for scale;
- the per-block division: the shares onnxruntime's per-node profile gives each block
  (what the gateway divides a batch's time by on the CPU) against each block timed alone
  (what it divides by on a GPU, where the profile times kernel launches);
- the gateway's memory budget on this machine (free device memory at start).

``--device cpu`` runs the same steps with the CPU provider in both places (to try the
script anywhere); the figures that matter need ``--device cuda``. Writes
``bench-device.json`` and ``bench-device.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from hapi import models
from hapi.models import (
    Device,
    RuntimeSettings,
    block_times,
    create_session,
    cuda_usable,
    testing,
)
from hapi_bench.micro._iobinding import OutputMemory, bound_runner

BATCHES = (1, 8, 32, 128)
_CPU = RuntimeSettings(device="cpu", intra_op_threads=1, inter_op_threads=1)


def _batch(manifest_preset: models.Preset, size: int) -> np.ndarray:
    photos = models.sample_images()
    return models.preprocess_batch([photos[i % len(photos)] for i in range(size)], manifest_preset)


def _graph(exported: models.ExportedModel, start: int, stop: int) -> onnx.ModelProto:
    return testing.compose([onnx.load_from_string(b.data) for b in exported.blocks[start:stop]])


def _session(graph: onnx.ModelProto, device: Device, *, tf32: bool = False) -> ort.InferenceSession:
    return create_session(graph, RuntimeSettings(device=device, tf32=tf32))


def _timed(
    session: ort.InferenceSession,
    batch: np.ndarray,
    repeats: int,
    run: Callable[[np.ndarray], Any] | None = None,
) -> float:
    """Median seconds of one run (output on the host), after two warm-up runs: through
    ``session.run``, or through ``run`` (the gateway's run function) when given."""
    run = run or (lambda b: session.run(None, {"input": b}))
    for _ in range(2):
        run(batch)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(batch)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _fidelity(graph: onnx.ModelProto, device: Device, batch: np.ndarray) -> dict[str, float]:
    want = create_session(graph, _CPU).run(None, {"input": batch})[0]
    scale = float(np.abs(want).max()) or 1.0
    out = {}
    for tf32 in (True, False):
        try:
            got = _session(graph, device, tf32=tf32).run(None, {"input": batch})[0]
            out["tf32_on" if tf32 else "tf32_off"] = float(np.abs(got - want).max()) / scale
        except Exception as exc:  # onnxruntime's pybind errors are untyped; report them
            out["tf32_on" if tf32 else "tf32_off"] = float("nan")
            print(f"    fidelity with tf32={tf32} failed: {exc}", flush=True)
    return out


def _division(exported: models.ExportedModel, split: int, device: Device) -> dict[str, Any]:
    """Profile shares of a composed run against each block timed alone (batch 32)."""
    batch = _batch(exported.preprocess, 32)
    prefix = str(Path("/tmp") / f"hapi-device-{time.monotonic_ns()}-")
    profiled = create_session(
        _graph(exported, 0, split), RuntimeSettings(device=device), profile_prefix=prefix
    )
    for _ in range(3):
        profiled.run(None, {"input": batch})
    trace = profiled.end_profiling()
    shares = _normalized(block_times(trace, split))
    Path(trace).unlink(missing_ok=True)
    alone, activation = [], batch
    for index in range(split):
        session = create_session(_graph(exported, index, index + 1), RuntimeSettings(device=device))
        alone.append(_timed(session, activation, 5))
        activation = session.run(None, {"input": activation})[0]
    composed = _timed(
        create_session(_graph(exported, 0, split), RuntimeSettings(device=device)), batch, 5
    )
    return {
        "profile_shares": shares,
        "alone_shares": _normalized(alone),
        "alone_ms": [t * 1000 for t in alone],
        "composed_ms": composed * 1000,
    }


def _normalized(values: Any) -> list[float]:
    total = sum(values)
    return [v / total for v in values] if total > 0 else [0.0 for _ in values]


def run(out: Path, families: list[str], device: Device, repeats: int) -> dict[str, Any]:
    """Every step for every model; returns and writes the results."""
    from hapi.gateway import GatewaySettings, memory_budget
    from hapi.protocol import Credentials

    if device == "cuda" and not cuda_usable():
        raise SystemExit(
            "bench-device: onnxruntime finds no usable CUDA GPU here (try --device cpu)"
        )
    budget = memory_budget(
        GatewaySettings(
            backend_url="http://127.0.0.1:1",
            backend_credentials=Credentials("unused", "unused"),
            device=device,
        )
    )
    results: dict[str, Any] = {
        "device": device,
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        "memory_budget": {"total_bytes": budget.total, "source": budget.source},
        "models": {},
    }
    print(f"memory budget: {budget.total / 2**30:.1f} GiB ({budget.source})", flush=True)
    for family in families:
        exported = models.export_model(family, runtime=_CPU)
        freeze = len(exported.blocks)
        splits = sorted({max(1, freeze // 4), max(1, freeze // 2), freeze})
        inputs = {size: _batch(exported.preprocess, size) for size in {*BATCHES, 4, 8}}
        rows = []
        for split in splits:
            graph = _graph(exported, 0, split)
            fidelity = _fidelity(graph, device, inputs[8])
            speed: dict[bool, dict[int, float]] = {}
            for tf32 in (False, True):
                session = _session(graph, device, tf32=tf32)
                speed[tf32] = {
                    size: size / _timed(session, inputs[size], repeats) for size in BATCHES
                }
            # IO binding, the output in one reused host buffer (pinned on a GPU).
            session = _session(graph, device)
            output: OutputMemory = "cuda_pinned" if device == "cuda" else "cpu"
            bound = bound_runner(session, output=output)
            plain = session.run(None, {"input": inputs[8]})[0]
            np.testing.assert_allclose(
                bound(inputs[8]), plain, rtol=0, atol=1e-6 * np.abs(plain).max()
            )
            speed_bound = {
                size: size / _timed(session, inputs[size], repeats, bound) for size in BATCHES
            }
            cpu = 4 / _timed(create_session(graph, _CPU), inputs[4], 3)
            rows.append(
                {
                    "split": split,
                    "fidelity": fidelity,
                    "samples_per_s": speed[False],
                    "samples_per_s_tf32": speed[True],
                    "samples_per_s_bound": speed_bound,
                    "cpu_samples_per_s": cpu,
                }
            )
            print(
                f"{family} split {split}: error {fidelity} | samples/s "
                + ", ".join(f"b{b} {r:.0f}" for b, r in speed[False].items())
                + " (TF32: "
                + ", ".join(f"b{b} {r:.0f}" for b, r in speed[True].items())
                + ") | IO binding: "
                + ", ".join(f"b{b} {r:.0f}" for b, r in speed_bound.items())
                + f" | CPU 1 thread {cpu:.1f}",
                flush=True,
            )
        division = _division(exported, freeze, device)
        worst = max(
            abs(p - a)
            for p, a in zip(division["profile_shares"], division["alone_shares"], strict=True)
        )
        division["worst_share_gap"] = worst
        print(
            f"{family} blocks [0, {freeze}): profile shares vs alone, worst gap {worst:.3f}",
            flush=True,
        )
        results["models"][family] = {"freeze": freeze, "splits": rows, "division": division}
    _write(out, results)
    return results


def _write(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-device.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"device {results['device']}, onnxruntime {results['onnxruntime']}; memory budget "
        f"{results['memory_budget']['total_bytes'] / 2**30:.1f} GiB ({results['memory_budget']['source']})",
        "",
        "| model | split | error TF32 off | error TF32 on | "
        + " | ".join(f"samples/s b{b} (TF32; IO binding)" for b in BATCHES)
        + " | CPU 1 thread samples/s |",
        "|---" * (5 + len(BATCHES)) + "|",
    ]
    for family, model in results["models"].items():
        for row in model["splits"]:
            fid = row["fidelity"]
            lines.append(
                f"| {family} | {row['split']} | {fid['tf32_off']:.1e} | {fid['tf32_on']:.1e} | "
                + " | ".join(
                    f"{row['samples_per_s'][b]:.0f} ({row['samples_per_s_tf32'][b]:.0f}; "
                    f"{row['samples_per_s_bound'][b]:.0f})"
                    for b in BATCHES
                )
                + f" | {row['cpu_samples_per_s']:.1f} |"
            )
    lines += [
        "",
        "| model | block shares: onnxruntime's profile | each block alone (the gateway's "
        "division on a GPU) | worst gap |",
        "|---|---|---|---|",
    ]
    for family, model in results["models"].items():
        div = model["division"]
        lines.append(
            f"| {family} | {' '.join(f'{s:.2f}' for s in div['profile_shares'])} | "
            f"{' '.join(f'{s:.2f}' for s in div['alone_shares'])} | {div['worst_share_gap']:.3f} |"
        )
    (out / "bench-device.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--models", default="resnet18,resnet50,vgg11")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per batch size")
    parser.add_argument(
        "--pipeline",
        choices=("first", "only", "skip"),
        default="first",
        help="the gateway against the bare device loop: before the blocks' figures, alone, "
        "or not at all",
    )
    parser.add_argument(
        "--decoder",
        choices=("auto", "dali", "pil"),
        default="auto",
        help="the pipeline's decoder, the same for both: DALI, or Pillow on the host's "
        "cores; auto: DALI where it is installed",
    )
    parser.add_argument(
        "--conv-search",
        choices=("exhaustive", "heuristic", "default"),
        default="heuristic",
        help="how cuDNN picks convolution algorithms in the pipeline, for both (the "
        "gateway's default: heuristic)",
    )
    args = parser.parse_args(argv)
    if args.pipeline != "skip":
        from hapi_bench.micro._device_pipeline import run_pipeline

        run_pipeline(args.out, args.device, decoder=args.decoder, conv_search=args.conv_search)
    if args.pipeline != "only":
        run(args.out, args.models.split(","), args.device, args.repeats)


if __name__ == "__main__":
    main()
