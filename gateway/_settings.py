"""The gateway's configuration: one immutable value, read from the environment at the edge."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from hapi.models import DECODERS, Device
from hapi.protocol import Credentials
from hapi.store import parse_placement

from ._identities import ClientKey, read_credentials_file
from ._knobs import Knob, from_environment, knob, knobs

ENV_BACKEND_KEY = "HAPI_BACKEND_ACCESS_KEY_ID"
ENV_BACKEND_SECRET = "HAPI_BACKEND_SECRET_ACCESS_KEY"
ENV_CLIENT_KEY = "HAPI_ACCESS_KEY_ID"
ENV_CLIENT_SECRET = "HAPI_SECRET_ACCESS_KEY"
ENV_ADMIN_KEY = "HAPI_ADMIN_ACCESS_KEY_ID"
ENV_ADMIN_SECRET = "HAPI_ADMIN_SECRET_ACCESS_KEY"
# The conventional key pairs: variables that fill a credentials field without a file.
CREDENTIAL_PAIRS = {
    "backend_credentials": (ENV_BACKEND_KEY, ENV_BACKEND_SECRET),
    "client": (ENV_CLIENT_KEY, ENV_CLIENT_SECRET),
    "admin": (ENV_ADMIN_KEY, ENV_ADMIN_SECRET),
}


ConvSearch = Literal["exhaustive", "heuristic", "default"]
"""How cuDNN picks convolution algorithms (``hapi.models.RuntimeSettings.conv_search``'s values;
the type checker holds the two spellings equal where the gateway passes it on)."""


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """Everything the gateway needs to know, validated once.

    Each field has one environment variable and one ``hapi serve`` flag, generated from
    the field (see ``_knobs``); the first line of each entry below is its help.

    Attributes:
        backend_url: URL of the S3 store behind the gateway.
        backend_credentials: What the gateway signs upstream requests with: a JSON file
            {"KEY_ID": "SECRET"} with one entry, or HAPI_BACKEND_ACCESS_KEY_ID and
            HAPI_BACKEND_SECRET_ACCESS_KEY.
        clients: The keys clients may sign with, each with its role (admin or client) and
            the store identity it acts as upstream: a JSON credentials file (see
            docs/security.md), and/or HAPI_ACCESS_KEY_ID and HAPI_SECRET_ACCESS_KEY (a
            client) and HAPI_ADMIN_ACCESS_KEY_ID and HAPI_ADMIN_SECRET_ACCESS_KEY (an
            admin), both acting as the backend identity upstream.
        allow_anonymous: Forward unsigned requests upstream unsigned, so the store's ACLs and
            bucket policies judge them (the backend credentials never sign for an anonymous
            caller); off refuses them at the gateway with 403 AccessDenied.
        region: The region clients sign for (a request signed for another is refused, as
            AWS refuses it) and the gateway signs upstream with (the store's region).
        virtual_host_domains: Domains under which BUCKET.DOMAIN hosts address a bucket
            (virtual-hosted style; path style always works); repeatable or comma-separated.
        max_skew_s: Largest accepted difference, in seconds, between a signed request's date
            and the gateway's clock.
        connect_timeout_s: Upstream connect timeout, in seconds.
        read_timeout_s: Upstream read timeout, in seconds (between bytes, not for a whole
            body).
        max_upstream_connections: Size of the upstream connection pool.
        registry_bucket: Bucket of the store that holds the model registry.
        memory_budget_bytes: Inference memory on CPU, e.g. 2GiB (on a GPU, its free memory).
        max_queue_delay_ms: How long a sample may wait for requests on their way to fill
            its storage-side batch, in ms; a batch expected to run longer waits up to a
            quarter of its run time.
        max_queue_samples: Queued samples per model beyond which requests get SlowDown.
        identity_requests_per_s: Pushdown requests one identity (an access key, or all
            unsigned callers together) may make per second and per gateway process, with
            bursts of one second's worth; beyond it, 503 SlowDown with Retry-After (0: no
            limit).
        identity_upstream_requests: Pass-through requests one identity may have at the
            store at once (of the max_upstream_connections pool), so slow reads by one key
            cannot hold the whole pool; beyond it, 503 SlowDown with Retry-After (0: no
            limit).
        identity_pushdown_requests: Pushdown requests one identity may have in progress at
            once; beyond it, 503 SlowDown with Retry-After (0: no limit).
        max_object_bytes: Most object bytes one pushdown request fetches and holds (one
            object, or a batch's objects together), e.g. 256MiB.
        max_request_samples: Most samples one pushdown request may have (a shard's image
            members, or all samples of a batch); counted before decoding, 400 over it.
        max_batch_keys: Most keys in one batch request (POST ?hapi-batch).
        max_decoded_bytes: Decoded-bytes budget per pushdown request, e.g. 128MiB: its
            samples are decoded, run and sent in windows whose inputs, activations and
            outputs fit in it.
        max_image_pixels: Largest image (width x height) decoded; bombs are refused.
        decode_workers: Threads decoding and preprocessing (0: one per core).
        decode_processes: Worker processes that decode and preprocess Pillow's images off
            the gateway's interpreter lock, each thread handing its sample to one (0: the
            threads decode themselves).
        decoder: What decodes pushdown images: auto (dali-gpu where the blocks run on CUDA
            and NVIDIA DALI is installed, else pil), pil, dali-cpu or dali-gpu. DALI's
            pixels differ slightly from Pillow's, so each decoder has its own cache entries.
        device: Where blocks run: auto (CUDA when usable), cpu or cuda.
        intra_op_threads: onnxruntime threads per operator (0: onnxruntime decides).
        compute_niceness: Nice steps below the gateway's request handling at which
            pushdown's decoding and blocks run (Linux; 0-19, 0: the same; decoding goes
            decode_niceness further), so a node busy with pushdown serves pass-through
            requests and cache hits first.
        decode_niceness: Nice steps below compute_niceness at which pushdown's decoding
            runs (Linux; the two together at most 19; 0: with the blocks), so a window
            already decoded runs its blocks before a newer request's images decode.
        tf32: On a GPU, let convolutions and matrix products run in TF32: faster, but
            features then differ from float32's by about 1e-3 of their largest value.
        conv_search: On a GPU, how each convolution's cuDNN algorithm is picked:
            heuristic (cuDNN's heuristics, no timing), exhaustive (time every one for
            each new batch size, which the gateway's batches change often) or default
            (one fixed algorithm).
        fixed_batch_size: A fixed storage-side batch size instead of the adaptive one (for
            benchmarks and comparisons).
        assumed_bandwidth_bps: The client link split=auto plans for when a request does not
            say (x-hapi-bandwidth), e.g. 10gbit.
        public_control: Serve /_hapi/* without signatures (for operators who protect it
            otherwise); /_hapi/live and /_hapi/health are always open.
        public_metrics: Serve /metrics without signatures (for a Prometheus scraper).
        max_probe_bytes: Largest bandwidth probe (/_hapi/probe?bytes=N) per call, e.g. 256MiB.
        probe_bytes_per_minute: Probe bytes one credential may draw per minute; beyond it,
            SlowDown with Retry-After.
        max_header_bytes: Largest request head (request line and headers), e.g. 64KiB;
            larger ones get 431 and the connection is closed.
        header_timeout_s: Longest a client may take to send a request head, in seconds;
            slower connections are closed.
        keep_alive_timeout_s: Seconds an idle kept-alive client connection stays open.
        max_connections: Client connections served at once, per worker; requests beyond get
            503 SlowDown.
        workers: Gateway processes sharing the port; each gets 1/workers of the memory
            budget.
        cache_enabled: Look features up in (and write them to) the feature cache.
        cache_bucket: The bucket of the store that holds the feature cache.
        cache_max_bytes: Size cap of the feature cache, e.g. 50GB (0: none); least recently
            used entries are evicted beyond it.
        cache_write_queue: Entries waiting to be written; a full queue skips a write.
        cache_write_queue_bytes: Bytes of entries waiting to be written, e.g. 256MiB;
            beyond it a write is skipped (the answer is still served).
        cache_memory_bytes: Bytes of the packs this gateway process wrote that it keeps in
            memory, e.g. 256MiB, so their entries' hits read no bytes from the store (the
            least recently written go first; 0: every hit reads its entry from the store).
        identity_cache_write_bytes: Bytes of entries one identity's requests may have
            waiting to be written, e.g. 64MiB; beyond it that identity's writes are skipped,
            so one key cannot fill the queue for the others (0: no limit of its own).
        cache_write_defer_s: How long (seconds) an entry write waits for the gateway to
            serve no pushdown request for a quarter of a second, so that a cold epoch's
            writes use the storage side's idle time (0: write at once); a queue three
            quarters full writes at once.
        cache_cold_probe: In a cold context (16 misses in a row: the same bucket, blocks,
            dtype and view), look up one object in this many and fetch the others at once,
            as without the cache; a probe that hits warms the context (1: look every
            object up).
        cache_touch_s: A hit on an entry older than this (seconds) refreshes its last use.
        cache_prune_interval_s: Seconds between checks of the cache against its size cap.
        cache_secret: A file holding the secret cache entries are authenticated with (the
            same for every gateway of a store); by default one derived from the backend
            secret.
        placement: The store's placement lookup, the SDK's spec (e.g.
            seaweedfs:filer=URL,master=URL; docs/cluster.md): with the node address, each
            object pushdown fetches is counted in /metrics as local (this node holds it) or
            remote (another node does); else as unknown.
        node_address: The address this node's volume server advertises (host, host:port or
            URL; several comma-separated), by which the placement lookup names this node.
    """

    backend_url: str = field(metadata=knob(env="HAPI_BACKEND_URL", flag="--backend"))
    backend_credentials: Credentials = field(
        metadata=knob(
            env="HAPI_BACKEND_CREDENTIALS_FILE",
            flag="--backend-credentials-file",
            parse=lambda path: read_backend_credentials(Path(path)),
        )
    )
    clients: Mapping[str, ClientKey] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata=knob(
            env="HAPI_CREDENTIALS_FILE",
            flag="--credentials-file",
            parse=lambda path: read_credentials_file(Path(path)),
            shown_default="none",
        ),
    )
    allow_anonymous: bool = True
    region: str = "us-east-1"
    virtual_host_domains: tuple[str, ...] = field(
        default=("localhost",), metadata=knob(env="HAPI_DOMAINS", flag="--domain")
    )
    max_skew_s: float = 900.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    max_upstream_connections: int = 256
    registry_bucket: str = "hapi-models"
    memory_budget_bytes: int = field(
        default=2 * 1024**3,
        metadata=knob(env="HAPI_MEMORY_BUDGET", flag="--memory-budget", shown_default="2GiB"),
    )
    max_queue_delay_ms: float = 4.0
    max_queue_samples: int = 4096
    identity_requests_per_s: float = 0.0
    identity_upstream_requests: int = 128
    identity_pushdown_requests: int = 32
    max_object_bytes: int = field(default=256 * 1024**2, metadata=knob(shown_default="256MiB"))
    max_request_samples: int = 4096
    max_batch_keys: int = 4096
    max_decoded_bytes: int = field(default=128 * 1024**2, metadata=knob(shown_default="128MiB"))
    max_image_pixels: int = 64_000_000
    decode_workers: int = 0
    decode_processes: int = 0
    decoder: str = "auto"
    device: Device = "auto"
    intra_op_threads: int = 0
    compute_niceness: int = 10
    decode_niceness: int = 5
    tf32: bool = False
    conv_search: ConvSearch = "heuristic"
    fixed_batch_size: int | None = None
    assumed_bandwidth_bps: float = field(
        default=1e9,
        metadata=knob(
            env="HAPI_ASSUMED_BANDWIDTH", flag="--assumed-bandwidth", shown_default="1gbit"
        ),
    )
    public_control: bool = False
    public_metrics: bool = False
    max_probe_bytes: int = field(default=256 * 1024**2, metadata=knob(shown_default="256MiB"))
    probe_bytes_per_minute: int = field(default=1024**3, metadata=knob(shown_default="1GiB"))
    max_header_bytes: int = field(default=64 * 1024, metadata=knob(shown_default="64KiB"))
    header_timeout_s: float = 30.0
    keep_alive_timeout_s: int = 20
    max_connections: int = 1024
    workers: int = 1
    cache_enabled: bool = True
    cache_bucket: str = "hapi-cache"
    cache_max_bytes: int = 0
    cache_write_queue: int = 256
    cache_write_queue_bytes: int = field(
        default=256 * 1024**2, metadata=knob(shown_default="256MiB")
    )
    cache_memory_bytes: int = field(default=256 * 1024**2, metadata=knob(shown_default="256MiB"))
    identity_cache_write_bytes: int = field(
        default=64 * 1024**2, metadata=knob(shown_default="64MiB")
    )
    cache_write_defer_s: float = 30.0
    cache_cold_probe: int = 8
    cache_touch_s: float = 3600.0
    cache_prune_interval_s: float = 300.0
    cache_secret: str | None = field(
        default=None,
        repr=False,
        metadata=knob(
            env="HAPI_CACHE_SECRET_FILE",
            flag="--cache-secret-file",
            parse=lambda path: read_secret_file(Path(path)),
            shown_default="derived from the backend secret",
        ),
    )
    placement: str = field(default="", metadata=knob(shown_default="none"))
    node_address: str = field(default="", metadata=knob(shown_default="none"))

    def __post_init__(self) -> None:
        if not self.backend_url.startswith(("http://", "https://")):
            raise ValueError(
                f"backend URL must start with http:// or https://: {self.backend_url!r}"
            )
        object.__setattr__(self, "backend_url", self.backend_url.rstrip("/"))
        object.__setattr__(self, "clients", MappingProxyType(dict(self.clients)))
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.decoder not in ("auto", *DECODERS):
            raise ValueError(f"decoder must be auto, {', '.join(DECODERS)}, not {self.decoder!r}")
        limits = (
            self.memory_budget_bytes,
            self.max_queue_samples,
            self.max_object_bytes,
            self.max_request_samples,
            self.max_batch_keys,
            self.max_decoded_bytes,
        )
        if min(limits) <= 0:
            raise ValueError(
                "memory budget, queue bound and the per-request limits "
                "(object bytes, samples, batch keys, decoded bytes) must be positive"
            )
        if min(self.max_probe_bytes, self.probe_bytes_per_minute, self.max_skew_s) <= 0:
            raise ValueError("probe limits and the clock skew must be positive")
        identity_bounds = (
            self.identity_upstream_requests,
            self.identity_pushdown_requests,
            self.identity_cache_write_bytes,
        )
        if min(identity_bounds) < 0 or self.cache_write_queue_bytes <= 0:
            raise ValueError(
                "the per-identity bounds must be 0 (no limit) or positive, and the cache "
                "write queue's bytes positive"
            )
        if self.cache_memory_bytes < 0:
            raise ValueError("cache_memory_bytes must be 0 (none) or positive")
        if self.identity_requests_per_s < 0:
            raise ValueError("identity_requests_per_s must be 0 (no limit) or positive")
        if self.decode_workers < 0 or self.decode_processes < 0:
            raise ValueError("decode_workers and decode_processes must be 0 or positive")
        if self.conv_search not in typing.get_args(ConvSearch):
            raise ValueError(f"conv_search must be {', '.join(typing.get_args(ConvSearch))}")
        if not 0 <= self.compute_niceness <= 19:
            raise ValueError("compute_niceness must be 0 (the requests' priority) to 19")
        if not 0 <= self.decode_niceness <= 19 - self.compute_niceness:
            raise ValueError(
                f"decode_niceness must be 0 (with the blocks) to {19 - self.compute_niceness}"
                f" (19 less compute_niceness, {self.compute_niceness})"
            )
        if self.cache_cold_probe < 1:
            raise ValueError("cache_cold_probe must be 1 (look every object up) or more")
        if not 0 <= self.cache_write_defer_s < float("inf"):
            raise ValueError("cache_write_defer_s must be 0 (write at once) or positive")
        edge = (self.max_header_bytes, self.header_timeout_s, self.keep_alive_timeout_s)
        if min(*edge, self.max_connections, self.workers) <= 0:
            raise ValueError(
                "header size and timeouts, connection limit and workers must be positive"
            )
        try:
            parse_placement(self.placement)
        except ValueError as exc:
            raise ValueError(f"placement {self.placement!r} (HAPI_PLACEMENT): {exc}") from exc
        if not self.clients and not self.allow_anonymous:
            raise ValueError(
                "no client credentials and anonymous requests refused: nothing to serve"
            )

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> GatewaySettings:
        """Build settings from ``HAPI_*`` variables; typed keyword overrides (flags) win.

        Raises:
            ValueError: A required value is missing or invalid.
        """
        env = os.environ if environ is None else environ
        values = from_environment(settings_knobs(), env)
        key, secret = CREDENTIAL_PAIRS["backend_credentials"]
        if "backend_credentials" not in values and key in env and secret in env:
            values["backend_credentials"] = Credentials(env[key], env[secret])
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["clients"] = {**values.get("clients", {}), **_paired_keys(env)}
        for required in ("backend_url", "backend_credentials"):
            if required not in values:
                raise ValueError(f"missing {required.replace('_', ' ')}: see `hapi serve --help`")
        if not values["clients"] and values.get("allow_anonymous") is not True:
            # A gateway for unsigned requests only must be asked for, not fallen into.
            raise ValueError(
                "no client credentials: set HAPI_ACCESS_KEY_ID and HAPI_SECRET_ACCESS_KEY, "
                "a credentials file, or serve unsigned requests only with --allow-anonymous "
                "(HAPI_ALLOW_ANONYMOUS=1)"
            )
        return cls(**values)

    def with_changes(self, **changes: Any) -> GatewaySettings:
        """A copy with some fields replaced (settings are immutable)."""
        return replace(self, **changes)

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        # Worker processes are spawned and receive the settings pickled; a mapping proxy
        # cannot be pickled, so the secrets travel as a dict.
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["clients"] = dict(self.clients)
        return _rebuild, (values,)

    @functools.cached_property
    def client_secrets(self) -> Mapping[str, str]:
        """The secret of every client key, by key id (what signatures are verified with)."""
        return MappingProxyType({key_id: key.secret for key_id, key in self.clients.items()})

    @functools.cached_property
    def cache_mac_key(self) -> bytes:
        """The key cache entries are authenticated with: the configured cache secret, or
        one derived from the backend secret (which every gateway of a store shares and no
        client holds). Never logged."""
        secret = self.cache_secret or self.backend_credentials.secret_access_key
        return hmac.new(secret.encode(), b"hapi feature cache entries v1", hashlib.sha256).digest()


def _rebuild(values: dict[str, Any]) -> GatewaySettings:
    return GatewaySettings(**values)


@functools.cache
def settings_knobs() -> tuple[Knob, ...]:
    """One environment variable and one ``hapi serve`` flag per settings field."""
    return knobs(GatewaySettings)


def environment_variables() -> frozenset[str]:
    """Every environment variable the gateway's settings read."""
    pairs = {name for pair in CREDENTIAL_PAIRS.values() for name in pair}
    return frozenset({item.env for item in settings_knobs()} | pairs)


def _paired_keys(env: Mapping[str, str]) -> dict[str, ClientKey]:
    """The client and admin keys given by their variable pairs (both act upstream as the
    backend identity)."""
    keys = {}
    for role in ("client", "admin"):
        key, secret = CREDENTIAL_PAIRS[role]
        if env.get(key) and env.get(secret):
            keys[env[key]] = ClientKey(env[secret], "admin" if role == "admin" else "client")
    return keys


def read_backend_credentials(path: Path) -> Credentials:
    """Read the backend credential: a flat JSON file ``{"KEY_ID": "SECRET"}`` with exactly
    one entry.

    Raises:
        ValueError: The file is unreadable or does not hold exactly one key pair.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read backend credentials file {path}: {exc}") from exc
    if not isinstance(data, dict) or len(data) != 1:
        raise ValueError(f"backend credentials file {path} must hold exactly one key pair")
    ((key_id, secret),) = data.items()
    if not isinstance(key_id, str) or not isinstance(secret, str):
        raise ValueError(f"backend credentials file {path} must map a key id to its secret")
    return Credentials(key_id, secret)


def read_secret_file(path: Path) -> str:
    """A secret kept in a file of its own (its first line; surrounding blanks dropped).

    Raises:
        ValueError: The file is unreadable or empty.
    """
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read secret file {path}: {exc}") from exc
    if not text:
        raise ValueError(f"secret file {path} is empty")
    return text.splitlines()[0]
