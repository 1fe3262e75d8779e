"""Several gateways behind one client: which endpoint a request goes to, and their health.

Gateways are stateless and share one store and registry, so any of them can serve any
request. A client given several endpoints sends each feature request to the healthy
endpoint with the fewest of this process's requests outstanding, taking turns among equals
(a sequential loop goes round-robin; concurrent prefetch requests spread out). A
connection error, a reset or a 503 marks the endpoint down for a cool-off (the gateway's
``Retry-After`` when it sends one) and the request is retried at once on another; feature
requests are idempotent, so a request cut off mid-response is simply sent again. When
every endpoint is down, the one due back first is tried after a backoff: a single URL (a
Kubernetes Service in front of the gateways) behaves as it always did, retries with
backoff. After a bounded number of attempts the error names every endpoint and what
happened to it.

Health is per process: every DataLoader worker and DDP rank has its own client, so its
own view, and learns of a dead gateway from its own first failed request.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from ._errors import EndpointsUnavailable, SDKError

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
COOL_OFF_S = 10.0
ATTEMPTS = 5  # per request with one endpoint; each further endpoint adds one
MAX_BACKOFF_S = 5.0

T = TypeVar("T")
logger = logging.getLogger("hapi.sdk")


def parse_endpoints(value: str | Sequence[str]) -> tuple[str, ...]:
    """Endpoint URLs from ``"http://a:8080,http://b:8080"`` or a list, trailing ``/`` dropped.

    Raises:
        ValueError: No endpoint, or one that is not an ``http(s)://host`` URL.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    endpoints = tuple(dict.fromkeys(str(item).strip().rstrip("/") for item in items))
    endpoints = tuple(endpoint for endpoint in endpoints if endpoint)
    if not endpoints:
        raise ValueError(f"no endpoint URL in {value!r}")
    for endpoint in endpoints:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"an endpoint must be an http(s)://host[:port] URL, not {endpoint!r}")
    return endpoints


def resolve_endpoints(
    endpoint_url: str | Sequence[str] | None, environ: Mapping[str, str]
) -> tuple[str, ...]:
    """The endpoints: the argument, then ``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``
    (each one URL or several, comma-separated); empty means AWS's own endpoints."""
    if endpoint_url:
        return parse_endpoints(endpoint_url)
    found = next((environ[name] for name in ENDPOINT_VARIABLES if environ.get(name)), None)
    return parse_endpoints(found) if found else ()


def backoff(attempt: int, retry_after: float | None) -> float:
    """Seconds to wait before attempt ``attempt + 1``: the server's ``Retry-After`` when it
    gave one, else exponential with jitter; at most :data:`MAX_BACKOFF_S`."""
    if retry_after is not None:
        return min(retry_after, MAX_BACKOFF_S)
    return float(min(MAX_BACKOFF_S, 0.1 * 2**attempt * (1 + random.random())))


@dataclass
class _Health:
    outstanding: int = 0
    down_until: float = float("-inf")
    reason: str = ""


class EndpointPool:
    """The endpoints of one client: selection, outstanding requests and health.

    Thread-safe: a dataset's prefetch threads share one pool.

    Args:
        endpoints: The endpoint URLs, at least one.
        cool_off_s: How long a failed endpoint is left alone.
        clock: Monotonic seconds (a seam for tests).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        cool_off_s: float = COOL_OFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not endpoints:
            raise ValueError("an endpoint pool needs at least one endpoint")
        self.endpoints = tuple(endpoints)
        self._health = {endpoint: _Health() for endpoint in self.endpoints}
        self._cool_off_s = cool_off_s
        self._clock = clock
        self._turn = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.endpoints)

    @property
    def attempts(self) -> int:
        """Attempts per request: :data:`ATTEMPTS`, plus one per further endpoint."""
        return ATTEMPTS + len(self.endpoints) - 1

    def _up(self) -> list[str]:
        now = self._clock()
        return [e for e in self.endpoints if self._health[e].down_until <= now]

    def _due_first(self) -> str:
        return min(self.endpoints, key=lambda e: self._health[e].down_until)

    def primary(self) -> str:
        """The first healthy endpoint (else the one due back first): for plain S3 calls."""
        with self._lock:
            up = self._up()
            return up[0] if up else self._due_first()

    def acquire(self, prefer: str | None = None) -> str:
        """Choose an endpoint for a request and count it outstanding until :meth:`release`:
        ``prefer`` (the gateway beside the request's object) while it is healthy, else
        the healthy one with the fewest outstanding."""
        with self._lock:
            candidates = self._up() or [self._due_first()]
            if prefer in candidates:
                candidates = [prefer]
            start, self._turn = self._turn, self._turn + 1
            order = {e: (i - start) % len(self.endpoints) for i, e in enumerate(self.endpoints)}
            chosen = min(candidates, key=lambda e: (self._health[e].outstanding, order[e]))
            self._health[chosen].outstanding += 1
            return chosen

    def release(self, endpoint: str) -> None:
        """The request sent to ``endpoint`` by :meth:`acquire` is over."""
        with self._lock:
            self._health[endpoint].outstanding -= 1

    def any_up(self) -> bool:
        """Whether some endpoint is out of cool-off."""
        with self._lock:
            return bool(self._up())

    def mark_down(self, endpoint: str, reason: str, *, seconds: float | None = None) -> None:
        """Leave ``endpoint`` alone for ``seconds`` (default: the pool's cool-off)."""
        cool_off = self._cool_off_s if seconds is None else max(seconds, 0.0)
        with self._lock:
            health = self._health[endpoint]
            news = health.down_until <= self._clock()
            again = bool(health.reason)  # failed before, and has not answered since
            health.down_until = self._clock() + cool_off
            health.reason = reason
        if news and len(self.endpoints) > 1:
            logger.log(
                logging.INFO if again else logging.WARNING,
                "%s is down for %.0f s (%s); its requests go to the other endpoints",
                endpoint,
                cool_off,
                reason,
            )

    def mark_up(self, endpoint: str) -> None:
        """``endpoint`` answered: it is healthy again."""
        with self._lock:
            health = self._health[endpoint]
            health.down_until, health.reason = float("-inf"), ""

    def failures(self) -> dict[str, str]:
        """Each endpoint's last failure (``"up"`` for a healthy one)."""
        with self._lock:
            return {e: self._health[e].reason or "up" for e in self.endpoints}


class EndpointFailure(Exception):
    """One attempt failed in a way another endpoint, or a later attempt, may not.

    Args:
        reason: What happened (it ends up in the final error).
        retry_after: The server's ``Retry-After``, in seconds.
        error: What to raise if this was the last attempt (``None``: the attempts end in
            :class:`EndpointsUnavailable`).
    """

    def __init__(
        self, reason: str, *, retry_after: float | None = None, error: SDKError | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.error = error


def failover(
    pool: EndpointPool,
    attempt: Callable[[str], T],
    *,
    bucket: str,
    key: str = "",
    prefer: str | None = None,
) -> T:
    """``attempt(endpoint)`` on the pool's endpoints until one answers, ``prefer`` first
    while it is healthy.

    ``attempt`` raises :class:`EndpointFailure` for a failure worth retrying elsewhere;
    anything else it raises (a 404, a bad argument) passes through at once.

    Raises:
        EndpointsUnavailable: Every attempt failed to reach an endpoint; names them all.
        SDKError: The last attempt's own error (e.g. ``SlowDown`` after the retries).
    """
    last: EndpointFailure | None = None
    for n in range(pool.attempts):
        endpoint = pool.acquire(prefer)
        try:
            result = attempt(endpoint)
        except EndpointFailure as exc:
            last = exc
            pool.mark_down(endpoint, exc.reason, seconds=exc.retry_after)
        else:
            pool.mark_up(endpoint)
            return result
        finally:
            pool.release(endpoint)
        if n + 1 < pool.attempts and not pool.any_up():
            time.sleep(backoff(n, last.retry_after))
    assert last is not None  # pool.attempts >= 1
    if last.error is not None:
        raise last.error from last
    raise EndpointsUnavailable(pool.failures(), attempts=pool.attempts, bucket=bucket, key=key)


def rebase(url: str, endpoints: Sequence[str], target: str) -> str:
    """``url``, built on one of ``endpoints``, moved onto ``target`` (unchanged if it is
    built on none of them, e.g. a virtual-hosted-style URL)."""
    for base in endpoints:
        if url == base or url.startswith((base + "/", base + "?")):
            return target + url[len(base) :]
    return url
