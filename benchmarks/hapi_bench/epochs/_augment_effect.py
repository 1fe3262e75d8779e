"""``hapi-bench augment``: what augmentation next to the data does for learning, and costs.

The same linear head is trained on EfficientNet-Lite0's pooled features (split = freeze,
computed by the gateway) of the same images, five ways:

- ``none``: the preset's resize and centre crop every epoch (the feature cache serves
  epochs 2 onward);
- ``fresh``: a fresh random view of every image each epoch (``views=0``: nothing cached);
- ``K=1``, ``K=2``, ``K=4``: ``views=K``, epoch ``e`` reads view ``e mod K``, kept in the
  feature cache once made.

Data: scikit-learn's handwritten digits (1,797 scans of 8x8 pixels, shipped inside the
package, no download), rendered as 224-pixel JPEGs as ``hapi demo`` does, a few per class
for training and a disjoint held-out set. It suits the question because a linear probe
on few images per class is where augmentation can matter, and the policy can be one a
practitioner would pick for digits: random resized crops and brightness/contrast jitter,
and no flip (a mirrored digit is another glyph).

For each seed (the head's initialization, the order, and the views' draws; the data is
the same) the five configurations run in a rotated order against a real store and
gateway; the cache is emptied before each. Reported per configuration: held-out accuracy
(mean, min, max over seeds), bytes received per epoch, each epoch's seconds, and the
requests the gateway answered from its cache. Writes ``augment.json``, ``augment.md`` and
``augment.png`` to ``--out``.

Exit codes: 0 done, 1 the benchmark failed, 2 bad options.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("bench-results") / "augment"
POLICY = "crop(scale=0.5:1,ratio=0.75:1.3333);jitter(brightness=0.4,contrast=0.4)"
CONFIGS: tuple[tuple[str, int | None], ...] = (
    ("none", None),
    ("fresh", 0),
    ("K=1", 1),
    ("K=2", 2),
    ("K=4", 4),
)
"""(name, views): ``None`` means no augmentation."""
MODEL = "efficientnet_lite0"
BUCKET = "augment-digits"


@dataclass(frozen=True)
class Run:
    """One configuration trained with one seed."""

    config: str
    seed: int
    accuracy: float
    epoch_seconds: list[float]
    bytes_per_epoch: list[int]
    gateway_hits: list[int]
    requests: list[int]


def parser() -> argparse.ArgumentParser:
    """The command's options."""
    p = argparse.ArgumentParser(
        prog="hapi-bench augment",
        description="Held-out accuracy, bytes and epoch time of one linear head trained "
        "on gateway-computed features: no augmentation, fresh views each epoch, and K "
        "cached views (K = 1, 2, 4), over several seeds, on scikit-learn's digits.",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    p.add_argument("--seeds", type=int, default=3, help="seeds per configuration [default: 3]")
    p.add_argument("--epochs", type=int, default=8, help="epochs per run [default: 8]")
    p.add_argument("--train-per-class", type=int, default=20, help="[default: 20]")
    p.add_argument("--test-per-class", type=int, default=50, help="[default: 50]")
    p.add_argument("--batch-size", type=int, default=16, help="[default: 16]")
    p.add_argument("--policy", default=POLICY, help=f"augmentation spec [default: {POLICY}]")
    p.add_argument(
        "--from-json", type=Path, help="render augment.md and .png again from an augment.json"
    )
    return p


def main(argv: Sequence[str] | None = None) -> None:
    """Run every configuration for every seed; write the JSON, the table and the plot."""
    args = parser().parse_args(argv)
    if args.seeds < 1 or args.epochs < 4 or args.train_per_class < 1 or args.test_per_class < 1:
        print(
            "hapi-bench augment: need --seeds >= 1, --epochs >= 4 and classes >= 1", file=sys.stderr
        )
        raise SystemExit(2)
    from hapi.protocol import AugmentPolicy, InvalidValue

    try:
        AugmentPolicy.parse(args.policy)
    except InvalidValue as exc:
        print(f"hapi-bench augment: --policy: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    if args.from_json is not None:
        results = json.loads(args.from_json.read_text())
    else:
        results = run(args)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "augment.json").write_text(json.dumps(results, indent=2))
    out = args.out if args.from_json is None else args.from_json.parent
    (out / "augment.md").write_text(markdown(results))
    plot(out / "augment.png", results)
    print(f"wrote {out / 'augment.json'}, augment.md and augment.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start a store and a gateway, upload the digits, train every configuration."""
    from hapi import models
    from hapi_bench.epochs._epochs import empty_cache_bucket
    from hapi_bench.micro._gateway import bench_store

    started = time.perf_counter()
    runs: list[Run] = []
    with bench_store() as bench:
        manifest = models.Registry(bench.s3).register(MODEL, models.export_model(MODEL))
        bench.s3.create_bucket(Bucket=BUCKET)
        raw = upload(bench.s3, args.train_per_class, args.test_per_class)
        with bench.gateway("gw-augment.log") as gw:
            options = {
                "aws_access_key_id": gw.key,
                "aws_secret_access_key": gw.secret,
                "region_name": "us-east-1",
            }
            for seed in range(args.seeds):
                order = CONFIGS[seed % len(CONFIGS) :] + CONFIGS[: seed % len(CONFIGS)]
                for name, views in order:
                    empty_cache_bucket(bench.s3)
                    result = train(gw.url, options, manifest, name, views, seed, args)
                    runs.append(result)
                    print(
                        f"seed {seed} {name:>5}: accuracy {result.accuracy:.3f}, epochs "
                        + " ".join(f"{s:.1f}" for s in result.epoch_seconds)
                        + f" s, hits {result.gateway_hits}",
                        flush=True,
                    )
    return {
        "model": MODEL,
        "split": manifest.freeze,
        "policy": args.policy,
        "dataset": "scikit-learn digits rendered as 224 px JPEGs",
        "train_per_class": args.train_per_class,
        "test_per_class": args.test_per_class,
        "raw_train_bytes": raw,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "seeds": args.seeds,
        "runs": [asdict(r) for r in runs],
        "summary": summary(runs),
        "total_s": time.perf_counter() - started,
    }


def upload(s3: Any, train: int, test: int) -> int:
    """The digits as the demo renders them, under ``train/`` and ``test/``; the training
    objects' bytes."""
    from hapi.examples.transfer_learning import digits, render

    raw = 0
    for key, image in digits("digits", train, test, seed=0):
        body = render(image)
        s3.put_object(Bucket=BUCKET, Key=key, Body=body, ContentType="image/jpeg")
        raw += len(body) if "/train/" in key else 0
    return raw


def train(
    endpoint: str,
    options: dict[str, Any],
    manifest: Any,
    name: str,
    views: int | None,
    seed: int,
    args: argparse.Namespace,
) -> Run:
    """One head through ``args.epochs`` epochs of configuration ``name``; scored after."""
    import torch
    from torch.utils.data import DataLoader

    from hapi import sdk

    common: dict[str, Any] = {
        "model": manifest.name,
        "split": manifest.freeze,
        "endpoint_url": endpoint,
        "client_options": options,
        "request_size": args.batch_size,
    }
    augment = {} if views is None else {"augment": args.policy, "views": views}
    dataset = sdk.IterableFeatureDataset.from_prefix(
        f"s3://{BUCKET}/digits/train/", shuffle=True, seed=seed, **common, **augment
    )
    head: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    seconds = []
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        start = time.perf_counter()
        for features, labels in DataLoader(dataset, batch_size=args.batch_size):
            if head is None:  # sized by the first batch; the same initial weights per seed
                torch.manual_seed(seed)
                head = torch.nn.Linear(features[0].numel(), 10)
                optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
            assert optimizer is not None
            loss = torch.nn.functional.cross_entropy(head(features.flatten(1).float()), labels)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
            optimizer.step()
        seconds.append(time.perf_counter() - start)
    assert head is not None
    test = sdk.FeatureDataset.from_prefix(f"s3://{BUCKET}/digits/test/", **common)
    correct = total = 0
    with torch.no_grad():
        for features, labels in DataLoader(test, batch_size=64):
            correct += int((head(features.flatten(1).float()).argmax(1) == labels).sum())
            total += len(labels)
    history = dataset.history
    return Run(
        config=name,
        seed=seed,
        accuracy=correct / total,
        epoch_seconds=seconds,
        bytes_per_epoch=[s.bytes_received for s in history],
        gateway_hits=[s.gateway_hits for s in history],
        requests=[s.requests for s in history],
    )


def summary(runs: Sequence[Run]) -> dict[str, dict[str, float]]:
    """Per configuration: accuracy mean/min/max over seeds, median epoch seconds of the
    first epoch and of the rest, mean bytes per epoch, and the share of requests the
    gateway answered from its cache."""
    out: dict[str, dict[str, float]] = {}
    for name, _ in CONFIGS:
        mine = [r for r in runs if r.config == name]
        if not mine:
            continue
        accuracy = [r.accuracy for r in mine]
        requests = sum(sum(r.requests) for r in mine)
        out[name] = {
            "accuracy_mean": statistics.mean(accuracy),
            "accuracy_min": min(accuracy),
            "accuracy_max": max(accuracy),
            "first_epoch_s": statistics.median(r.epoch_seconds[0] for r in mine),
            "later_epoch_s": statistics.median(s for r in mine for s in r.epoch_seconds[1:]),
            "bytes_per_epoch": statistics.mean(b for r in mine for b in r.bytes_per_epoch),
            "cache_hit_share": sum(sum(r.gateway_hits) for r in mine) / requests
            if requests
            else 0.0,
        }
    return out


def markdown(results: dict[str, Any]) -> str:
    """The summary as a table, with what the run was."""
    lines = [
        f"{results['dataset']}: {results['train_per_class']} training and "
        f"{results['test_per_class']} held-out images per class; {results['model']} "
        f"split {results['split']} (pooled features, computed by the gateway); a linear "
        f"head, Adam, {results['epochs']} epochs of batch {results['batch_size']}; "
        f"{results['seeds']} seeds; policy `{results['policy']}`. Raw training images: "
        f"{results['raw_train_bytes'] / 1e3:,.0f} KB.",
        "",
        "| configuration | held-out accuracy, mean (min-max) | epoch 1 s | later epochs s "
        "| KB per epoch | requests from the cache |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in results["summary"].items():
        lines.append(
            f"| {name} | {row['accuracy_mean']:.3f} ({row['accuracy_min']:.3f}-"
            f"{row['accuracy_max']:.3f}) | {row['first_epoch_s']:.2f} | "
            f"{row['later_epoch_s']:.2f} | {row['bytes_per_epoch'] / 1e3:,.0f} | "
            f"{row['cache_hit_share']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def plot(path: Path, results: dict[str, Any]) -> Path:
    """Accuracy per configuration (each seed a dot, the mean a bar) beside the median
    later-epoch time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["summary"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for i, name in enumerate(names):
        row = results["summary"][name]
        left.bar(i, row["accuracy_mean"], color="#9ecae1")
        seeds = [r["accuracy"] for r in results["runs"] if r["config"] == name]
        left.plot([i] * len(seeds), seeds, "k.", markersize=6)
        right.bar(i, row["later_epoch_s"], color="#fdae6b")
    low = min(r["accuracy"] for r in results["runs"])
    left.set_ylim(max(0.0, low - 0.05), 1.0)
    for axis, title in ((left, "held-out accuracy"), (right, "epochs 2+: median s")):
        axis.set_xticks(range(len(names)), names)
        axis.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
