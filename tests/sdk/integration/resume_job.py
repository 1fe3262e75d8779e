"""A DDP training job that checkpoints its data position, for tests/sdk/integration/test_resume.py.

``python -m tests.sdk.integration.resume_job --ranks 2 --workers 2 ...`` spawns the ranks
(torch.multiprocessing, gloo), each with a ``StatefulDataLoader`` of DataLoader workers
over an ``IterableFeatureDataset`` on the gateway, and trains a linear head with DDP. Every
rank appends ``step<TAB>key<TAB>padded`` for each sample it receives to ``rank<R>.log``
(before the step's all-reduce, so a step rank 0 has finished is logged by every rank), and
with ``--digests`` ``step<TAB>key<TAB>sha256 of its features`` to ``rank<R>.views`` (which view of an
augmented sample it got); after each step rank 0 replaces ``state.pt`` with
``{"epoch", "step", "workers", "loader"}``. ``--options`` is JSON of more dataset options
(``{"augment": ..., "views": 2}``).
With ``--resume FILE`` every rank loads that state into its dataset, and into its loader
when it has as many workers, as docs/sdk.md tells users to, and runs the rest of the epoch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchdata.stateful_dataloader import StatefulDataLoader

from hapi import sdk


def _rank(rank: int, args: argparse.Namespace) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    options: dict[str, Any] = json.loads(args.options)
    train = sdk.IterableFeatureDataset.from_prefix(
        args.uri,
        model=args.model,
        split=args.split,
        labels=None,
        endpoint_url=args.endpoint,
        client_options={
            "aws_access_key_id": os.environ["JOB_KEY"],
            "aws_secret_access_key": os.environ["JOB_SECRET"],
            "region_name": "us-east-1",
        },
        request_size=2,
        shuffle=True,
        seed=5,
        batch_size=args.batch,
        with_info=True,
        **options,
    )
    loader = StatefulDataLoader(train, batch_size=args.batch, num_workers=args.workers)
    epoch = 1
    if args.resume:
        saved = torch.load(args.resume, weights_only=True)
        epoch = saved["epoch"]
        train.load_state_dict(saved["loader"])  # any number of ranks and workers
        if saved["workers"] == args.workers:
            loader.load_state_dict(saved["loader"])  # torchdata's own: as many workers
    train.set_epoch(epoch)
    head: torch.nn.Module | None = None
    out = Path(args.out)
    digests = (out / f"rank{rank}.views").open("a", buffering=1) if args.digests else None
    with (out / f"rank{rank}.log").open("a", buffering=1) as log, digests or nullcontext() as views:
        for step, (features, _, info) in enumerate(loader):
            rows = zip(info["key"], info["padded"].tolist(), features, strict=True)
            for key, padded, row in rows:
                if views is not None and not padded:
                    digest = hashlib.sha256(row.float().numpy().tobytes()).hexdigest()
                    views.write(f"{step}\t{key}\t{digest}\n")
                log.write(f"{step}\t{key}\t{int(padded)}\n")  # flushed: a line at a time
            if head is None:
                head = torch.nn.parallel.DistributedDataParallel(
                    torch.nn.Linear(features[0].numel(), 2)
                )
                optimizer = torch.optim.SGD(head.parameters(), lr=0.01)
            loss = head(features.flatten(1)).square().mean()
            optimizer.zero_grad()
            loss.backward()  # DDP's all-reduce: the ranks step together
            optimizer.step()
            if rank == 0:
                state = {"epoch": epoch, "step": step, "workers": args.workers}
                state["loader"] = loader.state_dict()
                torch.save(state, out / "state.tmp")
                os.replace(out / "state.tmp", out / "state.pt")
            time.sleep(args.pause)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("uri", "model", "endpoint", "out", "options"):
        parser.add_argument(f"--{name}", required=name != "options", default="{}")
    parser.add_argument("--split", type=int, required=True)
    for name in ("ranks", "workers", "batch", "port"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--resume", default="")
    parser.add_argument("--digests", action="store_true")
    args = parser.parse_args()
    mp.spawn(_rank, args=(args,), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
