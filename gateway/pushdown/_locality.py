"""Where each object pushdown fetched was: on this node, on another, or unknown.

A gateway asked for an object its node does not hold still answers: its backend, the node's
S3 endpoint, reads the chunks from the node that holds them, and the bytes cross the
network once. :class:`FetchMeter` counts every fetch and its bytes by placement: ``local``
when this node (``node_address``) is among the hosts the store's placement lookup names for
the object, ``remote`` when the lookup names hosts and this node is not one, ``unknown``
when no lookup is configured or it has no answer.

The lookup blocks (HTTP to the store, cached inside it with a TTL), so it runs on a thread
of its own while the object is read, and a fetch never waits for it: a fetch whose lookup
has not answered when its body is in is counted when the lookup answers. A lookup that
fails counts its fetch as unknown and is logged once; it never fails a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Literal
from urllib.parse import urlsplit

from hapi.protocol import Placement
from hapi.store import parse_placement

from .._knobs import parse_list
from .._metrics import Metrics
from .._settings import GatewaySettings

__all__ = ["FetchMeter", "node_hosts", "open_fetch_meter", "placement_of"]

log = logging.getLogger("hapi.gateway")

Where = Literal["local", "remote", "unknown"]


def node_hosts(addresses: str) -> frozenset[str]:
    """The hosts of ``node_address``: comma-separated hosts, ``host:port`` or URLs."""
    hosts = set()
    for address in parse_list(addresses):
        parts = urlsplit(address if "//" in address else f"//{address}")
        hosts.add(parts.hostname or address.lower())
    return frozenset(hosts)


def placement_of(hosts: Sequence[str], node: frozenset[str]) -> Where:
    """``local`` when ``node`` is among the object's ``hosts``, ``remote`` when the hosts are
    known and ``node`` is not one of them, ``unknown`` when either is not known."""
    if not hosts or not node:
        return "unknown"
    return "local" if node.intersection(hosts) else "remote"


class FetchMeter:
    """Counts pushdown's object fetches and their bytes by placement.

    Args:
        metrics: Where fetches are counted (``None``: nowhere, and nothing is looked up).
        placement: The store's placement lookup (``None``: every fetch is unknown).
        node_address: The addresses this node's volume server advertises (see
            :func:`node_hosts`); empty: every fetch is unknown.
        executor: Where the blocking lookups run (``None``: the loop's default).
    """

    def __init__(
        self,
        metrics: Metrics | None,
        placement: Placement | None = None,
        node_address: str = "",
        executor: Executor | None = None,
    ) -> None:
        self._metrics = metrics
        self._node = node_hosts(node_address)
        self._placement = placement if metrics is not None and self._node else None
        self._executor = executor
        self._warned = False

    def locate(self, bucket: str, key: str) -> asyncio.Future[Where]:
        """Start finding where ``bucket/key`` is, to run beside its fetch (never fails)."""
        loop = asyncio.get_running_loop()
        if self._placement is None:
            known: asyncio.Future[Where] = loop.create_future()
            known.set_result("unknown")
            return known
        return loop.run_in_executor(self._executor, self._where, self._placement, bucket, key)

    def fetched(self, located: asyncio.Future[Where], size: int) -> None:
        """Count one fetch of ``size`` bytes: now if its lookup has answered, else when it
        does (the fetch goes on meanwhile)."""
        if located.done():
            self._count(located, size)
        else:
            located.add_done_callback(lambda done: self._count(done, size))

    def _count(self, located: asyncio.Future[Where], size: int) -> None:
        where = "unknown" if located.cancelled() else located.result()
        if self._metrics is not None:
            self._metrics.series(self._metrics.object_fetches, where).inc()
            self._metrics.series(self._metrics.object_fetch_bytes, where).inc(size)

    def _where(self, placement: Placement, bucket: str, key: str) -> Where:
        try:
            hosts = placement.locate(bucket, key)
        except Exception as exc:  # any lookup's failure: the fetch is counted, not failed
            if not self._warned:
                self._warned = True
                log.warning("placement lookup failed (%r); its fetches count as unknown", exc)
            return "unknown"
        return placement_of(hosts, self._node)


@contextlib.contextmanager
def open_fetch_meter(
    settings: GatewaySettings, metrics: Metrics | None, placement: Placement | None = None
) -> Iterator[FetchMeter]:
    """A fetch meter for this node, its lookups on a thread of their own; closed on exit.

    ``placement`` (owned by the caller) replaces the lookup of ``settings.placement``, which
    is made here and closed on exit.
    """
    lookup = placement if placement is not None else parse_placement(settings.placement)
    if lookup is not None and not node_hosts(settings.node_address):
        log.warning(
            "a placement lookup but no node address (HAPI_NODE_ADDRESS): every object "
            "fetch counts as placement unknown"
        )
    pool = ThreadPoolExecutor(1, thread_name_prefix="hapi-placement")
    try:
        yield FetchMeter(metrics, lookup, settings.node_address, pool)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if placement is None and lookup is not None:
            lookup.close()
