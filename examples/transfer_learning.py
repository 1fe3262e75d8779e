"""Transfer learning on features: a linear head on EfficientNet-Lite0, the data in S3.

Start the embedded store and the gateway in one terminal, then run this in another with
the environment ``make run`` prints::

    make run
    export AWS_ENDPOINT_URL=http://127.0.0.1:8080 AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...
    .venv/bin/python examples/transfer_learning.py     # the same program as `hapi demo`

It uploads scikit-learn's handwritten digits, rendered as 224-pixel JPEGs in class
folders (``s3://hapi-demo/digits/.../train/7/0042.jpg``; skipped when already there), then
trains a linear head on EfficientNet-Lite0's pooled ImageNet features. The training loop
is ordinary PyTorch: only the dataset is hapi's. The gateway runs the frozen blocks
``[0, split)`` next to the data; this process runs the rest of the frozen blocks and the
head. It prints the split used, the test accuracy, the bytes received against the raw
objects' bytes, and the wall time.

By default the gateway runs every frozen block (the split is the model's freeze point) and
sends the pooled features in float16: 2.5 KB per image, fewer bytes than the JPEGs. Early
splits send MORE bytes than the images (a 224x224 image's first feature maps are hundreds
of KB). ``--split none`` reads the raw objects (the baseline), an integer forces a split,
``--split auto`` lets the planner choose (``--bandwidth 100mbit`` plans for that link);
``--dtype float32`` sends full precision. ``--endpoint`` overrides ``AWS_ENDPOINT_URL``.

Needs the ``demo`` extra: ``pip install 'hapi[demo]'`` (torch, scikit-learn).
"""

from __future__ import annotations

import argparse
import io
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from botocore.exceptions import ClientError
from PIL import Image
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader

from hapi import models, sdk

SIDE, INK = 224, 160  # the digit is drawn 160 px tall: a margin survives the center crop


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--endpoint", help="gateway URL (default: $AWS_ENDPOINT_URL)")
    parser.add_argument("--bucket", default="hapi-demo", help="bucket for the digits")
    parser.add_argument("--model", default=models.DEFAULT_MODEL, help="registered model")
    parser.add_argument(
        "--split", default="freeze", help="freeze (the default: pooled), auto, none, or K"
    )
    parser.add_argument("--bandwidth", help="plan for this bandwidth (100mbit); else measured")
    parser.add_argument("--dtype", default="float16", help="float16, float32 or bfloat16")
    parser.add_argument("--train-per-class", type=int, default=60, help="training images/digit")
    parser.add_argument("--test-per-class", type=int, default=30, help="test images per digit")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", action="store_true", help="tqdm bars per epoch")
    return parser.parse_args(argv)


def split_arg(value: str, freeze: int) -> int | str | None:
    """``--split`` as the SDK takes it: None (raw objects), "auto" or a block index."""
    if value == "freeze":
        return freeze
    return None if value == "none" else value if value == "auto" else int(value)


def render(digit: np.ndarray) -> bytes:
    """An 8x8 digit (ink 0..16) as a 224-pixel RGB JPEG: dark ink on white paper."""
    pixels = (255 - digit * (255 / 16)).astype(np.uint8)
    ink = Image.fromarray(pixels).resize((INK, INK), Image.Resampling.BICUBIC)
    paper = Image.new("L", (SIDE, SIDE), 255)
    paper.paste(ink, ((SIDE - INK) // 2, (SIDE - INK) // 2))
    buffer = io.BytesIO()
    paper.convert("RGB").save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def digits(prefix: str, train: int, test: int, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """(key, 8x8 image): ``train`` then ``test`` random images of each digit."""
    data = load_digits()
    rng = np.random.default_rng(seed)
    for label in range(10):
        chosen = rng.permutation(np.flatnonzero(data.target == label))[: train + test]
        for n, index in enumerate(chosen):
            part = "train" if n < train else "test"
            yield f"{prefix}/{part}/{label}/{index:04d}.jpg", data.images[index]


def upload(s3: Any, bucket: str, prefix: str, args: argparse.Namespace) -> None:
    """Put the digits in class folders under ``prefix``, unless they are there already."""
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError:
        s3.create_bucket(Bucket=bucket)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
    present = {item["Key"] for page in pages for item in page.get("Contents", [])}
    wanted = digits(prefix, args.train_per_class, args.test_per_class, args.seed)
    missing = [(key, image) for key, image in wanted if key not in present]
    for key, image in missing:
        s3.put_object(Bucket=bucket, Key=key, Body=render(image), ContentType="image/jpeg")
    print(f"data: s3://{bucket}/{prefix}/, {len(missing)} digits uploaded now")


def ensure_model(s3: Any, name: str) -> models.Manifest:
    """Register EfficientNet-Lite0 if the registry lacks it (``make run`` already has)."""
    try:
        return models.Registry(s3).get_manifest(name)
    except models.NoSuchModel:
        if name != models.DEFAULT_MODEL:
            raise
        print(f"model: exporting and registering {name} (needs torch, a few seconds)")
        return models.register_default_model(s3)


def train_head(dataset: sdk.IterableFeatureDataset, epochs: int, batch: int) -> torch.nn.Module:
    head: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    choice = dataset.split_choice
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for features, labels in DataLoader(dataset, batch_size=batch):
            if head is None:  # sized by the first batch: whatever freeze the model has
                head = torch.nn.Linear(features[0].numel(), 10)
                optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
            assert optimizer is not None
            loss = torch.nn.functional.cross_entropy(head(features.flatten(1)), labels)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
            optimizer.step()
        print(f"train: {dataset.stats}, last loss {loss.item():.3f}")
        if dataset.split_choice is not choice:  # re-planned, or a near tie's trial moved on
            choice = dataset.split_choice
            print(
                f"split: {choice.split} from epoch {epoch + 1} ({choice.policy}): {choice.reason}"
            )
    assert head is not None
    return head


def accuracy(head: torch.nn.Module, dataset: sdk.FeatureDataset, batch: int) -> float:
    correct = total = 0
    with torch.no_grad():
        for features, labels in DataLoader(dataset, batch_size=batch):
            correct += int((head(features.flatten(1)).argmax(1) == labels).sum())
            total += len(labels)
    return correct / total


def report_bytes(received: int, raw: int, *, split: int | None, freeze: int) -> str:
    """The bytes comparison: what crossed the network against the raw objects, with
    what to change when it is more."""
    if received == raw:
        verdict = "the raw images themselves"
    elif received < raw:
        verdict = f"{raw / received:.1f}x fewer bytes than the raw images"
    else:
        advice = (
            "choose a later split"
            if split is not None and split < freeze
            else "try --dtype float16, or --split none to read the images"
        )
        verdict = f"{received / raw:.1f}x MORE bytes than the raw images: {advice}"
    return (
        f"bytes received: {received / 1e6:.2f} MB, the raw objects: {raw / 1e6:.2f} MB ({verdict})"
    )


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """Run the example; ``argv`` as on the command line (``--help`` lists the options)."""
    args = parse_args(argv, prog)
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    options: dict[str, Any] = {}
    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        options["region_name"] = "us-east-1"
    s3 = sdk.client(args.endpoint, **options)
    print(f"endpoint: {s3.meta.endpoint_url}")
    manifest = ensure_model(s3, args.model)
    # The layout names its sizes and seed, so a listing never mixes two runs' choices.
    prefix = f"digits/{args.train_per_class}+{args.test_per_class}-seed{args.seed}"
    upload(s3, args.bucket, prefix, args)
    common: dict[str, Any] = {
        "model": args.model,
        "split": split_arg(args.split, manifest.freeze),
        "bandwidth": args.bandwidth,
        "dtype": args.dtype,
        "endpoint_url": args.endpoint,
        "client_options": options,
    }
    root = f"s3://{args.bucket}/{prefix}"
    train = sdk.IterableFeatureDataset.from_prefix(
        f"{root}/train/", shuffle=True, seed=args.seed, progress=args.progress, **common
    )
    choice = train.split_choice
    print(f"split: {choice.split} of freeze {train.freeze} ({choice.policy}): {choice.reason}")
    head = train_head(train, args.epochs, args.batch_size)
    test = sdk.FeatureDataset.from_prefix(f"{root}/test/", **{**common, "split": train.split})
    score = accuracy(head, test, args.batch_size)
    tested = test.stats
    received = sum(s.bytes_received for s in train.history) + tested.bytes_received
    raw = (train.raw_bytes or 0) * len(train.history) + (test.raw_bytes or 0)
    print(f"test accuracy: {score:.1%} on {len(test)} digits")
    verdict = report_bytes(received, raw, split=test.split, freeze=test.freeze)
    print(f"{verdict}; mode {tested.mode}, dtype {args.dtype}")
    print(f"wall time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
