"""Where each sample of an epoch goes: the epoch's order, the deal to ranks and DataLoader
workers, the shuffle buffer, and what is left of an epoch when a job stopped part way.

Everything here is a pure function of small values (seed, epoch, sample counts, layouts and
counts of samples delivered), so every rank and worker computes the same answers without
talking to the others, and a saved position of a few integers rebuilds where an epoch stood.

- **The epoch's order** is the dataset's objects (shards) in a seeded permutation per
  epoch, each shard's samples in member order: one sequence of sample ids that depends on
  the seed and the epoch only, never on the number of ranks or workers.
- **The deal.** The sequence is padded (repeating its first samples) or cut to a multiple
  of the number of ranks, so every rank gets the same count; rank ``r`` takes the ``r``-th
  contiguous span, and its workers contiguous parts of that (whole batches each, when the
  batch size is known). Contiguous spans keep a shard's samples with one consumer, so a
  shard crosses the network once, or twice where a span boundary cuts it.
- **The shuffle buffer.** A consumer delivers its span through a seeded buffer of
  ``buffer`` samples (shards only: objects are permuted globally already), simulated on
  positions, so the order is known before any sample arrives and is replayed exactly.
- **Passes.** A pass is one layout (ranks, workers, batch size, ...) and the count each
  worker delivered (the same on every rank: DDP ranks step together). The samples a pass
  did not deliver, in epoch order, are the input of the next pass, dealt afresh to the
  next layout: that is how a job resumes on another number of ranks, each sample once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Ids = np.ndarray  # int64 sample ids


@dataclass(frozen=True)
class Layout:
    """How a pass deals its samples.

    Args:
        ranks: DDP ranks.
        workers: DataLoader workers per rank (1 without workers).
        batch_size: The DataLoader's batch size, when the dataset was told it: a worker's
            part is then whole batches, and a rank yields one partial batch at most.
        drop_last: Cut the samples to a multiple of ``ranks`` instead of padding.
        buffer: Shuffle-buffer size in samples (0: deliver in order).
    """

    ranks: int
    workers: int
    batch_size: int | None
    drop_last: bool
    buffer: int

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.workers < 1:
            raise ValueError(f"a layout needs ranks and workers >= 1, not {self}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size}")

    def dealt(self, available: int) -> int:
        """How many samples the pass deals out of ``available``: a multiple of ``ranks``."""
        whole = available // self.ranks * self.ranks
        if self.drop_last or whole == available:
            return whole
        return whole + self.ranks

    def span(self, available: int, rank: int, worker: int) -> tuple[int, int]:
        """The positions ``[start, stop)`` of the pass's (padded) sequence that go to
        ``worker`` of ``rank``."""
        per_rank = self.dealt(available) // self.ranks
        first = rank * per_rank
        if self.batch_size is None:
            sizes = _even(per_rank, self.workers)
        else:
            batches = _even(-(-per_rank // self.batch_size), self.workers)
            sizes = [b * self.batch_size for b in batches]
        start = min(per_rank, sum(sizes[:worker]))
        stop = min(per_rank, start + sizes[worker])
        return first + start, first + stop


@dataclass(frozen=True)
class Pass:
    """One layout's part of an epoch: ``emitted[w]`` samples delivered by worker ``w`` of
    every rank."""

    layout: Layout
    emitted: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.emitted) != self.layout.workers or min(self.emitted, default=0) < 0:
            raise ValueError(f"a pass needs a count >= 0 per worker, not {self}")


def _even(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def epoch_order(counts: Sequence[int], *, shuffle: bool, seed: int, epoch: int) -> Ids:
    """The epoch's sample ids: objects (``counts``: samples per object) in a seeded
    permutation of ``(seed, epoch)`` when shuffling, each object's samples in order."""
    units = list(range(len(counts)))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(units)  # the order hapi always used
    sizes = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    order = np.asarray(units, dtype=np.int64)
    lengths = sizes[order]
    if not lengths.sum():
        return np.zeros(0, dtype=np.int64)
    first = np.repeat(starts[order], lengths)
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    ids: Ids = (first + within).astype(np.int64)
    return ids


def take(sequence: Ids, start: int, stop: int) -> tuple[Ids, np.ndarray]:
    """Positions ``[start, stop)`` of ``sequence`` padded by repeating it from its start:
    the sample ids, and which of them are padding."""
    positions = np.arange(start, stop, dtype=np.int64)
    if not len(sequence):
        return positions[:0], np.zeros(0, dtype=bool)
    padded = positions >= len(sequence)
    return sequence[positions % len(sequence)], padded


def emission_order(length: int, buffer: int, key: str) -> np.ndarray:
    """The order in which a consumer delivers the ``length`` samples of its span, as
    positions in the span: in order without a buffer; else through a shuffle buffer of
    ``buffer`` samples (each delivery a seeded uniform pick from what the buffer holds,
    refilled in span order), so a sample waits for at most ``buffer`` arrivals after it."""
    if buffer <= 1 or length <= 1:
        return np.arange(length, dtype=np.int64)
    rng = random.Random(key)
    held: list[int] = []
    out: list[int] = []
    for position in range(length):
        held.append(position)
        if len(held) >= buffer:
            out.append(_pick(held, rng))
    while held:
        out.append(_pick(held, rng))
    return np.asarray(out, dtype=np.int64)


def _pick(held: list[int], rng: random.Random) -> int:
    index = rng.randrange(len(held))
    chosen = held[index]
    held[index] = held[-1]
    held.pop()
    return chosen


def consumer_key(seed: int, epoch: int, index: int, rank: int, worker: int) -> str:
    """Seeds the shuffle buffer of one consumer of pass ``index`` of an epoch."""
    return f"{seed}:{epoch}:{index}:{rank}:{worker}"


def left_after(sequence: Ids, done: Pass, *, seed: int, epoch: int, index: int) -> Ids:
    """The ids of ``sequence`` (pass ``index``'s input) that the pass did not deliver, in
    the order of ``sequence`` (padding delivered is not a sample of it).

    Raises:
        ValueError: A worker delivered more than its part holds.
    """
    layout = done.layout
    delivered = np.zeros(len(sequence), dtype=bool)
    for rank in range(layout.ranks):
        for worker in range(layout.workers):
            start, stop = layout.span(len(sequence), rank, worker)
            count = done.emitted[worker]
            if count > stop - start:
                raise ValueError(
                    f"worker {worker} delivered {count} samples of a part of {stop - start}"
                )
            key = consumer_key(seed, epoch, index, rank, worker)
            order = emission_order(stop - start, layout.buffer, key)
            positions = start + order[:count]
            delivered[positions[positions < len(sequence)]] = True
    return sequence[~delivered]


def pass_input(order: Ids, done: Sequence[Pass], *, seed: int, epoch: int) -> Ids:
    """The input of the pass after ``done``: what the epoch's ``order`` has left."""
    sequence = order
    for index, finished in enumerate(done):
        sequence = left_after(sequence, finished, seed=seed, epoch=epoch, index=index)
    return sequence


def owners(ids: Ids, counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each sample id's object index and its sample index within that object."""
    starts = np.concatenate(([0], np.cumsum(np.asarray(counts, dtype=np.int64))))
    unit = np.searchsorted(starts, ids, side="right") - 1
    return unit, ids - starts[unit]
