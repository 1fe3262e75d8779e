"""Synthetic results for the report and plot tests."""

from __future__ import annotations

from hapi_bench.reports._results import CellResult, RunResult


def run(split: int | None, epoch_s: float, **fields: object) -> RunResult:
    """A measured run of 100 samples in 25 batches; stages default to a client-bound
    pipeline."""
    values: dict[str, object] = {
        "split": split,
        "loader": "raw" if split is None else "sdk",
        "epoch_s": epoch_s,
        "samples": 100,
        "link_bytes": 100 * (30_000 if split is None else 2_000),
        "payload_bytes": 100 * (29_000 if split is None else 1_900),
        "client_cpu_s": epoch_s,
        "storage_cpu_s": epoch_s / 2,
        "link_s": epoch_s / 4,
        "batches": 25,
    }
    values.update(fields)
    return RunResult(**values)  # type: ignore[arg-type]


def cell(regime: str, pick: int | None, runs: list[RunResult], **fields: object) -> CellResult:
    values: dict[str, object] = {
        "model": "resnet18",
        "freeze": 10,
        "regime": regime,
        "ratio": 4.0,
        "measured_ratio": 3.9,
        "bandwidth_bps": 2e6,
        "probed_bps": 1.9e6,
        "client_rate": 20.0,
        "raw_bytes": 30_000.0,
        "batch_size": 4,
        "pick": pick,
        "pick_reason": "synthetic",
        "wire_bytes": (602_112, *([200_000] * 9), 2_048),
        "runs": tuple(runs),
    }
    values.update(fields)
    return CellResult(**values)  # type: ignore[arg-type]


CLI_OPTIONS: dict[str, object] = {
    "models": None,
    "regimes": None,
    "seconds": None,
    "splits": None,
    "storage_batch": None,
    "storage_competitor": False,
    "storage_device": None,
    "nice": None,
    "full_sweep": False,
}
"""``hapi bench``'s options as click passes them when none is given."""
