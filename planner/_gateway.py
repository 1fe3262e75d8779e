"""What the gateway knows: bandwidth to it, and its storage-side view of a model.

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
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import botocore.session
import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

from hapi.protocol import Figure, GatewayStats, ModelProfile, StorageLoad, StorageProfile

from ._cost import Profile
from ._errors import ProbeError

DEFAULT_PROBE_STREAMS = 4
DEFAULT_PROBE_SECONDS = 2.0
_FIRST_PROBE_BYTES = 512 * 1024
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

    ``streams`` parallel downloads of ``/_hapi/probe`` share the bytes, like a data
    loader's parallel requests; connections are opened first, so the timed part is the
    transfer. Without ``bytes``, a short first probe sizes a second one to last about
    ``seconds``, so a slow link is not tied up for minutes and a fast one is not timed
    on a blink.

    Args:
        endpoint: The gateway's base URL.
        bytes: Total bytes to download; sized from a first probe if omitted.
        streams: Parallel downloads.
        seconds: How long the sized probe should take.
        client: The httpx client to use; one is created and closed if omitted.
        timeout: Per-request timeout of a created client, in seconds.
        auth: Signs the requests; :meth:`GatewayAuth.from_environment` if omitted.
        clock: The seconds counter the transfers are timed with.

    Raises:
        ProbeError: A request failed, or the stream was cut short.
        ValueError: ``bytes`` or ``streams`` below 1.
    """
    if (bytes is not None and bytes < 1) or streams < 1:
        raise ValueError("probe bytes and streams must be at least 1")
    url = endpoint.rstrip("/") + "/_hapi/probe"
    signer = _auth(auth)
    with (
        _translated(endpoint, "bandwidth probe"),
        _http(client, timeout) as http,
        ThreadPoolExecutor(streams) as pool,
    ):
        get = _Downloader(http, url, signer)
        _timed(pool, get, streams, streams, clock)  # opens the connections
        if bytes is None:
            rough = _timed(pool, get, _FIRST_PROBE_BYTES, streams, clock)
            wanted = int(rough / 8 * seconds)
            bytes = min(max(wanted, _FIRST_PROBE_BYTES), _MAX_PROBE_BYTES)
        return _timed(pool, get, bytes, streams, clock)


@dataclass(frozen=True)
class _Downloader:
    http: httpx.Client
    url: str
    auth: httpx.Auth | None

    def __call__(self, size: int) -> int:
        return _download(self.http, self.url, size, self.auth)


def _timed(
    pool: ThreadPoolExecutor,
    get: _Downloader,
    total: int,
    streams: int,
    clock: Callable[[], float],
) -> float:
    """Bits per second of ``total`` bytes downloaded over ``streams`` parallel requests."""
    share = max(1, total // streams)
    start = clock()
    received = sum(pool.map(lambda _: get(share), range(streams)))
    return received * 8 / max(clock() - start, 1e-9)


def _download(http: httpx.Client, url: str, size: int, auth: httpx.Auth | None) -> int:
    extra: dict[str, Any] = {"auth": auth} if auth is not None else {}
    with http.stream("GET", url, params={"bytes": size}, **extra) as reply:
        reply.raise_for_status()
        received = sum(len(chunk) for chunk in reply.iter_bytes(_CHUNK))
    if received != size:
        raise ProbeError(f"{url}: the probe sent {received} bytes instead of {size}")
    return received


@dataclass(frozen=True, kw_only=True)
class GatewayProfile:
    """The gateway's view of one model.

    Args:
        model: ``NAME@VERSION`` the gateway resolved.
        cpu_ms: The manifest's per-block CPU ms per sample, frozen blocks.
        storage: The storage side's own figures as served: per block (measured, or the
            manifest's for a block never run), decode, and the host's availability, each
            with its source and age.
        memory_bytes: A new tenant's share of the memory budget: unused bytes divided
            among the active tenants and one more. ``None`` when unknown.
        busy_tenants: Tenants other than this model's with work queued now.
    """

    model: str
    cpu_ms: tuple[float, ...]
    storage: StorageProfile
    memory_bytes: int | None
    busy_tenants: int

    @property
    def scale(self) -> float:
        """Measured over manifest time across the measured blocks (1 if none): how much
        faster or slower this storage side is than where the manifest was profiled."""
        measured = [b for b in self.storage.blocks if b.source != "manifest"]
        ms = sum(b.ms for b in measured)
        predicted = sum(self.cpu_ms[b.block] for b in measured if b.block < len(self.cpu_ms))
        return ms / predicted if ms > 0 and predicted > 0 else 1.0

    @property
    def storage_ms(self) -> tuple[float, ...]:
        """Per-block storage-side ms per sample: measured where the block ran, else the
        manifest's scaled by :attr:`scale`."""
        scale = self.scale
        figures = {b.block: b for b in self.storage.blocks}
        return tuple(
            figures[i].ms if i in figures and figures[i].source != "manifest" else ms * scale
            for i, ms in enumerate(self.cpu_ms)
        )

    @property
    def storage_load(self) -> float:
        """Factor for time-sharing the device in turn with the other busy tenants."""
        return 1.0 + self.busy_tenants

    def origin(self) -> str:
        """Where the storage-side figures came from and how old they are, in words."""
        return describe_storage(self.storage, self.scale)

    def apply(self, profile: Profile) -> Profile:
        """``profile`` with this view's storage-side times, decode, memory budget and load.

        With ``shared_compute`` (client and gateway on one machine) the client's blocks
        and decoding are priced by the same figures: they run on the same cores, and the
        gateway's are measured on real traffic.
        """
        decode = self.storage.decode
        storage_ms = self.storage_ms[: profile.blocks]
        decode_ms = decode.ms if decode is not None else profile.storage_decode_ms
        shared = profile.shared_compute
        return replace(
            profile,
            storage_ms=storage_ms,
            client_ms=storage_ms if shared else profile.client_ms,
            client_decode_ms=decode_ms if shared else profile.client_decode_ms,
            storage_decode_ms=decode_ms,
            storage_memory_bytes=self.memory_bytes or profile.storage_memory_bytes,
            storage_load=self.storage_load,
            storage_available=self.storage.load.available,
            storage_origin=self.origin(),
        )


def describe_storage(storage: StorageProfile, scale: float = 1.0) -> str:
    """One sentence on the sources and ages of a served storage profile."""
    measured = [b for b in storage.blocks if b.source != "manifest"]
    parts = []
    if measured:
        samples = min(b.samples for b in measured)
        parts.append(
            f"blocks {_ranges([b.block for b in measured])} {measured[0].source} on "
            f"{measured[0].device} (at least {samples} samples each, {_age(measured)})"
        )
    never = [b.block for b in storage.blocks if b.source == "manifest"]
    if never:
        how = f"x{scale:.2f} as measured blocks say" if measured else "unscaled: nothing ran"
        parts.append(f"blocks {_ranges(never)} from the manifest ({how})")
    decode = storage.decode
    parts.append(
        "decode not measured (the planner's default)"
        if decode is None
        else f"decode {decode.ms:.2f} ms {decode.source} ({decode.samples} samples, "
        f"{_age([decode])})"
    )
    load = storage.load
    parts.append(
        f"{load.available:.0%} of a core available ("
        + (f"{load.source}, {_age([load])})" if load.source != "manifest" else "assumed)")
    )
    return "Storage side: " + "; ".join(parts) + "."


def _age(figures: Sequence[Figure | StorageLoad]) -> str:
    ages = [f.age_s for f in figures if f.age_s is not None]
    return f"{max(ages):.0f} s old" if ages else "age unknown"


def _ranges(indices: Sequence[int]) -> str:
    spans: list[list[int]] = []
    for index in sorted(indices):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def fetch_gateway_profile(
    endpoint: str,
    name: str,
    *,
    client: httpx.Client | None = None,
    timeout: float = 10.0,
    auth: httpx.Auth | None = None,
) -> GatewayProfile:
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


def _parse(model: Mapping[str, Any], stats: Mapping[str, Any]) -> GatewayProfile:
    return gateway_view(ModelProfile.model_validate(model), GatewayStats.model_validate(stats))


def gateway_view(model: ModelProfile, stats: GatewayStats) -> GatewayProfile:
    """The planner's view of ``model`` from the gateway's typed answers."""
    ours_busy = any(tenant.queue_depth for tenant in model.served)
    busy = sum(1 for t in stats.tenants if t.queue_depth)
    budget = stats.memory_budget
    return GatewayProfile(
        model=model.ref,
        cpu_ms=tuple(block.cpu_ms for block in model.blocks[: model.freeze]),
        storage=model.storage,
        memory_bytes=budget.new_tenant_share() if budget.total_bytes else None,
        busy_tenants=max(0, busy - (1 if ours_busy else 0)),
    )
