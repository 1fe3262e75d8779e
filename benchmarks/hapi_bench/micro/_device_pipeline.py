"""The first part of ``make bench-device``: the gateway against the bare device loop.

The bare device loop is the ceiling on an accelerator: the same JPEGs decoded by the same
decoder the gateway uses there (DALI, ``dali-gpu``: nvJPEG, resize and normalization on the
GPU; or, where DALI is not installed or ``--decoder pil`` says so, Pillow in a thread per
host core), batches of 64, run through blocks ``[0, split)`` with onnxruntime's CUDA
provider while the next batch decodes. The gateway (one worker, feature cache off, the same
decoder and device) is driven from wrk by batch POSTs of 64 keys on 2 connections. For
ResNet18 split 5 and ResNet50 split 9, the two are measured in interleaved rounds; the
figure is the median ratio of samples/s, against the goal of 0.8x.

``--device cpu`` runs the same steps with DALI's CPU mode (``dali-cpu``) or Pillow and the
CPU provider, to try the script anywhere; the figures that matter need a GPU.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from hapi import models
from hapi_bench.micro._ceiling import _BUCKET, BareLoop, GatewayDriver, Run
from hapi_bench.micro._gateway import bench_store
from hapi_bench.micro._pushdown import make_images
from hapi_bench.micro._wrk import wrk_binary

CELLS = (("resnet18", 5), ("resnet50", 9))
BATCH = 64
GOAL = 0.8


def run_pipeline(
    out: Path,
    device: str,
    *,
    decoder: str = "auto",
    conv_search: str = "heuristic",
    images: int = 256,
    seconds: float = 6.0,
    rounds: int = 3,
) -> dict[str, Any]:
    """Measure every cell with ``decoder`` (``dali``, ``pil``, or ``auto``: DALI where it
    is installed) and cuDNN's ``conv_search`` for both; returns and writes
    ``bench-device-pipeline.{json,md}``."""
    wrk_binary()
    use_dali = decoder == "dali" or (decoder == "auto" and models.dali_available())
    if use_dali and not models.dali_available():
        raise SystemExit(
            "bench-device: --decoder dali needs NVIDIA DALI: pip install 'hapi[gpu-decode]'"
        )
    dali_mode: Literal["gpu", "cpu"] = "gpu" if device == "cuda" else "cpu"
    decoder_name = f"dali-{dali_mode}" if use_dali else "pil"
    print(f"pipeline: decoder {decoder_name}, device {device}, cuDNN {conv_search}", flush=True)
    runtime = models.RuntimeSettings(device=device, conv_search=conv_search)  # type: ignore[arg-type]  # checked there
    cells = []
    with bench_store() as bench:
        registry = models.Registry(bench.s3)
        blobs = make_images(images)
        keys = [f"img-{i:03d}.jpg" for i in range(images)]
        bench.s3.create_bucket(Bucket=_BUCKET)
        for name, blob in zip(keys, blobs, strict=True):
            bench.s3.put_object(Bucket=_BUCKET, Key=name, Body=blob)
        env = {"HAPI_CACHE_ENABLED": "false", "HAPI_DECODER": decoder_name}
        env["HAPI_DEVICE"] = device
        env["HAPI_CONV_SEARCH"] = conv_search
        with bench.gateway("gw-device.log", env) as gw:
            driver = GatewayDriver(gw, seconds, batch=BATCH)
            try:
                for family, split in CELLS:
                    manifest = registry.register(family, models.export_model(family))
                    split = min(split, manifest.freeze)
                    batch_decoder = (
                        models.DaliDecoder(manifest.preprocess, device=dali_mode, batch_size=BATCH)
                        if use_dali
                        else None
                    )
                    graph = registry.load_blocks(manifest, 0, split)
                    bare = BareLoop(
                        manifest, graph, batch=BATCH, decoder=batch_decoder, runtime=runtime
                    )
                    runs: dict[str, list[Run]] = {"bare": [], "gateway": []}
                    try:
                        driver.warm(keys, family, split)
                        bare.epoch(blobs, 0)
                        for _ in range(rounds):
                            runs["bare"].append(bare.epoch(blobs, seconds - 2))
                            runs["gateway"].append(driver.epoch(keys, family, split, "batch"))
                    finally:
                        bare.close()
                    cells.append(_cell(family, split, runs))
                    print(_line(cells[-1]), flush=True)
            finally:
                driver.close()
    results = {
        "device": device,
        "decoder": decoder_name,
        "conv_search": conv_search,
        "gateway_env": {**{k: v for k, v in os.environ.items() if k.startswith("HAPI_")}, **env},
        "batch": BATCH,
        "images": images,
        "rounds": rounds,
        "goal": GOAL,
        "cells": cells,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-device-pipeline.json").write_text(json.dumps(results, indent=2))
    (out / "bench-device-pipeline.md").write_text("\n".join(_line(c) for c in cells) + "\n")
    return results


def _cell(family: str, split: int, runs: dict[str, list[Run]]) -> dict[str, Any]:
    bare = statistics.median(r.samples_per_s for r in runs["bare"])
    gateway = statistics.median(r.samples_per_s for r in runs["gateway"])
    ratios = [
        g.samples_per_s / b.samples_per_s
        for g, b in zip(runs["gateway"], runs["bare"], strict=True)
    ]
    return {
        "model": family,
        "split": split,
        "bare_samples_per_s": bare,
        "gateway_samples_per_s": gateway,
        "ratio": gateway / bare,
        "ratio_range": [min(ratios), max(ratios)],
        "gateway_cpu_ms_per_sample": statistics.median(
            r.cpu_ms_per_sample for r in runs["gateway"]
        ),
        "meets_goal": gateway / bare >= GOAL,
        "runs": {mode: [asdict(r) for r in found] for mode, found in runs.items()},
    }


def _line(cell: dict[str, Any]) -> str:
    low, high = cell["ratio_range"]
    mark = "meets" if cell["meets_goal"] else "misses"
    return (
        f"{cell['model']} split {cell['split']}: bare device loop "
        f"{cell['bare_samples_per_s']:.0f}/s, gateway {cell['gateway_samples_per_s']:.0f}/s "
        f"= {cell['ratio']:.2f}x ({low:.2f}-{high:.2f}; goal {GOAL}x: {mark}), gateway CPU "
        f"{cell['gateway_cpu_ms_per_sample']:.2f} ms/sample"
    )
