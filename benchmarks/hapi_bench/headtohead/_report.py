"""The head-to-head as markdown: the cells' table, the goals, and the model on paper."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _projection as model
from ._loaders import CONFIGS, HAPI, HAPI_CACHE, S3TORCH, S3TORCH_GATEWAY
from ._results import QUIET, Cell, ConfigResult

SLOWER_LIMIT = 0.95  # hapi at least 0.95x the contender's speed in every cell
LINK_BOUND_GOAL = 3.0
WARM_GOAL = 10.0
HEADER = (
    "| model | link | load | loader | split | cold s | warm s | samples/s | KB/sample "
    "| client ms/sample | storage ms/sample | accuracy | x s3torch cold | x s3torch warm |"
)


def _row(cell: Cell, result: ConfigResult) -> str:
    split = "" if result.config in (S3TORCH, S3TORCH_GATEWAY) else str(result.split)
    return (
        f"| {cell.model} | {cell.bandwidth} | {cell.load} | {result.config} | {split} "
        f"| {result.cold_s:.2f} | {result.warm_s:.2f} | {result.samples_per_s:.1f} "
        f"| {result.link_bytes_per_sample() / 1000:.1f} "
        f"| {result.client_cpu_per_sample() * 1000:.1f} "
        f"| {result.storage_cpu_per_sample() * 1000:.1f} | {result.accuracy:.2f} "
        f"| {cell.speedup(result.config):.2f} | {cell.speedup(result.config, warm=True):.2f} |"
    )


def table(cells: Sequence[Cell]) -> str:
    """Every configuration of every cell, one row each."""
    lines = [HEADER, _rule()]
    for cell in cells:
        lines += [_row(cell, cell.config(name)) for name in CONFIGS]
    return "\n".join(lines)


def _rule() -> str:
    return "|" + "---|" * (HEADER.count("|") - 1)


def link_bound(cell: Cell) -> bool:
    """Whether the link, not compute, bounds the contender in ``cell``: its bytes at the
    cell's rate take at least 80% of its epoch."""
    if cell.bandwidth_bps is None:
        return False
    theirs = cell.config(S3TORCH)
    link_s = theirs.link_bytes_per_sample() * theirs.epochs[0].samples * 8 / cell.bandwidth_bps
    return link_s >= 0.8 * theirs.warm_s


def goals(cell: Cell) -> list[str]:
    """The issue's goals in ``cell``, each met or missed, in words."""
    cold = cell.speedup(HAPI)
    out = [
        f"hapi {cold:.2f}x the contender ({'met' if cold >= SLOWER_LIMIT else 'MISSED'}: >= 0.95)"
    ]
    if link_bound(cell):
        met = "met" if cold >= LINK_BOUND_GOAL else "MISSED"
        out.append(f"link-bound: {met} (>= {LINK_BOUND_GOAL:g}x)")
    warm = cell.speedup(HAPI_CACHE, warm=True)
    out.append(f"cache warm {warm:.1f}x ({'met' if warm >= WARM_GOAL else 'MISSED'}: >= 10x)")
    return out


def goals_text(cells: Sequence[Cell]) -> str:
    """One line per cell: the goals, the split and why, the same-samples check."""
    lines = []
    for cell in cells:
        same = (
            "same samples" if cell.same_samples is None else f"SAMPLES DIFFER: {cell.same_samples}"
        )
        reason = cell.config(HAPI).split_reason
        lines.append(
            f"- {cell.model}, {cell.bandwidth}, {cell.load}: {'; '.join(goals(cell))}; "
            f"{same}; split {cell.hapi_split} ({reason})"
        )
    return "\n".join(lines)


def _costs(result: ConfigResult, serve_s: float | None = None) -> model.PathCosts:
    storage = result.storage_cpu_per_sample()
    serve = storage if serve_s is None else min(serve_s, storage)
    return model.PathCosts(
        link_bytes=result.link_bytes_per_sample(),
        client_s=result.client_cpu_per_sample(),
        serve_s=serve,
        compute_s=storage - serve,
    )


def path_costs(cell: Cell) -> dict[str, model.PathCosts]:
    """Per-sample costs of each path in ``cell`` (warm epochs): the contender from the
    store, raw objects through the gateway, hapi's split (serving as the pass-through
    costs, the rest decoding and blocks) and the warm cache."""
    passthrough = cell.config(S3TORCH_GATEWAY).storage_cpu_per_sample()
    return {
        S3TORCH: _costs(cell.config(S3TORCH)),
        S3TORCH_GATEWAY: _costs(cell.config(S3TORCH_GATEWAY)),
        HAPI: _costs(cell.config(HAPI), serve_s=passthrough),
        HAPI_CACHE: _costs(cell.config(HAPI_CACHE)),
    }


def _quiet_twin(cells: Sequence[Cell], cell: Cell) -> Cell:
    for other in cells:
        if (other.model, other.bandwidth, other.load) == (cell.model, cell.bandwidth, QUIET):
            return other
    return cell


def measured_cells(cells: Sequence[Cell]) -> list[model.MeasuredCell]:
    """Every measured epoch series, with the per-sample costs of its quiet twin (the same
    model and bandwidth) and, when loaded, the second job's measured demand."""
    out = []
    for cell in cells:
        costs = path_costs(_quiet_twin(cells, cell))
        background = model.Background(link_bps=cell.background[0], storage_cores=cell.background[1])
        for name in CONFIGS:
            result = cell.config(name)
            warm = name == HAPI_CACHE
            out.append(
                model.MeasuredCell(
                    label=f"{cell.model} {cell.bandwidth} {cell.load} {name}",
                    costs=costs[name],
                    samples=result.epochs[0].samples,
                    bandwidth_bps=cell.bandwidth_bps,
                    epoch_s=result.warm_s if warm else result.cold_s,
                    background=background,
                    batches=-(-result.epochs[0].samples // cell.batch_size),
                )
            )
    return out


def reference_cell(cells: Sequence[Cell], name: str) -> Cell | None:
    """The quiet cell of model ``name`` at the fastest link measured (unshaped first)."""
    quiet = [c for c in cells if c.model == name and c.load == QUIET]
    if not quiet:
        return None
    return max(quiet, key=lambda c: float("inf") if c.bandwidth_bps is None else c.bandwidth_bps)


def _nodes(name: str, device: dict[str, Any] | None) -> tuple[model.StorageNode, ...]:
    if device is None or name not in device.get("models", {}):
        return (model.CPU_NODE, model.GPU_NODE)
    return (model.CPU_NODE, model.gpu_node_from_device(device, name))


def projection_text(cells: Sequence[Cell], device: dict[str, Any] | None = None) -> str:
    """The projection table per model, and the model's check against every cell;
    ``device``: ``make bench-device``'s results, whose blocks rate replaces the published
    one where they hold the model."""
    gpu = sorted({node.source for c in cells for node in _nodes(c.model, device)[1:]})
    lines = [
        "Epoch of ImageNet-1k (1,281,167 samples) read by N clients sharing one storage node; "
        "per-sample costs from each model's quiet cell at the fastest link measured. "
        f"GPU node: {'; '.join(gpu)}. hapi: the faster of its split and raw objects "
        "(the planner's choice); warm: the feature cache.",
        "",
        "| model | node | link | N | s3torch s | hapi s | hapi warm s | x | bottlenecks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(c.model for c in cells):
        ref = reference_cell(cells, name)
        if ref is None:
            continue
        costs = path_costs(ref)
        for row in model.project(
            name,
            costs[S3TORCH],
            [costs[HAPI], costs[S3TORCH_GATEWAY]],
            warm=costs[HAPI_CACHE],
            nodes=_nodes(name, device),
        ):
            warm = "" if row.hapi_warm_s is None else f"{row.hapi_warm_s:.0f}"
            lines.append(
                f"| {row.model} | {row.node} | {row.bandwidth_bps / 1e9:g} Gbit/s | {row.clients} "
                f"| {row.contender_s:.0f} | {row.hapi_s:.0f} | {warm} | {row.speedup:.2f} "
                f"| {row.bottlenecks[0]} / {row.bottlenecks[1]} |"
            )
    deviations = model.check(measured_cells(cells))
    median, worst = model.summary(deviations)
    lines += [
        "",
        f"The model against every measured cell ({len(deviations)} epoch series, one client, "
        f"the testbed's one storage core): median error {median:.0%}, largest {worst:.0%}.",
        "",
        "| cell | measured s | model s | error |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {d.label} | {d.measured_s:.2f} | {d.predicted_s:.2f} | {d.error:+.0%} |"
        for d in deviations
    ]
    return "\n".join(lines)


READING = (
    "Cold: epoch 1; warm: the median of epochs 2 onward (each configuration trains one head "
    "through its epochs, scored on held-out objects after them). KB/sample: bytes over the "
    "link. Client CPU: the training process and its DataLoader workers; storage CPU: the "
    "store and both gateways. In a loaded cell the link's bytes and the storage CPU include "
    "the second job's share. "
    "x s3torch: s3torchconnector's epoch time (from the store) over this configuration's."
)


def weights_text(weights: dict[str, str] | None) -> str:
    """Where each model's weights came from, and what a random network's accuracy means:
    nothing about its features (torchvision's families get seeded random weights where no
    real ones can be had offline), only that every loader trained its head alike. Empty
    for a report of a run that did not record them."""
    if not weights:
        return ""
    said = "; ".join(f"{model}: {origin}" for model, origin in weights.items())
    random = [model for model, origin in weights.items() if origin.startswith("random")]
    if not random:
        return f" Weights: {said}."
    one = len(random) == 1
    return (
        f" Weights: {said}. {', '.join(random)} {'runs' if one else 'run'} with random "
        f"weights, whose features tell the classes apart barely: {'its' if one else 'their'}"
        " accuracy says only that every loader fed the head alike, not what pushdown costs it."
    )


def render(
    cells: Sequence[Cell], meta: dict[str, Any], device: dict[str, Any] | None = None
) -> str:
    """The whole report (``device``: ``make bench-device``'s results, if any)."""
    return (
        "\n\n".join(
            [
                "# Head to head: s3torchconnector and hapi",
                str(meta.get("description", "")),
                READING + weights_text(meta.get("weights")),
                table(cells),
                "## Goals, split and same samples\n\n" + goals_text(cells),
                "## Past this machine, on paper\n\n" + projection_text(cells, device),
            ]
        )
        + "\n"
    )


def write_markdown(
    path: Path, cells: Sequence[Cell], meta: dict[str, Any], device: dict[str, Any] | None = None
) -> Path:
    """Write :func:`render` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(cells, meta, device))
    return path
