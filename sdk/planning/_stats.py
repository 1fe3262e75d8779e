"""Per-epoch statistics, and the optional tqdm bar that shows them live."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..client._wire import WireSpan
from ._link import Served


@dataclass(frozen=True)
class EpochStats:
    """What one pass over a dataset (in this process) cost.

    Args:
        epoch: Index of the pass in this process, from 0.
        samples: Samples delivered.
        seconds: Wall time from the first request to the last sample.
        bytes_received: Response bytes: features under pushdown, objects otherwise.
        wait_seconds: Time the training loop spent blocked waiting for data.
        requests: Requests made.
        split: The split used (``None``: no pushdown).
        mode: ``pushdown``, or ``local`` when objects were read and computed here.
        server_ms: The gateway's ``Server-Timing`` durations summed, by stage.
        transfer_seconds: Wall time during which responses were on the wire, overlapping
            requests counted once (:func:`wire_spans`).
        transfer_bytes: The bytes those spans carried (a timed body's first piece is
            not in them).
        storage_seconds: Wall time during which the gateway held this pass's requests
            after fetching their objects: decoding, running blocks, or queued behind other
            work (its ``total``: another tenant's batches on a loaded storage side count);
            overlapping requests counted once, so concurrent requests that queue behind
            each other do not inflate it.
        local_samples: Samples served from the local cache (``local_cache=``).
        gateway_hits: Requests the gateway answered from its feature cache.
        resumed: The pass continued an epoch from a saved state: its figures are the
            rest of the epoch.
        held_peak: The most samples held at once, received and not yet delivered (what
            the shuffle buffer and a shard's samples for later take in memory).
    """

    epoch: int
    samples: int
    seconds: float
    bytes_received: int
    wait_seconds: float
    requests: int
    split: int | None
    mode: str
    server_ms: dict[str, float]
    transfer_seconds: float = 0.0
    transfer_bytes: int = 0
    storage_seconds: float = 0.0
    local_samples: int = 0
    gateway_hits: int = 0
    resumed: bool = False
    held_peak: int = 0

    @property
    def local_hit_ratio(self) -> float:
        """The share of samples served from the local cache."""
        return self.local_samples / self.samples if self.samples else 0.0

    @property
    def gateway_hit_ratio(self) -> float:
        """The share of requests the gateway answered from its feature cache."""
        return self.gateway_hits / self.requests if self.requests else 0.0

    @property
    def samples_per_s(self) -> float:
        """Throughput of the pass."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_sample(self) -> float:
        """Mean bytes received per sample."""
        return self.bytes_received / self.samples if self.samples else 0.0

    @property
    def bandwidth_bps(self) -> float | None:
        """Bits per second received while transferring (``None`` if not measured)."""
        if self.transfer_seconds <= 0 or not self.transfer_bytes:
            return None
        return self.transfer_bytes * 8 / self.transfer_seconds

    @property
    def storage_ms_per_sample(self) -> float | None:
        """The gateway's decode and inference wall time per sample (``None`` without
        pushdown): the storage stage of the planner's cost model."""
        if self.storage_seconds <= 0 or not self.samples:
            return None
        return self.storage_seconds * 1000 / self.samples

    def __str__(self) -> str:
        return (
            f"epoch {self.epoch}: {self.samples} samples"
            + (" (the rest of a resumed epoch)" if self.resumed else "")
            + f" in {self.seconds:.1f} s "
            f"({self.samples_per_s:.1f}/s), {self.bytes_received / 1e6:.2f} MB received, "
            f"{self.wait_seconds:.1f} s waiting for data, split {self.split} ({self.mode})"
            + (f", {self.local_hit_ratio:.0%} from the local cache" if self.local_samples else "")
            + (f", {self.gateway_hit_ratio:.0%} of requests cached" if self.gateway_hits else "")
        )


class Meter:
    """Accumulates one epoch's figures; optionally drives a tqdm bar.

    Args:
        epoch: The epoch index to report.
        total: Samples expected, for the bar (``None`` if unknown).
        progress: Show a tqdm bar.
        description: The bar's label.
        resumed: The pass continues an epoch from a saved state.
    """

    def __init__(
        self,
        epoch: int,
        *,
        total: int | None,
        progress: bool,
        description: str = "hapi",
        resumed: bool = False,
    ) -> None:
        self.epoch = epoch
        self.resumed = resumed
        self.held_peak = 0
        self.samples = 0
        self.bytes_received = 0
        self.wait_seconds = 0.0
        self.requests = 0
        self.split: int | None = None
        self.mode = "pushdown"
        self.server_ms: dict[str, float] = {}
        self.local_samples = 0
        self.gateway_hits = 0
        self._transfers: list[tuple[float, float]] = []
        self._transfer_bytes = 0
        self._storage: list[tuple[float, float]] = []
        self._started = time.perf_counter()
        self._bar: Any = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=description, unit="sample")

    def record(
        self,
        *,
        samples: int,
        nbytes: int,
        split: int | None,
        mode: str,
        server_ms: dict[str, float],
        round_trip: tuple[float, float] | None = None,
        local_samples: int = 0,
        gateway_cache: str = "",
        wire: Sequence[WireSpan] = (),
    ) -> None:
        """Count one batch of results; ``round_trip`` is its request's (start, end),
        ``wire`` its body's arrival as the client timed it."""
        self.local_samples += local_samples
        self.gateway_hits += gateway_cache == "hit"
        if round_trip is not None:
            self._storage.append(storage_span(round_trip, server_ms))
            for carried, span in wire_spans(nbytes, round_trip, server_ms, wire):
                self._transfers.append(span)
                self._transfer_bytes += carried
        self.samples += samples
        self.bytes_received += nbytes
        if mode != "cached":  # an all-local batch made no request
            self.requests += 1
        self.split, self.mode = split, mode
        for stage, ms in server_ms.items():
            self.server_ms[stage] = self.server_ms.get(stage, 0.0) + ms
        if self._bar is not None:
            self._bar.update(samples)
            self._bar.set_postfix(
                MB=f"{self.bytes_received / 1e6:.1f}",
                wait=f"{self.wait_seconds:.1f}s",
                refresh=False,
            )

    def finish(self) -> EpochStats:
        """Close the bar and return the epoch's figures."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        return EpochStats(
            epoch=self.epoch,
            samples=self.samples,
            seconds=time.perf_counter() - self._started,
            bytes_received=self.bytes_received,
            wait_seconds=self.wait_seconds,
            requests=self.requests,
            split=self.split,
            mode=self.mode,
            server_ms=dict(self.server_ms),
            transfer_seconds=_union(self._transfers),
            transfer_bytes=self._transfer_bytes,
            storage_seconds=_union(self._storage),
            local_samples=self.local_samples,
            gateway_hits=self.gateway_hits,
            resumed=self.resumed,
            held_peak=self.held_peak,
        )


def storage_span(
    round_trip: tuple[float, float], server_ms: Mapping[str, float]
) -> tuple[float, float]:
    """When the gateway held a request after fetching its objects (decoding, running
    blocks, or queued behind other work), on the client's clock."""
    start, end = round_trip
    fetched = server_ms.get("fetch", 0.0) / 1000
    return start + fetched, min(end, start + gateway_seconds(server_ms))


def served_stats(epoch: int, served: Sequence[Served], split: int, seconds: float) -> EpochStats:
    """An epoch's figures from the responses its DataLoader workers logged
    (:class:`~hapi.sdk.planning._link.EpochLog`), counting those at ``split``: what the
    iterable form's :class:`Meter` gives after an epoch, for the map-style form's owner,
    which ran none of the requests. ``seconds``: the epoch's wall time as the owner saw it
    (from one ``set_epoch`` to the next)."""
    at_split = [s for s in served if s.split == split]
    return EpochStats(
        epoch=epoch,
        samples=sum(s.samples for s in at_split),
        seconds=seconds,
        bytes_received=sum(s.wire_bytes for s in at_split),
        wait_seconds=0.0,
        requests=sum(1 for s in at_split if s.samples),
        split=split,
        mode="pushdown",
        server_ms={},
        transfer_seconds=_union([s.wire for s in at_split]),
        transfer_bytes=sum(s.wire_bytes for s in at_split),
        storage_seconds=_union([s.storage for s in at_split]),
    )


def wire_spans(
    nbytes: int,
    round_trip: tuple[float, float],
    server_ms: dict[str, float],
    wire: Sequence[WireSpan] = (),
) -> list[tuple[int, tuple[float, float]]]:
    """When a response of ``nbytes`` was on the wire, and the bytes each span carried:
    the client's timing of its body (:func:`hapi.sdk.client._wire.read_timed`) where it
    timed any; else, for a body too small to time, its round trip less the gateway's
    time (:func:`transfer_span`), which counts the request's send and the gateway's
    event loop as wire time too, with all its bytes."""
    timed = [(span.nbytes, (span.start, span.end)) for span in wire if span.nbytes]
    return timed or [(nbytes, transfer_span(round_trip, server_ms))]


def transfer_span(
    round_trip: tuple[float, float], server_ms: dict[str, float]
) -> tuple[float, float]:
    """When a response was on the wire: its request's round trip (start, end) less the
    gateway's own time (:func:`gateway_seconds`)."""
    start, end = round_trip
    return min(end, start + gateway_seconds(server_ms)), end


def gateway_seconds(server_ms: Mapping[str, float]) -> float:
    """The gateway's whole time for a request: its ``Server-Timing`` ``total`` (from the
    request's arrival to the response's start, queueing behind other requests included;
    without it, a storage side slower than the link made the link look as slow as the
    storage side), else the sum of its stages (a gateway that sends no ``total``)."""
    if "total" in server_ms:
        return server_ms["total"] / 1000
    return sum(server_ms.values()) / 1000


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
