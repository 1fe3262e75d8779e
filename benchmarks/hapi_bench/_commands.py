"""``hapi-bench``: the testbed and the micro-benchmarks, one subcommand each.

``hapi-bench testbed`` is ``hapi bench`` (the two-tier testbed); ``proxy``, ``servers``, ``pushdown``,
``batching``, ``device``, ``device-ceiling`` and ``load`` are the micro-benchmarks the ``make bench-*`` targets
run. Each
micro-benchmark keeps its own argument parser, so its options and ``--help`` are its own;
its module is imported only when it runs (``hapi`` loads this package at every start).
"""

from __future__ import annotations

import importlib

import click

from hapi_bench._cli import bench

# name: (module, one line of help)
MICRO_BENCHMARKS = {
    "proxy": ("micro._proxy", "Pass-through cost vs direct access and nginx."),
    "servers": ("micro._servers", "Pass-through cost of the gateway under uvicorn and granian."),
    "floors": ("micro._floors", "What a pass-through GET's CPU is made of, layer by layer."),
    "pushdown": ("micro._ceiling", "Pushdown throughput against a bare loop on the same cores."),
    "batching": ("micro._pushdown", "Storage-side throughput, adaptive batching vs fixed sizes."),
    "device": ("micro._device", "The storage side's blocks on an accelerator, checked and timed."),
    "device-ceiling": (
        "micro.device_ceiling",
        "The storage side's ceiling on an accelerator with PyTorch alone (runs by path too).",
    ),
    "load": ("micro._load", "A bounded load run through the gateway, nginx and the store."),
    "cluster": (
        "cluster._cluster_cli",
        "The multi-node store: up, down, and scaling over 1-3 nodes.",
    ),
    "augment": (
        "epochs._augment_effect",
        "Augmentation's effect on a head's accuracy: none, fresh views, K cached views.",
    ),
    "headtohead": ("headtohead._cli", "The same training job through s3torchconnector and hapi."),
}

# Options pass through untouched to the benchmark's own parser (``--help`` included).
_PASS_THROUGH = {"ignore_unknown_options": True, "help_option_names": []}


def _micro(name: str, module: str, summary: str) -> click.Command:
    """A subcommand that hands its arguments to ``hapi_bench.<module>.main``."""

    @click.command(name, context_settings=_PASS_THROUGH, help=summary, add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        importlib.import_module(f"{__package__}.{module}").main(list(args))

    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """hapi's benchmarks: the two-tier testbed and the micro-benchmarks.

    `hapi-bench NAME --help` gives each one's options.
    """


main.add_command(bench, "testbed")
for _name, (_module, _summary) in MICRO_BENCHMARKS.items():
    main.add_command(_micro(_name, _module, _summary))
