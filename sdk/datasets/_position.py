"""The saved position of an :class:`IterableFeatureDataset` epoch: what its ``state_dict``
holds, and how states are checked and put together again.

A state is a small dict of plain values (JSON could hold it)::

    {"kind": "hapi.sdk.IterableFeatureDataset", "version": 1,
     "dataset": {"objects": "s3://data/train/", "listing": "5d41402abc4b2a76", "samples": 12,
                 "model": "r18@1", "freeze": 6, "split": "auto", "shuffle": true, "seed": 0},
     "epoch": 3,
     "passes": [],                        # earlier layouts of this epoch, see _order.Pass
     "layout": {"ranks": 2, "workers": 2, "batch_size": 8, "drop_last": false, "buffer": 0},
     "worker": 1, "emitted": 16,          # this worker's samples delivered in the pass
     "split_in_use": 6}                   # the split this worker was reading (None: raw)

Each DataLoader worker saves its own (torchdata's ``StatefulDataLoader`` keeps, for each
worker, the state that came with the last batch the training loop took, so batches
prefetched and not taken are not counted). One worker's state continues that worker in the
same layout; a new layout needs every worker's count, which only the loader's whole state
holds: :func:`combine` finds them in it. With ``split="auto"`` a resumed pass continues at
the split in use when the state was saved (:func:`split_in_use`), not at the one a new
build plans: the rest of the epoch's features are computed as the job computed them, and
the local cache's entries, which are the split's, are found. A state without it (saved by
an earlier release) continues at the new build's plan.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..client._errors import StateMismatch
from ._order import Layout, Pass

KIND = "hapi.sdk.IterableFeatureDataset"
VERSION = 1
SPLIT_IN_USE = "split_in_use"


@dataclass(frozen=True)
class Identity:
    """What a saved position depends on: a state is refused by a dataset whose identity
    differs (the error says how).

    Args:
        objects: Where the objects are (``s3://bucket/prefix/``, or a count of named
            objects).
        listing: A digest of the keys in dataset order (and a shard's sample count).
        samples: The epoch's samples.
        model: ``NAME@VERSION``.
        freeze: The freeze point.
        split: ``"auto"`` when the planner chooses, else the split asked for.
        shuffle: Whether epochs are shuffled.
        seed: The shuffle seed (and the views').
        augment: The augmentation policy's spec and views kept (``""``: none).
    """

    objects: str
    listing: str
    samples: int
    model: str
    freeze: int
    split: str | int | None
    shuffle: bool
    seed: int
    augment: str = ""

    def refusal(self, saved: Identity) -> str | None:
        """Why a state saved with ``saved`` cannot continue here; ``None`` when it can."""
        if saved == self:
            return None
        changed = [
            f"{name} {getattr(saved, name)!r} (now {getattr(self, name)!r})"
            for name in ("objects", "model", "freeze", "split", "shuffle", "seed", "augment")
            if getattr(saved, name) != getattr(self, name)
        ]
        if changed:
            return "the state was saved from another dataset: " + ", ".join(changed)
        return (
            f"the objects of {self.objects} changed since the state was saved "
            f"({saved.samples} samples then, {self.samples} now): its epoch's positions "
            "belong to the listing it was saved with. Start the next epoch without the "
            "state, or build the dataset from the same objects"
        )


def listing_digest(keys: Sequence[str], counts: Sequence[int] | None) -> str:
    """A digest of the keys in order (with each shard's sample count)."""
    digest = hashlib.sha256()
    for index, key in enumerate(keys):
        count = "" if counts is None else str(counts[index])
        digest.update(f"{key}\t{count}\n".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Position:
    """Where an epoch stands: the passes done, and the current pass's layout with the
    count delivered by each worker whose state is known.

    Args:
        identity: The dataset it belongs to.
        epoch: The epoch.
        done: Earlier passes of the epoch (each in another layout).
        layout: The current pass's layout.
        emitted: Samples delivered by worker index (every worker's, or one's).
    """

    identity: Identity
    epoch: int
    done: tuple[Pass, ...]
    layout: Layout
    emitted: Mapping[int, int] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether every worker's count is known (a new layout can take over)."""
        return set(self.emitted) == set(range(self.layout.workers))

    def finished(self) -> Pass:
        """The current pass, closed: the next layout deals what it left."""
        return Pass(self.layout, tuple(self.emitted[w] for w in range(self.layout.workers)))

    def same_pass(self, other: Position) -> bool:
        return (self.identity, self.epoch, self.done, self.layout) == (
            other.identity,
            other.epoch,
            other.done,
            other.layout,
        )

    def continued(self, layout: Layout, worker: int) -> tuple[Position, int]:
        """The pass that ``worker`` runs in ``layout`` from here, and the samples it has
        delivered in it already: its own pass, continued, in the same layout; else a new
        pass that deals what this one left (which needs every worker's count).

        Raises:
            StateMismatch: Another layout, and not every worker's count is known.
        """
        if layout == self.layout and worker in self.emitted:
            return replace(self, emitted={}), self.emitted[worker]
        if not self.complete:
            raise StateMismatch(
                f"the state holds the position of worker {sorted(self.emitted)} of "
                f"{_describe(self.layout)}; continuing it on {_describe(layout)} needs "
                "every worker's: load the loader's whole state_dict() into the dataset "
                "(dataset.load_state_dict(state)) before the loader iterates"
            )
        return Position(self.identity, self.epoch, (*self.done, self.finished()), layout), 0

    def state(self, worker: int) -> dict[str, Any]:
        """The state of ``worker``."""
        return {
            "kind": KIND,
            "version": VERSION,
            "dataset": asdict(self.identity),
            "epoch": self.epoch,
            "passes": [{**asdict(p.layout), "emitted": list(p.emitted)} for p in self.done],
            "layout": asdict(self.layout),
            "worker": worker,
            "emitted": self.emitted.get(worker, 0),
        }


def parse(state: Mapping[str, Any]) -> Position:
    """One worker's state as a :class:`Position` holding its count.

    Raises:
        StateMismatch: Not a state of this version.
    """
    if state.get("kind") != KIND or state.get("version") != VERSION:
        raise StateMismatch(
            f"not a state of this version of {KIND} "
            f"(kind {state.get('kind')!r}, version {state.get('version')!r})"
        )
    try:
        done = tuple(
            Pass(
                _layout({k: v for k, v in p.items() if k != "emitted"}),
                tuple(int(n) for n in p["emitted"]),
            )
            for p in state["passes"]
        )
        return Position(
            Identity(**state["dataset"]),
            int(state["epoch"]),
            done,
            _layout(state["layout"]),
            {int(state["worker"]): int(state["emitted"])},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StateMismatch(f"an unreadable {KIND} state ({exc!r})") from exc


def split_in_use(states: Sequence[Mapping[str, Any]], freeze: int) -> tuple[bool, int | None]:
    """Whether the first of ``states`` records the split its worker was reading, and that
    split (``None``: raw objects).

    Raises:
        StateMismatch: A split that is neither ``None`` nor one of ``0..freeze``.
    """
    if not states or SPLIT_IN_USE not in states[0]:
        return False, None
    split = states[0][SPLIT_IN_USE]
    if split is not None and (type(split) is not int or not 0 <= split <= freeze):
        raise StateMismatch(
            f"an unreadable {KIND} state: {SPLIT_IN_USE} is {split!r}, not null or a split "
            f"in 0..{freeze}"
        )
    return True, split


def _describe(layout: Layout) -> str:
    batches = "" if layout.batch_size is None else f", batch_size={layout.batch_size}"
    return (
        f"{layout.ranks} rank(s) x {layout.workers} worker(s) (drop_last={layout.drop_last}, "
        f"shuffle buffer {layout.buffer}{batches})"
    )


def _layout(fields: Mapping[str, Any]) -> Layout:
    return Layout(**{name: fields[name] for name in Layout.__dataclass_fields__})


def find_states(found: Any) -> list[Mapping[str, Any]]:
    """The dataset states inside ``found``: a state itself, or anything holding states,
    such as a ``StatefulDataLoader``'s ``state_dict()``."""
    if isinstance(found, Mapping):
        if found.get("kind") == KIND:
            return [found]
        return [state for value in found.values() for state in find_states(value)]
    if isinstance(found, list | tuple):
        return [state for value in found for state in find_states(value)]
    return []


def combine(states: Iterable[Mapping[str, Any]], identity: Identity) -> Position:
    """One position from the states of a rank's workers (one state: one worker's).

    Raises:
        StateMismatch: No state, a state of another dataset (saying what differs), or
            states of different passes.
    """
    positions = [parse(state) for state in states]
    if not positions:
        raise StateMismatch(f"no {KIND} state found in what was given")
    for position in positions:
        refusal = identity.refusal(position.identity)
        if refusal is not None:
            raise StateMismatch(refusal)
    first = positions[0]
    emitted: dict[int, int] = {}
    for position in positions:
        if not position.same_pass(first):
            raise StateMismatch("the states given belong to different epochs or passes")
        for worker, count in position.emitted.items():
            if emitted.setdefault(worker, count) != count:
                raise StateMismatch(
                    f"two states of worker {worker} disagree ({emitted[worker]} and "
                    f"{count} samples delivered): give one rank's states"
                )
    return Position(first.identity, first.epoch, first.done, first.layout, emitted)
