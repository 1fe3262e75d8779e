"""``hapi-bench batching``: storage-side throughput, adaptive batching vs fixed batch sizes.

Starts a real store, registers ResNet18 (seeded weights), uploads JPEGs, and for each
storage-side batching policy (adaptive, fixed 1, 8, 32, 128) runs a real gateway and
drives it with 1, 2, 4 and 8 concurrent clients sending single-image pushdown GETs.
Reports samples/s per cell, the adaptive policy against the best fixed size per row,
and every failed request. Writes JSON, a markdown table and a PNG plot to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from hapi import models
from hapi.gateway import sign_request
from hapi.protocol import Credentials
from hapi_bench.micro._gateway import bench_store

POLICIES: dict[str, dict[str, str]] = {
    "adaptive": {},
    "fixed-1": {"HAPI_FIXED_BATCH_SIZE": "1"},
    "fixed-8": {"HAPI_FIXED_BATCH_SIZE": "8"},
    "fixed-32": {"HAPI_FIXED_BATCH_SIZE": "32"},
    "fixed-128": {"HAPI_FIXED_BATCH_SIZE": "128"},
}
CLIENTS = (1, 2, 4, 8)


def make_images(count: int, seed: int = 0) -> list[bytes]:
    """ImageNet-like JPEGs: random crops, flips and scales of scikit-image's sample photos."""
    rng = random.Random(seed)
    sources = models.sample_images()
    out = []
    for _ in range(count):
        image = rng.choice(sources)
        w, h = image.size
        side = rng.randint(min(w, h) // 2, min(w, h))
        left, top = rng.randint(0, w - side), rng.randint(0, h - side)
        crop = image.crop((left, top, left + side, top + side)).resize((rng.randint(224, 500),) * 2)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        buf = io.BytesIO()
        crop.convert("RGB").save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


async def _drive(
    url: str, creds: Credentials, keys: list[str], clients: int, split: int, seconds: float
) -> dict[str, Any]:
    done, failed, stop = 0, 0, time.perf_counter() + seconds
    errors: list[str] = []

    async def client(http: httpx.AsyncClient, seed: int) -> None:
        nonlocal done, failed
        rng = random.Random(seed)
        while time.perf_counter() < stop:
            target = f"{url}/bench/{rng.choice(keys)}?hapi-model=r18&hapi-split={split}"
            reply = await http.get(
                target,
                headers=sign_request(method="GET", url=target, headers={}, credentials=creds),
            )
            if reply.status_code == 200:
                done += 1
            else:
                failed += 1
                errors.append(reply.text[:200])

    async with httpx.AsyncClient(timeout=120) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http, i) for i in range(clients)))
        elapsed = time.perf_counter() - started
    return {"samples_per_s": done / elapsed, "ok": done, "failed": failed, "errors": errors[:3]}


def run(out: Path, seconds: float, images: int, split: int) -> dict[str, Any]:
    """Run every (policy, clients) cell; returns and writes the results."""
    with bench_store() as bench:
        s3 = bench.s3
        print("exporting resnet18 and uploading images ...", flush=True)
        models.Registry(s3).register(
            "r18", models.export_model("resnet18", freeze=6, progress=False)
        )
        s3.create_bucket(Bucket="bench")
        keys = [f"img-{i:03d}.jpg" for i in range(images)]
        for name, blob in zip(keys, make_images(images), strict=True):
            s3.put_object(Bucket="bench", Key=name, Body=blob)
        results: dict[str, Any] = {"split": split, "seconds_per_cell": seconds, "cells": {}}
        for policy, env in POLICIES.items():
            with bench.gateway(f"gw-{policy}.log", env) as gw:
                creds = Credentials(gw[1], gw[2])
                asyncio.run(_drive(gw[0], creds, keys, 2, split, 1.0))  # warm-up: session built
                for clients in CLIENTS:
                    cell = asyncio.run(_drive(gw[0], creds, keys, clients, split, seconds))
                    results["cells"][f"{policy}/{clients}"] = cell
                    print(
                        f"{policy:>10} clients={clients}: {cell['samples_per_s']:7.1f} samples/s "
                        f"failed={cell['failed']}",
                        flush=True,
                    )
    return _report(out, results)


def _report(out: Path, results: dict[str, Any]) -> dict[str, Any]:
    cells = results["cells"]
    rows, lines = (
        [],
        [
            "| clients | " + " | ".join(POLICIES) + " | adaptive / best fixed |",
            "|---" * (len(POLICIES) + 2) + "|",
        ],
    )
    for clients in CLIENTS:
        rates = {p: cells[f"{p}/{clients}"]["samples_per_s"] for p in POLICIES}
        best_fixed = max(v for p, v in rates.items() if p != "adaptive")
        ratio = rates["adaptive"] / best_fixed if best_fixed else 0.0
        rows.append({"clients": clients, **rates, "adaptive_vs_best_fixed": ratio})
        lines.append(
            f"| {clients} | "
            + " | ".join(f"{rates[p]:.1f}" for p in POLICIES)
            + f" | {ratio:.2f} |"
        )
    results["rows"] = rows
    results["failed_requests"] = sum(c["failed"] for c in cells.values())
    results["adaptive_within_10pct_everywhere"] = all(
        r["adaptive_vs_best_fixed"] >= 0.9 for r in rows
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-pushdown.json").write_text(json.dumps(results, indent=2))
    table = "\n".join(lines)
    (out / "bench-pushdown.md").write_text(
        f"samples/s, ResNet18 split {results['split']}\n\n{table}\n"
    )
    _plot(out / "bench-pushdown.png", rows)
    print("\n" + table)
    print(
        f"\nfailed requests: {results['failed_requests']}; adaptive within 10% of the best fixed size "
        f"in every row: {results['adaptive_within_10pct_everywhere']}"
    )
    return results


def _plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in POLICIES:
        ax.plot(
            [r["clients"] for r in rows],
            [r[policy] for r in rows],
            marker="o",
            label=policy,
            linewidth=2.5 if policy == "adaptive" else 1,
        )
    ax.set(
        xlabel="concurrent clients",
        ylabel="samples/s",
        title="storage-side batching",
        xscale="log",
        xticks=CLIENTS,
    )
    ax.set_xticklabels([str(c) for c in CLIENTS])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per cell")
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--split", type=int, default=5)
    args = parser.parse_args(argv)
    run(args.out, args.seconds, args.images, args.split)


if __name__ == "__main__":
    main()
