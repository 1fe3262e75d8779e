"""One consumer's pass over an epoch (a DDP rank's DataLoader worker, or the rank itself):
its samples, the order it delivers them in, the requests that fetch them, and how far it
got.

A consumer's part of the epoch is a span of sample ids (see ``_order``). Requests follow
the span's order, each object once per run of its samples, so a shard is fetched whole
and kept for as long as some of its samples wait for their turn; deliveries follow the
emission order (the shuffle buffer's). Delivered samples are counted as they are handed
to the DataLoader, never when fetched: a saved position never skips a sample that was
only prefetched.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..client._errors import UnprocessableObject
from ._compute import Batch
from ._order import Ids, Layout, consumer_key, emission_order, owners, pass_input, take
from ._position import Position


@dataclass(frozen=True)
class Want:
    """An object a request names, and the span positions its rows fill.

    Args:
        key: The object.
        samples: The rows it gives (a shard's sample count; 1 for an image).
        positions: Positions in the span that its rows fill ...
        members: ... from these rows (a shard's sample index).
    """

    key: str
    samples: int
    positions: tuple[int, ...]
    members: tuple[int, ...]


@dataclass(frozen=True)
class Request:
    """Objects fetched together (``request_size`` of them at most, each once)."""

    wants: tuple[Want, ...]

    @property
    def keys(self) -> list[str]:
        return [want.key for want in self.wants]

    def rows(self, batch: Batch, bucket: str) -> Iterator[tuple[int, int, int]]:
        """``(position, row, member)`` for every position the request fills from ``batch``
        (``member``: the row's sample index in its object).

        Raises:
            UnprocessableObject: An object gave another number of rows than it was
                counted with when the dataset was built (it changed since).
        """
        row = 0
        for want in self.wants:
            first = row
            while row < len(batch.objects) and batch.objects[row] == want.key:
                row += 1
            if row - first != want.samples:
                raise UnprocessableObject(
                    "UnprocessableObject",
                    f"has {row - first} samples now and had {want.samples} when the "
                    "dataset was built: build it again",
                    bucket=bucket,
                    key=want.key,
                )
            for position, member in zip(want.positions, want.members, strict=True):
                yield position, first + member, member


@dataclass
class PassPlan:
    """One consumer's pass.

    Args:
        position: The pass: the epoch, the passes done before, the layout.
        worker: This consumer's worker index.
        ids: Its span's sample ids, in span order ...
        padded: ... and which of them repeat a sample to even out the ranks.
        emission: The delivery order (positions in the span).
        start: Deliveries made before this process took over (a resumed pass).
        emitted: Deliveries made so far, ``start`` included.
    """

    position: Position
    worker: int
    ids: Ids
    padded: np.ndarray
    emission: np.ndarray
    start: int
    emitted: int = field(init=False)

    def __post_init__(self) -> None:
        self.emitted = self.start

    @property
    def remaining(self) -> int:
        return len(self.emission) - self.emitted

    @property
    def resumed(self) -> bool:
        return self.start > 0 or bool(self.position.done)

    def state(self) -> dict[str, Any]:
        """The position now, as this worker's state."""
        position = Position(
            self.position.identity,
            self.position.epoch,
            self.position.done,
            self.position.layout,
            {self.worker: self.emitted},
        )
        return position.state(self.worker)

    def requests(self, keys: Sequence[str], counts: Sequence[int], size: int) -> list[Request]:
        """The requests for what is left to deliver, in span order: consecutive samples
        of one object are one want; a request holds ``size`` objects, none twice."""
        left = np.ones(len(self.ids), dtype=bool)
        left[self.emission[: self.start]] = False
        units, members = owners(self.ids, counts)
        runs: list[tuple[int, list[int], list[int]]] = []
        for position in np.flatnonzero(left).tolist():
            unit = int(units[position])
            if not runs or runs[-1][0] != unit:
                runs.append((unit, [], []))
            runs[-1][1].append(position)
            runs[-1][2].append(int(members[position]))
        requests: list[Request] = []
        current: list[Want] = []
        for unit, positions, members_of in runs:
            key = keys[unit]
            if len(current) == size or any(want.key == key for want in current):
                requests.append(Request(tuple(current)))
                current = []
            current.append(Want(key, counts[unit], tuple(positions), tuple(members_of)))
        if current:
            requests.append(Request(tuple(current)))
        return requests


def plan_pass(
    *,
    position: Position,
    start: int,
    rank: int,
    worker: int,
    seed: int,
    epoch_order: Ids,
) -> PassPlan:
    """The pass of ``worker`` of ``rank`` in ``position`` (its ``done`` passes and layout),
    ``start`` deliveries in; ``epoch_order`` is the epoch's order of sample ids.

    Raises:
        ValueError: ``start`` is more than the part holds.
    """
    layout: Layout = position.layout
    sequence = pass_input(epoch_order, position.done, seed=seed, epoch=position.epoch)
    first, stop = layout.span(len(sequence), rank, worker)
    ids, padded = take(sequence, first, stop)
    key = consumer_key(seed, position.epoch, len(position.done), rank, worker)
    emission = emission_order(stop - first, layout.buffer, key)
    if start > len(emission):
        raise ValueError(f"{start} samples delivered of a part of {len(emission)}")
    return PassPlan(position, worker, ids, padded, emission, start)
