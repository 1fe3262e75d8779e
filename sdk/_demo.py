"""Transfer learning on features: a linear head on EfficientNet-Lite0, the data in S3.

Start the embedded store and the gateway in one terminal, then run this in another with
the environment ``make run`` prints::

    make run
    export AWS_ENDPOINT_URL=http://127.0.0.1:8080 AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...
    .venv/bin/hapi demo            # or: .venv/bin/python examples/transfer_learning.py

It uploads scikit-learn's handwritten digits, rendered as 224-pixel JPEGs in class
folders (``s3://hapi-demo/digits/train/7/0042.jpg``; skipped when already there), then
trains a linear head on EfficientNet-Lite0's pooled ImageNet features. The training
loop is ordinary PyTorch: only the dataset is hapi's. The gateway runs the frozen
blocks ``[0, split)`` next to the data; this process runs the rest of the frozen blocks
and the head. It prints the split used and why, the test accuracy, the bytes received
against the raw objects' bytes, and the wall time.

``--endpoint`` overrides ``AWS_ENDPOINT_URL``; ``--split none`` reads raw objects (the
baseline), an integer forces a split; ``--bandwidth 100mbit`` plans for that link instead
of the measured one; ``--dtype float16`` halves the features' bytes on the wire.
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hapi demo", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--endpoint", help="gateway URL (default: $AWS_ENDPOINT_URL)")
    parser.add_argument("--bucket", default="hapi-demo", help="bucket for the digits")
    parser.add_argument("--model", default=models.DEFAULT_MODEL, help="registered model")
    parser.add_argument("--split", default="auto", help="auto, none, or an integer")
    parser.add_argument("--bandwidth", help="plan for this bandwidth (100mbit); else measured")
    parser.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16")
    parser.add_argument("--train-per-class", type=int, default=60, help="training images/digit")
    parser.add_argument("--test-per-class", type=int, default=30, help="test images per digit")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", action="store_true", help="tqdm bars per epoch")
    return parser.parse_args(argv)


def split_arg(value: str) -> int | str | None:
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


def ensure_model(s3: Any, name: str) -> None:
    """Register EfficientNet-Lite0 if the registry lacks it (``make run`` already has)."""
    try:
        models.Registry(s3).get_manifest(name)
    except models.NoSuchModel:
        if name != models.DEFAULT_MODEL:
            raise
        print(f"model: exporting and registering {name} (needs torch, a few seconds)")
        models.register_default_model(s3)


def train_head(dataset: sdk.IterableFeatureDataset, epochs: int, batch: int) -> torch.nn.Module:
    head: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
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
    assert head is not None
    return head


def accuracy(head: torch.nn.Module, dataset: sdk.FeatureDataset, batch: int) -> float:
    correct = total = 0
    with torch.no_grad():
        for features, labels in DataLoader(dataset, batch_size=batch):
            correct += int((head(features.flatten(1)).argmax(1) == labels).sum())
            total += len(labels)
    return correct / total


def main(argv: list[str] | None = None) -> None:
    """Run the demo; ``argv`` as on the command line (``--help`` lists the options)."""
    args = parse_args(argv)
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    options: dict[str, Any] = {}
    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        options["region_name"] = "us-east-1"
    s3 = sdk.client(args.endpoint, **options)
    print(f"endpoint: {s3.meta.endpoint_url}")
    ensure_model(s3, args.model)
    # The layout names its sizes and seed, so a listing never mixes two runs' choices.
    prefix = f"digits/{args.train_per_class}+{args.test_per_class}-seed{args.seed}"
    upload(s3, args.bucket, prefix, args)
    common: dict[str, Any] = {
        "model": args.model,
        "split": split_arg(args.split),
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
    print(
        f"bytes received: {received / 1e6:.2f} MB, the raw objects: {raw / 1e6:.2f} MB "
        f"({received / raw:.2f}x); mode {tested.mode}"
    )
    print(f"wall time: {time.perf_counter() - started:.1f} s")
