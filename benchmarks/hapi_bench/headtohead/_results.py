"""The head-to-head's results: epochs, configurations, cells; JSON in and out."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._loaders import HAPI, S3TORCH

QUIET, LOADED = "quiet", "loaded"


@dataclass(frozen=True, kw_only=True)
class Epoch:
    """One measured epoch of one configuration."""

    epoch: int
    epoch_s: float
    samples: int
    link_bytes: int
    client_cpu_s: float
    storage_cpu_s: float
    # What the shaped link did to the storage side's frames in the epoch: the frames its
    # queue dropped, and the storage namespace's TCP retransmission timeouts (a GET that
    # lost its last frames waits one out, at least 200 ms). Absent in older results.
    dropped_frames: int = 0
    retransmission_timeouts: int = 0


@dataclass(frozen=True, kw_only=True)
class ConfigResult:
    """One configuration in one cell: its epochs (one head trained through them all) and
    the head's held-out accuracy after the last. ``plan``: the planner's last plan for
    hapi's split (candidates and the profile they were priced on), when it planned."""

    config: str
    epochs: tuple[Epoch, ...]
    accuracy: float
    split: int | None = None
    split_reason: str = ""
    plan: dict[str, Any] | None = None

    @property
    def cold_s(self) -> float:
        """The first epoch's seconds."""
        return self.epochs[0].epoch_s

    @property
    def warm_s(self) -> float:
        """The median of epochs 2 onward (the first epoch's, with one epoch)."""
        later = [e.epoch_s for e in self.epochs[1:]] or [self.cold_s]
        return statistics.median(later)

    @property
    def samples_per_s(self) -> float:
        """Samples per second of the warm epochs."""
        return self.epochs[0].samples / self.warm_s

    def _per_sample(self, field: str, warm: bool) -> float:
        chosen = self.epochs[1:] if warm and len(self.epochs) > 1 else self.epochs[:1]
        total = sum(float(getattr(e, field)) for e in chosen)
        return total / sum(e.samples for e in chosen)

    def link_bytes_per_sample(self, warm: bool = True) -> float:
        """Bytes over the link per sample (warm epochs, or the first)."""
        return self._per_sample("link_bytes", warm)

    def client_cpu_per_sample(self, warm: bool = True) -> float:
        """Client CPU seconds per sample (this process and its DataLoader workers)."""
        return self._per_sample("client_cpu_s", warm)

    def storage_cpu_per_sample(self, warm: bool = True) -> float:
        """Storage tier CPU seconds per sample (store and gateways; in a loaded cell,
        the second job's share too)."""
        return self._per_sample("storage_cpu_s", warm)


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One model at one bandwidth, quiet or loaded: every configuration, interleaved.

    ``same_samples`` is ``None`` when every loader produced the contender's samples in
    its order (labels equal, features within tolerance), else what differed.
    ``background`` is what the second job alone asked of the link (bits/s) and of the
    storage core (cores busy), measured before the cell; zeros when quiet.
    """

    model: str
    bandwidth: str
    bandwidth_bps: float | None
    load: str
    samples: int
    batch_size: int
    configs: tuple[ConfigResult, ...]
    same_samples: str | None
    background: tuple[float, float] = (0.0, 0.0)

    def config(self, name: str) -> ConfigResult:
        """The result of configuration ``name``.

        Raises:
            KeyError: The cell did not run it.
        """
        for result in self.configs:
            if result.config == name:
                return result
        raise KeyError(name)

    def speedup(self, name: str, warm: bool = False) -> float:
        """The contender's (s3torchconnector from the store) epoch time over ``name``'s
        (cold epochs, or warm ones)."""
        theirs, ours = self.config(S3TORCH), self.config(name)
        return (theirs.warm_s / ours.warm_s) if warm else (theirs.cold_s / ours.cold_s)

    @property
    def hapi_split(self) -> int | None:
        """The planner's pick for hapi's cells."""
        return self.config(HAPI).split


def cell_to_dict(cell: Cell) -> dict[str, Any]:
    """A cell as JSON-ready data."""
    return asdict(cell)


def cell_from_dict(data: dict[str, Any]) -> Cell:
    """The inverse of :func:`cell_to_dict`."""
    configs = tuple(
        ConfigResult(
            **{k: v for k, v in c.items() if k != "epochs"},
            epochs=tuple(Epoch(**e) for e in c["epochs"]),
        )
        for c in data["configs"]
    )
    fields = {k: v for k, v in data.items() if k not in ("configs", "background")}
    link_bps, storage_cores = data.get("background", (0.0, 0.0))
    return Cell(**fields, configs=configs, background=(link_bps, storage_cores))


def write_json(path: Path, cells: Sequence[Cell], meta: dict[str, Any]) -> Path:
    """``{"meta": ..., "cells": [...]}`` at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "cells": [cell_to_dict(c) for c in cells]}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def read_json(path: Path) -> tuple[list[Cell], dict[str, Any]]:
    """The cells and metadata :func:`write_json` wrote."""
    data = json.loads(path.read_text())
    return [cell_from_dict(c) for c in data["cells"]], data["meta"]
