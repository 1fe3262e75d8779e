"""What a head-to-head run does: an immutable value built once from the command line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hapi.models.testing import FAMILIES
from hapi.protocol import ENCODINGS

from ._results import LOADED, QUIET

BANDWIDTHS: dict[str, float | None] = {
    "5mbit": 5e6,
    "10mbit": 10e6,
    "100mbit": 100e6,
    "1gbit": 1e9,
    "unshaped": None,
}
"""The link's rate per cell (``None``: the veth unshaped, at memory speed). ``5mbit`` (one
client's share of a 1 Gbit/s uplink with 200 of them) is there to be asked for: on the
testbed it is where the contender is bound by the link well beyond the storage node's
one core; the default cells are the four of :data:`DEFAULT_BANDWIDTHS`."""
DEFAULT_BANDWIDTHS = ("10mbit", "100mbit", "1gbit", "unshaped")
LOADS = (QUIET, LOADED)
MODELS = ("resnet18", "efficientnet_lite0")


@dataclass(frozen=True, kw_only=True)
class HeadToHeadConfig:
    """A head-to-head run.

    Args:
        out: The results directory.
        models: Model families, at their default freeze points.
        bandwidths: Names of :data:`BANDWIDTHS`.
        loads: ``quiet`` and/or ``loaded`` (a second training job on the storage node).
        samples: Training objects (one epoch reads each once).
        held_out: Objects the head is scored on after the epochs (never trained on).
        epochs: Epochs of each configuration per cell (one head through them all).
        batch_size: Training batch, for every loader.
        workers: DataLoader workers, for every loader.
        prefetch_factor: Batches each worker keeps ahead.
        seed: Dataset, sampler and head seed.
        niceness: Scheduling niceness of both tiers.
        cache_split: The split of the cached configuration: ``freeze`` (the features the
            head trains on, kept whole by the cache) or ``auto`` (the planner's pick,
            which prices a cold epoch).
        dtype: hapi's wire dtype, ``float32`` or ``float16`` (half the bytes a sample on
            the link; the held-out accuracy says what it costs the head).
        encoding: hapi's answers' encoding, ``zeros`` (the SDK's default: without their
            zero words) or ``dense``.
    """

    out: Path
    models: tuple[str, ...] = MODELS
    bandwidths: tuple[str, ...] = DEFAULT_BANDWIDTHS
    loads: tuple[str, ...] = LOADS
    samples: int = 192
    held_out: int = 64
    epochs: int = 3
    batch_size: int = 16
    workers: int = 2
    prefetch_factor: int = 4
    seed: int = 0
    niceness: int = 0
    cache_split: str = "freeze"
    dtype: str = "float32"
    encoding: str = "zeros"

    def __post_init__(self) -> None:
        unknown = [m for m in self.models if m not in FAMILIES]
        if unknown or not self.models:
            raise ValueError(f"unknown model {', '.join(unknown) or '(none)'}")
        bad = [b for b in self.bandwidths if b not in BANDWIDTHS]
        if bad or not self.bandwidths:
            raise ValueError(
                f"unknown bandwidth {', '.join(bad) or '(none)'}; known: {', '.join(BANDWIDTHS)}"
            )
        if not self.loads or any(load not in LOADS for load in self.loads):
            raise ValueError(f"loads must be among {', '.join(LOADS)}")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be float32 or float16, not {self.dtype!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(
                f"encoding must be one of {', '.join(ENCODINGS)}, not {self.encoding!r}"
            )
        if self.cache_split not in ("freeze", "auto"):
            raise ValueError(f"cache_split must be freeze or auto, not {self.cache_split!r}")
        if self.samples < self.batch_size or self.held_out < 4 or self.epochs < 2:
            raise ValueError("need samples >= batch_size, held_out >= 4 and epochs >= 2")

    @classmethod
    def quick(cls, out: Path) -> HeadToHeadConfig:
        """One model, the slowest link and none, quiet and loaded, short epochs."""
        return cls(
            out=out,
            models=("resnet18",),
            bandwidths=("10mbit", "unshaped"),
            samples=48,
            held_out=16,
            epochs=2,
            batch_size=8,
        )
