"""What the SDK knows of the link to a gateway without probing it.

:class:`LinkEstimate` is the bandwidth the job's own responses achieved: their bytes over
the time they were on the wire (timed where their bodies arrive, with overlapping
responses counted once), the figures the epoch's statistics use. :class:`SpanLog` and
:class:`EpochLog` gather what every process reading for a dataset measured.

:class:`BandwidthMemory` keeps the last figure measured for each endpoint in the user's
cache directory (``$XDG_CACHE_HOME/hapi/bandwidth.json``, else ``~/.cache/hapi/``), with
the time it was measured, so that the next job, in any process, starts from it rather than
from nothing. A figure is trusted for :data:`DEFAULT_LIFETIME_S` (a day: long enough for
a sweep or a nightly retrain, short enough that a link that changed is measured again);
an older one is ignored. The file is replaced atomically (written beside it, then renamed),
so concurrent jobs read either figure, never half of one; a file that is not one of these
is ignored with one warning, and replaced by the next figure measured.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import struct
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("hapi.sdk")

DEFAULT_LIFETIME_S = 24 * 3600.0
FILE_FORMAT = "hapi-bandwidth/1"
_CLOCK_SKEW_S = 60.0  # a figure from a little in the future (another host's clock) counts
SOURCES = ("measured", "remembered", "hint", "sampled", "default")
"""Where a plan's bandwidth came from: measured now (from the job's responses, or an
explicit probe), remembered from an earlier job, an operator's hint (``bandwidth=``,
``HAPI_BANDWIDTH``), sampled on the one object a build reads to time the client, or none
at all (the split sending the fewest bytes)."""


@dataclass(frozen=True)
class Bandwidth:
    """A bandwidth and where it came from.

    Args:
        bits_per_second: The figure.
        source: One of :data:`SOURCES` except ``default``.
        measured_at: Unix time it was measured (remembered figures).
    """

    bits_per_second: float
    source: str
    measured_at: float | None = None


def endpoint_key(endpoints: Sequence[str]) -> str:
    """The name a set of gateways' figure is kept under."""
    return " ".join(endpoint.rstrip("/") for endpoint in endpoints)


@dataclass(frozen=True)
class BandwidthMemory:
    """Bandwidths measured per endpoint, in a file shared by jobs and processes.

    Args:
        path: The file.
        lifetime_s: How long a figure is trusted, in seconds.
    """

    path: Path
    lifetime_s: float = DEFAULT_LIFETIME_S

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> BandwidthMemory:
        """The file in the XDG cache directory ``environ`` names (``~/.cache`` without)."""
        base = environ.get("XDG_CACHE_HOME") or ""
        root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
        return cls(root / "hapi" / "bandwidth.json")

    def recall(self, endpoint: str, *, now: float | None = None) -> Bandwidth | None:
        """The figure kept for ``endpoint`` if it is within its lifetime, else ``None``."""
        entry = self._entries(warn=True).get(endpoint)
        if not isinstance(entry, Mapping):
            return None
        bits, when = _number(entry.get("bits_per_second")), _number(entry.get("measured_at"))
        if bits is None or when is None or bits <= 0:
            return None
        age = (time.time() if now is None else now) - when
        if not -_CLOCK_SKEW_S <= age <= self.lifetime_s:
            return None
        return Bandwidth(bits, "remembered", when)

    def remember(self, endpoint: str, bits_per_second: float, *, now: float | None = None) -> None:
        """Keep ``bits_per_second`` for ``endpoint``, measured ``now``; a cache directory
        that cannot be written is logged, never raised (the figure only saves a job time)."""
        entries = dict(self._entries(warn=False))
        when = time.time() if now is None else now
        entries[endpoint] = {"bits_per_second": bits_per_second, "measured_at": when}
        text = json.dumps({"format": FILE_FORMAT, "endpoints": entries}, indent=1)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _replace(self.path, text)
        except OSError as exc:
            logger.info("cannot remember the bandwidth in %s: %s", self.path, exc)

    def _entries(self, *, warn: bool) -> Mapping[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return _ignored(self.path, f"unreadable ({exc})", warn)
        if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
            return _ignored(self.path, f"not a {FILE_FORMAT} file", warn)
        entries = data.get("endpoints")
        if not isinstance(entries, dict):
            return _ignored(self.path, "no endpoints in it", warn)
        return entries


def _number(value: object) -> float | None:
    """``value`` as a finite number, or ``None`` (JSON's booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _ignored(path: Path, why: str, warn: bool) -> Mapping[str, Any]:
    if warn:
        logger.warning("ignoring the remembered bandwidths in %s: %s", path, why)
    return {}


def _replace(path: Path, text: str) -> None:
    """Write ``path`` atomically: a reader sees the old file or the new, never a part."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".bandwidth-", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


MIN_RESPONSES = 8
"""Responses before the estimate may count as stable."""
STABLE_WITHIN = 0.25
"""Stable: the estimate over all responses is within 25% of the one over the first half."""


def checkpoint_step(min_responses: int = MIN_RESPONSES) -> int:
    """Responses between two checkpoints of a link estimate."""
    return max(1, min_responses // 2)


@dataclass
class LinkEstimate:
    """The bandwidth of the job's own responses, and whether it has settled.

    Feed it each response's bytes and the span it was on the wire (``add``); every
    ``step`` responses once :attr:`stable`, :meth:`checkpoint` gives the figure to plan
    with. Spans are taken in the order requests started, as a pipeline receives them.

    Args:
        min_responses: Responses before the estimate may be stable.
        within: The relative difference between the estimate over all responses and over
            the first half of them that counts as stable.
    """

    min_responses: int = MIN_RESPONSES
    within: float = STABLE_WITHIN
    _totals: list[tuple[int, float]] = field(default_factory=list)
    _reach: float = -math.inf

    @property
    def responses(self) -> int:
        return len(self._totals)

    def add(self, nbytes: int, span: tuple[float, float]) -> None:
        """Count one response of ``nbytes`` on the wire during ``span`` (start, end)."""
        start, end = span
        sent, seconds = self._totals[-1] if self._totals else (0, 0.0)
        if end > self._reach:
            seconds += end - max(start, self._reach)
            self._reach = end
        self._totals.append((sent + nbytes, seconds))

    def bandwidth_bps(self, responses: int | None = None) -> float | None:
        """Bits per second over the first ``responses`` (all by default)."""
        count = self.responses if responses is None else responses
        if count < 1:
            return None
        sent, seconds = self._totals[count - 1]
        return sent * 8 / seconds if seconds > 0 and sent else None

    @property
    def stable(self) -> bool:
        """Enough responses, and the estimate no longer moves by more than ``within``."""
        if self.responses < self.min_responses:
            return False
        now, half = self.bandwidth_bps(), self.bandwidth_bps(self.responses // 2)
        return now is not None and half is not None and abs(now / half - 1) <= self.within

    def checkpoint(self) -> float | None:
        """The estimate to plan with after this response, or ``None`` (not stable yet, or
        not a checkpoint: one every ``min_responses // 2`` responses)."""
        if self.responses % checkpoint_step(self.min_responses) or not self.stable:
            return None
        return self.bandwidth_bps()


class _RecordLog:
    """Fixed records appended by every process that reads for a dataset: the process that
    owns the dataset and its DataLoader workers, forked or spawned, persistent or not.

    Each process appends one record at a time to one file (a single append, which the
    kernel does not interleave) and reads everyone's. The owner creates the file and
    removes it when the log is collected or the process exits; copies in other processes
    only name it.
    """

    _RECORD: struct.Struct
    _KIND: str

    def __init__(self) -> None:
        handle, path = tempfile.mkstemp(prefix=f"hapi-{self._KIND}-", suffix=".log")
        os.close(handle)
        self.path = path
        # Only this object removes the file: a pickled copy has no finalizer, and a forked
        # copy's finalizer checks the process.
        weakref.finalize(self, _remove_if_owner, path, os.getpid())

    def _append(self, *fields: float | int) -> None:
        record = self._RECORD.pack(*fields)
        try:  # never created here: once the owner removed it, nobody would
            handle = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            logger.debug("the %s log %s is gone: %s", self._KIND, self.path, exc)
            return
        try:
            os.write(handle, record)
        finally:
            os.close(handle)

    def __len__(self) -> int:
        try:
            return os.stat(self.path).st_size // self._RECORD.size
        except OSError:
            return 0

    def _records(self) -> list[tuple[Any, ...]]:
        try:
            data = Path(self.path).read_bytes()
        except OSError:
            return []
        whole = len(data) - len(data) % self._RECORD.size
        return list(self._RECORD.iter_unpack(data[:whole]))


class SpanLog(_RecordLog):
    """The wire spans of a dataset's pushdown responses, one record per response, so that
    a worker estimates the link the whole job uses, not its own share of it, and the
    owner can plan with what its workers measured (they run the requests; it runs none)."""

    # start, end (the monotonic clock, shared by processes), bytes, the process that read it
    _RECORD = struct.Struct("<ddqq")
    _KIND = "link"

    def add(self, nbytes: int, span: tuple[float, float]) -> None:
        """Record one response of ``nbytes`` on the wire during ``span``."""
        self._append(span[0], span[1], nbytes, os.getpid())

    def spans(self) -> list[tuple[int, tuple[float, float]]]:
        """Every response recorded so far, ``(bytes, (start, end))``, in the order the
        requests started (whole records only)."""
        found = [(n, (start, end)) for start, end, n, _ in self._records()]
        return sorted(found, key=lambda item: item[1][0])

    def readers(self) -> int:
        """How many processes have logged a response: each of them fetches the blocks a
        move to an earlier split runs on the client."""
        return len({pid for *_, pid in self._records()})


@dataclass(frozen=True)
class Served:
    """One pushdown response as an epoch's figures count it (see :class:`EpochLog`)."""

    samples: int
    split: int
    storage: tuple[float, float]
    wire: tuple[float, float]
    wire_bytes: int
    pid: int


class EpochLog(_RecordLog):
    """The map-style dataset's pushdown responses since its owner last looked: what its
    DataLoader workers' epoch measured (the samples, the split, when the gateway held
    each request, when its body was on the wire), for the owner to re-plan with at the
    next ``set_epoch`` as the iterable form does after each epoch. :meth:`take` empties
    it."""

    # samples, split, storage start, end, wire start, end, wire bytes, process
    _RECORD = struct.Struct("<qqddddqq")
    _KIND = "epoch"

    def add(self, served: Served) -> None:
        self._append(
            served.samples,
            served.split,
            *served.storage,
            *served.wire,
            served.wire_bytes,
            served.pid,
        )

    def take(self) -> list[Served]:
        """Every response logged since the last call, and the log emptied (one written
        while it is emptied may be lost: an epoch's figures lose a response)."""
        records = self._records()
        with contextlib.suppress(OSError):
            os.truncate(self.path, 0)
        return [
            Served(samples, split, (s0, s1), (w0, w1), nbytes, pid)
            for samples, split, s0, s1, w0, w1, nbytes, pid in records
        ]


def _remove_if_owner(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked copy of the finalizer removes nothing
        with contextlib.suppress(OSError):
            os.unlink(path)
