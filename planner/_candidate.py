"""One candidate split of a plan: its stage times, memory and epoch time."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

Stage = Literal["storage", "transfer", "client", "turns"]


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One row of a plan. Stage times are milliseconds per training batch.

    Args:
        split: ``None`` for no pushdown, else ``0..freeze``.
        bytes_per_sample: What one sample sends over the network.
        storage_ms: The storage stage (decode and blocks ``[0, split)``, under load).
        transfer_ms: The network stage.
        client_ms: The client stage (decode without pushdown, blocks ``[split, freeze)``,
            the head's training step).
        bottleneck: The slowest stage, or ``turns`` when readers in turn
            (``Profile.readers_in_turn``) bound the cycle above every stage.
        epoch_s: Predicted epoch time in seconds (``inf`` when infeasible).
        storage_memory_bytes: Memory the storage side needs.
        client_memory_bytes: Memory the client needs.
        infeasible: Why the candidate does not fit, or ``None`` when it does.
        cycle_ms: Time per batch in the steady state: the slowest stage, or, with shared
            compute, ``max(storage + client, transfer)``; with ``r`` readers in turn, at
            least ``(storage + transfer + client) / r``.
    """

    split: int | None
    bytes_per_sample: float
    storage_ms: float
    transfer_ms: float
    client_ms: float
    bottleneck: Stage
    epoch_s: float
    storage_memory_bytes: int
    client_memory_bytes: int
    infeasible: str | None = None
    cycle_ms: float = 0.0

    @property
    def feasible(self) -> bool:
        """Whether both sides' memory holds this candidate."""
        return self.infeasible is None

    @property
    def bottleneck_ms(self) -> float:
        """Time per batch in the steady state (the slowest stage, unless compute is shared)."""
        return max(self.cycle_ms, self.storage_ms, self.transfer_ms, self.client_ms)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, ``feasible`` included (``inf`` becomes ``None``)."""
        data = asdict(self)
        data["feasible"] = self.feasible
        return {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in data.items()}


def fastest(candidates: list[Candidate]) -> Candidate:
    """The least epoch time; ties to fewer bytes, then to the earlier split."""
    return min(candidates, key=lambda c: (c.epoch_s, c.bytes_per_sample, order(c.split)))


def order(split: int | None) -> int:
    """``None`` (no pushdown) sorts before split 0."""
    return -1 if split is None else split


def split_label(split: int | None) -> str:
    """``none``, ``0``, ``1``... as the table and the CLI write a split."""
    return "none" if split is None else str(split)
