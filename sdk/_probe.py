"""Asking a gateway what the planner needs: the bandwidth to it, and its view of a model.

Both read the gateway's control plane with httpx: ``/_hapi/probe`` streams zeros to time,
``/_hapi/models/{name}`` and ``/_hapi/stats`` give the manifest's figures, the storage
side's per-block, decode and load figures measured on real traffic (each with its source
and age), and the memory budget, in the schema both sides share
(:class:`hapi.protocol.GatewayStats`, :class:`hapi.protocol.ModelProfile`). The control plane
wants SigV4-signed requests: :class:`GatewayAuth` signs them with the caller's S3
credentials (botocore's signer), found the way boto3 finds them unless given. The httpx
client is a seam: pass one (with an ``httpx.MockTransport`` in tests), or one is created
and closed here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import botocore.session
import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

from hapi import planner
from hapi.protocol import GatewayStats, ModelProfile

from ._errors import ProbeError

DEFAULT_PROBE_STREAMS = 4
DEFAULT_PROBE_SECONDS = 1.0
_MAX_PROBE_BYTES = 256 * 1024**2  # the gateway's default cap per probe
_CHUNK = 256 * 1024


class GatewayAuth(httpx.Auth):
    """Signs requests to a hapi gateway's control plane with SigV4, as boto3 signs S3 calls.

    Args:
        credentials: botocore credentials (anything with ``access_key``, ``secret_key``
            and ``token``; refreshable ones are frozen per request).
        region: The region to sign for.
    """

    def __init__(self, credentials: Any, region: str = "us-east-1") -> None:
        self._credentials = credentials
        self._region = region

    @classmethod
    def from_environment(cls) -> GatewayAuth | None:
        """The credentials and region boto3 would use here; ``None`` when there are none."""
        session = botocore.session.get_session()
        credentials = session.get_credentials()
        if credentials is None:
            return None
        return cls(credentials, session.get_config_variable("region") or "us-east-1")

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        """Add the SigV4 headers to ``request``."""
        frozen = getattr(self._credentials, "get_frozen_credentials", None)
        signed = AWSRequest(method=request.method, url=str(request.url))
        S3SigV4Auth(frozen() if frozen else self._credentials, "s3", self._region).add_auth(signed)
        request.headers.update(dict(signed.headers.items()))
        yield request


def _auth(auth: httpx.Auth | None) -> httpx.Auth | None:
    return auth if auth is not None else GatewayAuth.from_environment()


@contextlib.contextmanager
def _http(client: httpx.Client | None, timeout: float) -> Iterator[httpx.Client]:
    if client is not None:
        yield client
        return
    with httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=64)) as owned:
        yield owned


@contextlib.contextmanager
def _translated(endpoint: str, what: str) -> Iterator[None]:
    try:
        yield
    except httpx.HTTPStatusError as exc:
        raise ProbeError(
            f"{what} at {endpoint}: HTTP {exc.response.status_code} (is it a hapi gateway?)"
        ) from exc
    except httpx.HTTPError as exc:
        raise ProbeError(f"{what} at {endpoint}: {exc!r}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"{what} at {endpoint}: unexpected answer ({exc})") from exc


def probe_bandwidth(
    endpoint: str,
    *,
    bytes: int | None = None,
    streams: int = DEFAULT_PROBE_STREAMS,
    seconds: float = DEFAULT_PROBE_SECONDS,
    client: httpx.Client | None = None,
    timeout: float = 60.0,
    auth: httpx.Auth | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Measure the bandwidth from the gateway to here, in bits per second.

    ``streams`` parallel downloads of ``/_hapi/probe``, like a data loader's parallel
    requests; connections are opened first, so the timed part is the transfer. Without
    ``bytes`` the probe is sized in time, never in bytes: each stream reads what the link
    brings for ``seconds`` and hangs up, so a slow link is tied up for about ``seconds``
    whatever its speed, and a fast one is not timed on a blink. This is opt-in: the SDK
    learns the bandwidth from a job's own responses instead.

    Args:
        endpoint: The gateway's base URL.
        bytes: Total bytes to download instead (a benchmark's fixed size).
        streams: Parallel downloads.
        seconds: How long the probe reads.
        client: The httpx client to use; one is created and closed if omitted.
        timeout: Per-request timeout of a created client, in seconds.
        auth: Signs the requests; :meth:`GatewayAuth.from_environment` if omitted.
        clock: The seconds counter the transfers are timed with.

    Raises:
        ProbeError: A request failed, or a sized stream was cut short.
        ValueError: ``bytes`` or ``streams`` below 1, or ``seconds`` not positive.
    """
    if (bytes is not None and bytes < 1) or streams < 1 or not seconds > 0:
        raise ValueError("probe bytes and streams must be at least 1, and seconds positive")
    url = endpoint.rstrip("/") + "/_hapi/probe"
    signer = _auth(auth)
    with (
        _translated(endpoint, "bandwidth probe"),
        _http(client, timeout) as http,
        ThreadPoolExecutor(streams) as pool,
    ):
        get = _Downloader(http, url, signer, clock)
        _timed(pool, get, streams, streams, clock)  # opens the connections
        if bytes is not None:
            return _timed(pool, get, bytes, streams, clock)
        return _timed(pool, get, _MAX_PROBE_BYTES, streams, clock, until=clock() + seconds)


@dataclass(frozen=True)
class _Downloader:
    http: httpx.Client
    url: str
    auth: httpx.Auth | None
    clock: Callable[[], float]

    def __call__(self, size: int, until: float | None) -> int:
        """Bytes of a ``size``-byte probe read (all of them, or those read by ``until``)."""
        extra: dict[str, Any] = {"auth": self.auth} if self.auth is not None else {}
        received = 0
        with self.http.stream("GET", self.url, params={"bytes": size}, **extra) as reply:
            reply.raise_for_status()
            for chunk in reply.iter_bytes() if until is not None else reply.iter_bytes(_CHUNK):
                received += len(chunk)
                if until is not None and self.clock() >= until:
                    return received  # hang up: the probe is sized in time
        if received != size:
            raise ProbeError(f"{self.url}: the probe sent {received} bytes instead of {size}")
        return received


def _timed(
    pool: ThreadPoolExecutor,
    get: _Downloader,
    total: int,
    streams: int,
    clock: Callable[[], float],
    until: float | None = None,
) -> float:
    """Bits per second of ``total`` bytes downloaded over ``streams`` parallel requests
    (or of what they brought by ``until``)."""
    share = max(1, total // streams)
    start = clock()
    received = sum(pool.map(lambda _: get(share, until), range(streams)))
    return received * 8 / max(clock() - start, 1e-9)


def fetch_gateway_profile(
    endpoint: str,
    name: str,
    *,
    client: httpx.Client | None = None,
    timeout: float = 10.0,
    auth: httpx.Auth | None = None,
) -> planner.GatewayProfile:
    """Read ``/_hapi/models/{name}`` and ``/_hapi/stats`` from the gateway at ``endpoint``.

    Args:
        endpoint: The gateway's base URL.
        name: ``NAME`` or ``NAME@VERSION``.
        client: The httpx client to use; one is created and closed if omitted.
        timeout: Request timeout of a created client, in seconds.
        auth: Signs the requests; :meth:`GatewayAuth.from_environment` if omitted.

    Raises:
        ProbeError: A request failed (an unknown model is a 404), or the answer is not
            what a hapi gateway sends.
    """
    base = endpoint.rstrip("/")
    signer = _auth(auth)
    extra: dict[str, Any] = {"auth": signer} if signer is not None else {}
    with _translated(endpoint, f"model {name}"), _http(client, timeout) as http:
        model = http.get(f"{base}/_hapi/models/{name}", **extra).raise_for_status().json()
        stats = http.get(f"{base}/_hapi/stats", **extra).raise_for_status().json()
        return _parse(model, stats)


def _parse(model: Mapping[str, Any], stats: Mapping[str, Any]) -> planner.GatewayProfile:
    return planner.gateway_view(
        ModelProfile.model_validate(model), GatewayStats.model_validate(stats)
    )
