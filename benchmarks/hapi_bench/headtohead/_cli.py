"""``hapi-bench headtohead``: the same training job through s3torchconnector and hapi.

Exit codes: 0 done (the goals are reported, not enforced), 1 the benchmark failed, 2 this
machine cannot host the testbed or bad options.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hapi.protocol import ENCODINGS
from hapi_bench.core._errors import BenchError, TestbedUnavailable

from ._config import BANDWIDTHS, DEFAULT_BANDWIDTHS, LOADS, HeadToHeadConfig

DEFAULT_OUT = Path("bench-results") / "headtohead"


def parser() -> argparse.ArgumentParser:
    """The command's options."""
    p = argparse.ArgumentParser(
        prog="hapi-bench headtohead",
        description="The same training job fed by s3torchconnector (from the store, and "
        "through hapi's gateway) and by hapi (split='auto', and with the feature cache), "
        "on the two-tier testbed, interleaved. Needs root, ip, tc, taskset and two cores.",
    )
    p.add_argument("--quick", action="store_true", help="resnet18, 10mbit and unshaped, 48 samples")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    p.add_argument("--models", help="comma-separated [default: resnet18,efficientnet_lite0]")
    p.add_argument(
        "--bandwidths",
        help=f"comma-separated, of {', '.join(BANDWIDTHS)} "
        f"[default: {','.join(DEFAULT_BANDWIDTHS)}]",
    )
    p.add_argument("--loads", help=f"comma-separated, of {', '.join(LOADS)}")
    p.add_argument("--samples", type=int, help="training objects [default: 192]")
    p.add_argument("--held-out", type=int, help="objects the heads are scored on [default: 64]")
    p.add_argument("--epochs", type=int, help="epochs per configuration and cell [default: 3]")
    p.add_argument("--batch-size", type=int, help="training batch [default: 16]")
    p.add_argument("--workers", type=int, help="DataLoader workers [default: 2]")
    p.add_argument("--prefetch-factor", type=int, help="batches per worker ahead [default: 4]")
    p.add_argument("--seed", type=int, help="dataset, sampler and head seed [default: 0]")
    p.add_argument("--nice", type=int, help="niceness of both tiers [default: 0]")
    p.add_argument(
        "--device-json",
        type=Path,
        help="make bench-device's bench-device.json: its blocks rate replaces the published "
        "one in the GPU node's projection",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        help="render headtohead.md and .png again from a headtohead.json, without running",
    )
    p.add_argument(
        "--cache-split",
        choices=("freeze", "auto"),
        help="split of the cached configuration: the freeze point, or the planner's pick "
        "[default: freeze]",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        help="hapi's wire dtype (the contender decodes images either way) [default: float32]",
    )
    p.add_argument(
        "--encoding",
        choices=ENCODINGS,
        help="hapi's answers: without their zero words, or dense [default: zeros]",
    )
    return p


def _csv(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(p.strip() for p in text.split(",") if p.strip())


def config_from(args: argparse.Namespace) -> HeadToHeadConfig:
    """The run's configuration from parsed options.

    Raises:
        ValueError: An invalid combination.
    """
    base = HeadToHeadConfig.quick(args.out) if args.quick else HeadToHeadConfig(out=args.out)
    changes = {
        "models": _csv(args.models),
        "bandwidths": _csv(args.bandwidths),
        "loads": _csv(args.loads),
        "samples": args.samples,
        "held_out": args.held_out,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "prefetch_factor": args.prefetch_factor,
        "seed": args.seed,
        "niceness": args.nice,
        "cache_split": args.cache_split,
        "dtype": args.dtype,
        "encoding": args.encoding,
    }
    return dataclasses.replace(base, **{k: v for k, v in changes.items() if v is not None})


def main(argv: Sequence[str] | None = None) -> None:
    """Run the head-to-head and write headtohead.json, headtohead.md and headtohead.png."""
    args = parser().parse_args(argv)
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"hapi-bench headtohead: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    from ._plot import plot
    from ._report import write_markdown
    from ._results import read_json, write_json

    device = None if args.device_json is None else json.loads(args.device_json.read_text())
    if args.from_json is not None:
        cells, meta = read_json(args.from_json)
        written = []
    else:
        cells, meta = _run(config)
        written = [write_json(config.out / "headtohead.json", cells, meta)]
    written += [
        write_markdown(config.out / "headtohead.md", cells, meta, device),
        plot(config.out / "headtohead.png", cells),
    ]
    print(f"{meta['total_s']:.0f} s in all; wrote " + ", ".join(str(p) for p in written))


def _run(config: HeadToHeadConfig) -> tuple[list[Any], dict[str, Any]]:
    from hapi_bench._cli import signals_interrupt

    from ._run import run_headtohead

    try:
        with signals_interrupt():  # SIGTERM and SIGHUP tear the testbed down as Ctrl-C does
            return run_headtohead(config, lambda line: print(line, flush=True))
    except TestbedUnavailable as exc:
        print(f"hapi-bench headtohead: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    except BenchError as exc:
        print(f"hapi-bench headtohead: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
