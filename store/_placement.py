"""Where an object's bytes live: a store's placement lookup, by ``(bucket, key)``.

The interface, :class:`hapi.protocol.Placement`, is the protocol layer's; the lookups that
ask a store over HTTP live here, with the store code.

A store spreads objects over storage nodes. A *placement* answers, for ``(bucket, key)``,
which hosts hold the object's bytes (most bytes first), or nothing when it does not know.
The SDK sends each pushdown request to the gateway on such a host; a gateway counts the
objects it fetches from another node. A store without a lookup (AWS S3, MinIO's erasure
sets) has none.

Placements are small named strategies, chosen by a spec string (:func:`parse_placement`,
``HAPI_PLACEMENT``): ``seaweedfs:filer=URL,master=URL`` reads the object's chunks from the
SeaweedFS filer (a directory listing, so one request places a directory's objects) and
each chunk's volume servers from the master's ``/dir/lookup``; both are cached and refreshed
after ``ttl`` seconds (``seaweedfs:...,ttl=60``). A failed lookup raises nothing: the
object is then unplaced, one warning is logged, and the store is not asked again for a few
seconds.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from hapi.protocol import Placement

if TYPE_CHECKING:  # imported where a lookup is made, not by every importer of hapi.store
    import httpx

logger = logging.getLogger("hapi.store")

DEFAULT_TTL_S = 60.0
_RETRY_AFTER_FAILURE_S = 5.0
_PAGE = 1000


class SeaweedPlacement:
    """Placement from a SeaweedFS filer (chunks) and master (volume locations).

    Args:
        filer_url: The filer's HTTP API, e.g. ``http://filer:8888``.
        master_url: The master's HTTP API, e.g. ``http://master:9333``.
        ttl_s: Seconds an answer is reused before it is looked up again.
        retry_s: Seconds a failed lookup keeps the store from being asked again (every
            object is unplaced meanwhile), so a store that does not answer costs one
            timeout, not one per object.
        buckets_dir: The filer directory of the S3 buckets.
        timeout_s: Per HTTP request.
        clock: Monotonic seconds (a seam for tests).
        transport: An httpx transport (a seam for tests).
    """

    def __init__(
        self,
        *,
        filer_url: str,
        master_url: str,
        ttl_s: float = DEFAULT_TTL_S,
        retry_s: float = _RETRY_AFTER_FAILURE_S,
        buckets_dir: str = "/buckets",
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.filer_url = filer_url.rstrip("/")
        self.master_url = master_url.rstrip("/")
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self.buckets_dir = "/" + buckets_dir.strip("/")
        self._clock = clock
        self._timeout_s = timeout_s
        self._transport = transport
        # Made at the first lookup: a spec parsed only to validate it holds no connections.
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        self._chunks: dict[tuple[str, str], tuple[float, dict[int, int]]] = {}
        self._volumes: dict[int, tuple[float, tuple[str, ...]]] = {}
        self._failed_at: float | None = None
        self._warned = False

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SeaweedPlacement:
        """From a spec's options: ``filer``, ``master`` and optionally ``ttl``."""
        missing = [name for name in ("filer", "master") if not options.get(name)]
        if missing:
            raise ValueError(f"a seaweedfs placement needs {' and '.join(missing)}=URL")
        ttl = float(options.get("ttl", DEFAULT_TTL_S))
        return cls(filer_url=options["filer"], master_url=options["master"], ttl_s=ttl)

    def locate(self, bucket: str, key: str) -> tuple[str, ...]:
        """Hosts of the volume servers holding the object's chunks, most bytes first."""
        with self._lock:
            if self._failed_at is not None and self._clock() - self._failed_at < self.retry_s:
                return ()
            import httpx

            try:
                volumes = self._chunks_of(bucket, key)
                held: dict[str, int] = {}
                for volume, size in volumes.items():
                    for host in self._hosts_of(volume):
                        held[host] = held.get(host, 0) + size
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                self._failed_at = self._clock()
                self._warn(exc)
                return ()
            self._failed_at = None
        return tuple(sorted(held, key=lambda host: -held[host]))

    def forget(self, bucket: str, key: str) -> None:
        with self._lock:
            self._chunks.pop((bucket, key), None)

    def close(self) -> None:
        """Close the HTTP client (a later lookup opens another)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    @property
    def _http(self) -> httpx.Client:
        if self._client is None:
            import httpx

            self._client = httpx.Client(timeout=self._timeout_s, transport=self._transport)
        return self._client

    def _fresh(self, stamp: float) -> bool:
        return self._clock() - stamp < self.ttl_s

    def _chunks_of(self, bucket: str, key: str) -> dict[int, int]:
        cached = self._chunks.get((bucket, key))
        if cached is None or not self._fresh(cached[0]):
            self._list(bucket, posixpath.dirname(key))
            cached = self._chunks.get((bucket, key))
        if cached is None or not self._fresh(cached[0]):  # not listed: ask for the entry
            cached = (self._clock(), self._entry(bucket, key))
            self._chunks[(bucket, key)] = cached
        return cached[1]

    def _list(self, bucket: str, directory: str) -> None:
        """Every entry of one directory, a page at a time."""
        path = f"{self.buckets_dir}/{bucket}/{directory}".rstrip("/") + "/"
        last = ""
        while True:
            params = {"limit": str(_PAGE), "lastFileName": last}
            reply = self._http.get(
                self.filer_url + quote(path), params=params, headers={"Accept": "application/json"}
            )
            if reply.status_code != 200:
                return  # listing refused (-disableDirListing) or no such directory
            page = reply.json()
            now = self._clock()
            for entry in page.get("Entries") or []:
                name = posixpath.basename(entry["FullPath"])
                relative = f"{directory}/{name}" if directory else name
                self._chunks[(bucket, relative)] = (now, _volumes(entry.get("chunks")))
            last = page.get("LastFileName") or ""
            if not page.get("ShouldDisplayLoadMore") or not last:
                return

    def _entry(self, bucket: str, key: str) -> dict[int, int]:
        path = quote(f"{self.buckets_dir}/{bucket}/{key}")
        reply = self._http.get(self.filer_url + path, params={"metadata": "true"})
        if reply.status_code == 404:
            return {}
        reply.raise_for_status()
        return _volumes(reply.json().get("chunks"))

    def _hosts_of(self, volume: int) -> tuple[str, ...]:
        cached = self._volumes.get(volume)
        if cached is None or not self._fresh(cached[0]):
            reply = self._http.get(self.master_url + "/dir/lookup", params={"volumeId": volume})
            locations: list[dict[str, Any]] = []
            if reply.status_code == 200:  # else the volume is gone: nobody holds it
                locations = reply.json().get("locations") or []
            # publicUrl first: where a volume server says it is reached from outside (a
            # node's address in Kubernetes, where url is the pod's); url as well.
            addresses = [a for loc in locations for a in (loc.get("publicUrl"), loc["url"]) if a]
            hosts = tuple(dict.fromkeys(_host(address) for address in addresses))
            cached = (self._clock(), hosts)
            self._volumes[volume] = cached
        return cached[1]

    def _warn(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "placement lookup at %s failed (%s); its objects are unplaced while it fails",
                self.filer_url,
                exc,
            )


def _volumes(chunks: Sequence[Mapping[str, Any]] | None) -> dict[int, int]:
    """Bytes per volume id of an entry's chunks (``file_id`` is ``VOLUME,KEYCOOKIE``)."""
    volumes: dict[int, int] = {}
    for chunk in chunks or []:
        volume = int(str(chunk["file_id"]).split(",", 1)[0])
        volumes[volume] = volumes.get(volume, 0) + int(chunk.get("size", 0))
    return volumes


def _host(address: str) -> str:
    return urlsplit(f"//{address}").hostname or address


PLACEMENTS: dict[str, Callable[[Mapping[str, str]], Placement]] = {
    "seaweedfs": SeaweedPlacement.from_options,
}


def parse_placement(spec: str) -> Placement | None:
    """A placement from ``NAME:option=value,...`` (``""`` or ``none``: no placement).

    Raises:
        ValueError: An unknown name (the message lists the known ones) or bad options.
    """
    spec = spec.strip()
    if spec in ("", "none"):
        return None
    name, _, rest = spec.partition(":")
    factory = PLACEMENTS.get(name)
    if factory is None:
        known = ", ".join(sorted(PLACEMENTS))
        raise ValueError(f"unknown placement {name!r}; the known ones are: {known}, none")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        option, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"a placement option is NAME=VALUE, not {item!r}")
        options[option.strip()] = value.strip()
    return factory(options)
