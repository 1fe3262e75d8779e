"""``hapi-bench device-ceiling``: what one accelerator can do for the storage side, with PyTorch alone.

``make bench-device`` times hapi's own path on a GPU (onnxruntime's CUDA provider, DALI);
it needs ``onnxruntime-gpu`` and ``nvidia-dali`` on the machine. This script needs only
what a stock PyTorch image has (torch, torchvision, Pillow, numpy, scikit-image for its
sample photos), so it runs by path on any CUDA machine, hapi not installed::

    python3 benchmarks/hapi_bench/micro/device_ceiling.py --out DIR [--device cuda]

It measures the ceiling a GPU storage node could reach for the work hapi's gateway does
per sample, on JPEGs made from real photos (300-500 px, quality 90, as the testbed's):

- decoding: Pillow on one host thread (decode, resize 256, crop 224, normalize) against
  nvJPEG through ``torchvision.io.decode_jpeg(device="cuda")`` with the same resize, crop
  and normalization on the device, samples/s per batch size;
- the frozen blocks: hapi's decomposition of ResNet18, ResNet50 and (when
  ``efficientnet_lite_pytorch`` imports) EfficientNet-Lite0, at a quarter, half and all of
  the freeze point, samples/s per batch size with the output back on the host (as the
  gateway's runs end), TF32 off (hapi's default) and on; the largest difference from the
  CPU's output over the largest CPU activation (seeded weights, real photos);
- the pipeline: decode on the device and run the blocks to the freeze point, batch by
  batch, output on the host: the bare device loop in PyTorch.

Writes ``bench-device-ceiling.json`` (its ``models`` in ``bench-device.json``'s shape,
so ``hapi-bench headtohead --device-json`` takes it) and ``bench-device-ceiling.md``.
Exit codes: 0 done, 2 no CUDA device (and ``--device cuda``) or bad options.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

BATCHES = (1, 8, 32, 128, 256)
DECODE_BATCHES = (8, 64, 256)
RESIZE, CROP = 256, 224
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)
_PHOTOS = ("chelsea.png", "astronaut.png", "coffee.png", "rocket.jpg")


def photos(count: int, seed: int = 0) -> list[bytes]:
    """``count`` JPEGs cut from scikit-image's sample photos: random crops scaled so the
    longer side is 300-500 px, quality 90 (the testbed's images, made the same way)."""
    import importlib.util

    spec = importlib.util.find_spec("skimage")
    if spec is None or spec.origin is None:
        raise SystemExit("device-ceiling: needs scikit-image for its sample photos")
    folder = Path(spec.origin).parent / "data"
    sources = [Image.open(folder / name).convert("RGB") for name in _PHOTOS]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        image = sources[i % len(sources)]
        w, h = image.size
        cw, ch = int(w * rng.uniform(0.6, 1.0)), int(h * rng.uniform(0.6, 1.0))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        crop = image.crop((x, y, x + cw, y + ch))
        side = int(rng.integers(300, 501))
        scale = side / max(crop.size)
        crop = crop.resize((max(1, round(cw * scale)), max(1, round(ch * scale))))
        buffer = io.BytesIO()
        crop.save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def blocks(family: str) -> list[nn.Module]:
    """hapi's decomposition of ``family`` up to its freeze point (models/_families.py),
    seeded weights."""
    torch.manual_seed(0)
    pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))
    if family in ("resnet18", "resnet50"):
        import torchvision

        m = getattr(torchvision.models, family)(weights=None)
        named = [nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool)]
        for layer in ("layer1", "layer2", "layer3", "layer4"):
            named += list(getattr(m, layer))
        return [*named, pool]
    if family == "efficientnet_lite0":
        from efficientnet_lite_pytorch import EfficientNet

        e = EfficientNet.from_name("efficientnet-lite0")
        named = [nn.Sequential(e._conv_stem, e._bn0, e._swish), *e._blocks]
        return [*named, nn.Sequential(e._conv_head, e._bn1, e._swish), pool]
    raise SystemExit(f"device-ceiling: unknown model {family}")


def families() -> list[str]:
    """The models this machine can build (EfficientNet-Lite0 needs its package)."""
    try:
        import efficientnet_lite_pytorch  # noqa: F401
    except ImportError:
        return ["resnet18", "resnet50"]
    return ["resnet18", "resnet50", "efficientnet_lite0"]


def _normalize(batch: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(_MEAN, device=batch.device).view(1, 3, 1, 1)
    std = torch.tensor(_STD, device=batch.device).view(1, 3, 1, 1)
    return (batch.float() / 255.0 - mean) / std


def preprocess_cpu(blob: bytes) -> torch.Tensor:
    """Pillow: decode, resize the shorter side to 256 (bilinear), centre-crop 224."""
    with Image.open(io.BytesIO(blob)) as opened:
        rgb = opened.convert("RGB")
    w, h = rgb.size
    scale = RESIZE / min(w, h)
    resized = rgb.resize((round(w * scale), round(h * scale)), Image.Resampling.BILINEAR)
    w, h = resized.size
    left, top = (w - CROP) // 2, (h - CROP) // 2
    cropped = resized.crop((left, top, left + CROP, top + CROP))
    return torch.from_numpy(np.asarray(cropped).copy()).permute(2, 0, 1)


def preprocess_device(blobs: Sequence[bytes], device: str) -> torch.Tensor:
    """nvJPEG (batched) on ``device``, resize and crop there; a normalized NCHW batch."""
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import functional as tf

    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    images = decode_jpeg(data, device=device)
    cropped = [tf.center_crop(tf.resize(i, [RESIZE], antialias=True), [CROP, CROP]) for i in images]
    return _normalize(torch.stack(cropped))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _rate(step: Callable[[], Any], size: int, device: str, repeats: int) -> float:
    """Samples/s: ``size`` over the median of ``repeats`` timed calls, after two warm-ups."""
    for _ in range(2):
        step()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return size / statistics.median(times)


def _tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def decode_rates(blobs: list[bytes], device: str, repeats: int) -> dict[str, Any]:
    """Host decoding on one thread against decoding on ``device``, samples/s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    host = _rate(lambda: [preprocess_cpu(b) for b in blobs[:32]], 32, "cpu", max(2, repeats // 3))
    torch.set_num_threads(threads)
    on_device = {
        str(size): _rate(partial(preprocess_device, blobs[:size], device), size, device, repeats)
        for size in DECODE_BATCHES
        if size <= len(blobs)
    }
    return {"host_one_thread": host, "device": on_device}


def fidelity(model: nn.Module, batch: torch.Tensor, device: str) -> dict[str, float]:
    """Largest |device - CPU| over the largest |CPU| activation, TF32 off and on."""
    with torch.inference_mode():
        reference = model.cpu()(batch)
        scale = max(1.0, float(reference.abs().max()))
        errors = {}
        model.to(device)
        for tf32 in (False, True):
            _tf32(tf32)
            got = model(batch.to(device)).cpu()
            errors["tf32" if tf32 else "fp32"] = float((got - reference).abs().max()) / scale
        _tf32(False)
    return errors


def block_rates(
    model: nn.Module, example: torch.Tensor, device: str, repeats: int
) -> dict[str, dict[str, float]]:
    """Samples/s of ``model`` per batch size, output on the host; TF32 off, on, and fp16;
    and TF32 off with the output copied into pinned host memory (``fp32_pinned``: what
    onnxruntime's IO binding to a pinned buffer does) instead of a fresh pageable tensor."""
    rates: dict[str, dict[str, float]] = {"fp32": {}, "tf32": {}, "fp16": {}, "fp32_pinned": {}}
    with torch.inference_mode():
        for size in BATCHES:
            batch = example[torch.arange(size) % len(example)].to(device)
            for mode in ("fp32", "tf32"):
                _tf32(mode == "tf32")
                rates[mode][str(size)] = _rate(
                    partial(_to_host, model, batch), size, device, repeats
                )
            if device == "cuda":
                _tf32(False)
                shape = model(batch).shape
                pinned = torch.empty(shape, pin_memory=True)
                rates["fp32_pinned"][str(size)] = _rate(
                    partial(_to_pinned, model, batch, pinned), size, device, repeats
                )
                half, half_batch = model.half(), batch.half()
                rates["fp16"][str(size)] = _rate(
                    partial(_to_host, half, half_batch), size, device, repeats
                )
                model.float()
        _tf32(False)
    return rates


def _to_host(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The model's output in a fresh (pageable) host tensor, float32."""
    out: torch.Tensor = model(batch)
    return out.float().cpu()


def _to_pinned(model: nn.Module, batch: torch.Tensor, pinned: torch.Tensor) -> torch.Tensor:
    """The model's output copied into a reused pinned host buffer."""
    return pinned.copy_(model(batch), non_blocking=True)


def pipeline_rate(
    blobs: list[bytes], model: nn.Module, device: str, batch: int, repeats: int
) -> float:
    """Decode on ``device`` and run ``model``, batch after batch, output on the host."""
    chunks = [blobs[i : i + batch] for i in range(0, len(blobs) - batch + 1, batch)]
    if not chunks:
        raise ValueError(f"pipeline_rate: fewer than {batch} images")

    def epoch() -> None:
        with torch.inference_mode():
            for chunk in chunks:
                model(preprocess_device(chunk, device)).cpu()

    return _rate(epoch, batch * len(chunks), device, repeats)


def run(out: Path, device: str, images: int, repeats: int) -> dict[str, Any]:
    """Every measurement; returns and writes the results."""
    torch.backends.cudnn.benchmark = True
    blobs = photos(images)
    example = torch.stack([preprocess_cpu(b) for b in blobs[:32]])
    example = _normalize(example)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor(),
        "runtime": f"torch {torch.__version__}",
        "host_cores": _cores(),
        "images": images,
        "mean_jpeg_bytes": statistics.mean(len(b) for b in blobs),
        "onnxruntime_providers": _ort_providers(),
        "models": {},
    }
    results["decode"] = decode_rates(blobs, device, repeats)
    print(f"decode: {json.dumps(results['decode'])}", flush=True)
    for family in families():
        parts = blocks(family)
        freeze = len(parts)
        rows = []
        for split in sorted({max(1, freeze // 4), max(1, freeze // 2), freeze}):
            model = nn.Sequential(*parts[:split]).eval()
            errors = fidelity(model, example[:8], device)
            rates = block_rates(model.to(device), example, device, repeats)
            rows.append(
                {
                    "split": split,
                    "fidelity": errors,
                    "samples_per_s": rates["fp32"],
                    "samples_per_s_tf32": rates["tf32"],
                    "samples_per_s_fp16": rates["fp16"],
                    "samples_per_s_pinned": rates["fp32_pinned"],
                }
            )
            print(f"{family} split {split}: {json.dumps(rows[-1])}", flush=True)
        whole = nn.Sequential(*parts).eval().to(device)
        loop = {
            str(b): pipeline_rate(blobs, whole, device, b, max(1, repeats // 3)) for b in (64, 256)
        }
        print(f"{family} pipeline to {freeze}: {json.dumps(loop)}", flush=True)
        results["models"][family] = {"freeze": freeze, "splits": rows, "pipeline": loop}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-device-ceiling.json").write_text(json.dumps(results, indent=2))
    (out / "bench-device-ceiling.md").write_text(markdown(results))
    return results


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _ort_providers() -> list[str] | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return list(onnxruntime.get_available_providers())


def markdown(results: dict[str, Any]) -> str:
    """The results as tables (samples/s)."""
    decode = results["decode"]
    lines = [
        f"{results['device']}, {results['runtime']}, {results['host_cores']} host cores; "
        f"{results['images']} JPEGs of {results['mean_jpeg_bytes'] / 1000:.0f} KB on average; "
        f"onnxruntime providers there: {results['onnxruntime_providers']}",
        "",
        f"Decode + resize + crop + normalize: host, one thread {decode['host_one_thread']:.0f}/s; "
        "on the device " + ", ".join(f"b{b} {r:,.0f}/s" for b, r in decode["device"].items()),
        "",
        "| model | split | error fp32 | error TF32 | "
        + " | ".join(f"b{b} fp32 (pinned, TF32, fp16)" for b in BATCHES)
        + " |",
        "|---|---|---|---|" + "---|" * len(BATCHES),
    ]
    for family, entry in results["models"].items():
        for row in entry["splits"]:
            cells = [
                f"{row['samples_per_s'][str(b)]:,.0f} "
                f"({row['samples_per_s_pinned'].get(str(b), 0):,.0f}, "
                f"{row['samples_per_s_tf32'][str(b)]:,.0f}, "
                f"{row['samples_per_s_fp16'].get(str(b), 0):,.0f})"
                for b in BATCHES
            ]
            lines.append(
                f"| {family} | {row['split']} | {row['fidelity']['fp32']:.1e} | "
                f"{row['fidelity']['tf32']:.1e} | " + " | ".join(cells) + " |"
            )
    lines += ["", "| model | pipeline to the freeze point, b64 | b256 |", "|---|---|---|"]
    for family, entry in results["models"].items():
        p = entry["pipeline"]
        lines.append(f"| {family} | {p['64']:,.0f}/s | {p['256']:,.0f}/s |")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    """The script's options."""
    p = argparse.ArgumentParser(
        prog="hapi-bench device-ceiling",
        description="The storage side's ceiling on one accelerator with PyTorch alone: "
        "nvJPEG decoding, hapi's frozen blocks per batch size, and the two together.",
    )
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="results directory")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="[default: cuda]")
    p.add_argument("--images", type=int, default=512, help="JPEGs to make [default: 512]")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per figure [default: 10]")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    """Run every measurement and print where the results went."""
    args = parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("device-ceiling: torch finds no CUDA device (try --device cpu)", file=sys.stderr)
        raise SystemExit(2)
    if args.images < max(DECODE_BATCHES) or args.repeats < 1:
        print(
            f"device-ceiling: need --images >= {max(DECODE_BATCHES)} and --repeats >= 1",
            file=sys.stderr,
        )
        raise SystemExit(2)
    run(args.out, args.device, args.images, args.repeats)
    print(f"wrote {args.out / 'bench-device-ceiling.json'} and .md", flush=True)


if __name__ == "__main__":
    main()
