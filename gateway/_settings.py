"""The gateway's configuration: one immutable value, read from the environment at the edge."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hapi.planner import parse_bandwidth, parse_size

from ._sigv4 import Credentials

ENV_BACKEND_URL = "HAPI_BACKEND_URL"
ENV_BACKEND_KEY = "HAPI_BACKEND_ACCESS_KEY_ID"
ENV_BACKEND_SECRET = "HAPI_BACKEND_SECRET_ACCESS_KEY"
ENV_CLIENT_KEY = "HAPI_ACCESS_KEY_ID"
ENV_CLIENT_SECRET = "HAPI_SECRET_ACCESS_KEY"
ENV_CREDENTIALS_FILE = "HAPI_CREDENTIALS_FILE"


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """Everything the gateway needs to know, validated once.

    Attributes:
        backend_url: Base URL of the S3 store behind the gateway.
        backend_credentials: What the gateway signs upstream requests with.
        client_secrets: Access key id -> secret key, the credentials clients may sign with.
        allow_anonymous: Forward unsigned requests (signed upstream with the backend
            credentials). Off unless asked for explicitly.
        region: Region used when signing upstream.
        virtual_host_domains: Domains under which ``BUCKET.DOMAIN`` hosts address a
            bucket (virtual-hosted style); path style always works.
        max_skew_s: Largest accepted difference between a request's date and our clock.
        connect_timeout_s: Upstream connect timeout.
        read_timeout_s: Upstream read timeout (between bytes, not for a whole body).
        max_upstream_connections: Size of the upstream connection pool.
        registry_bucket: Bucket of the store that holds the model registry.
        memory_budget_bytes: Inference memory budget on CPU (on a GPU, its free memory).
        max_queue_delay_ms: Longest a sample waits for a fuller storage-side batch.
        max_queue_samples: Queued samples per tenant beyond which requests get SlowDown.
        max_object_bytes: Most object bytes one pushdown request fetches and holds: one
            object, or a batch's objects together.
        max_request_samples: Most samples one pushdown request may have (a shard's image
            members, or all samples of a batch); counted before decoding, 400 over it.
        max_batch_keys: Most keys in one batch request (``POST ?hapi-batch``).
        max_decoded_bytes: Decoded-bytes budget per pushdown request: its samples are
            decoded, run and sent in windows whose inputs, activations and outputs fit in it.
        max_image_pixels: Largest image (width x height) decoded; bombs are refused.
        decode_workers: Threads decoding and preprocessing (0: one per core).
        device: ``auto`` (CUDA when usable), ``cpu`` or ``cuda``.
        intra_op_threads: onnxruntime threads per operator (0: onnxruntime decides).
        assumed_bandwidth_bps: The client link ``split=auto`` plans for when a request does
            not say (``x-hapi-bandwidth``).
        fixed_batch_size: Use this storage-side batch size instead of the adaptive one
            (for benchmarks and comparisons; the adaptive size is the default).
    """

    backend_url: str
    backend_credentials: Credentials
    client_secrets: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    allow_anonymous: bool = False
    region: str = "us-east-1"
    virtual_host_domains: tuple[str, ...] = ("localhost",)
    max_skew_s: float = 900.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    max_upstream_connections: int = 256
    registry_bucket: str = "hapi-models"
    memory_budget_bytes: int = 2 * 1024**3
    max_queue_delay_ms: float = 4.0
    max_queue_samples: int = 4096
    max_object_bytes: int = 256 * 1024**2
    max_request_samples: int = 4096
    max_batch_keys: int = 4096
    max_decoded_bytes: int = 128 * 1024**2
    max_image_pixels: int = 64_000_000
    decode_workers: int = 0
    device: str = "auto"
    intra_op_threads: int = 0
    fixed_batch_size: int | None = None
    assumed_bandwidth_bps: float = 1e9

    def __post_init__(self) -> None:
        if not self.backend_url.startswith(("http://", "https://")):
            raise ValueError(
                f"backend URL must start with http:// or https://: {self.backend_url!r}"
            )
        object.__setattr__(self, "backend_url", self.backend_url.rstrip("/"))
        object.__setattr__(self, "client_secrets", MappingProxyType(dict(self.client_secrets)))
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
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
        if not self.client_secrets and not self.allow_anonymous:
            raise ValueError(
                "no client credentials: set HAPI_ACCESS_KEY_ID and HAPI_SECRET_ACCESS_KEY, "
                "a credentials file, or allow anonymous access explicitly"
            )

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> GatewaySettings:
        """Build settings from ``HAPI_*`` variables; keyword overrides (e.g. CLI flags) win.

        Raises:
            ValueError: A required value is missing or invalid.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if ENV_BACKEND_URL in env:
            values["backend_url"] = env[ENV_BACKEND_URL]
        if ENV_BACKEND_KEY in env and ENV_BACKEND_SECRET in env:
            values["backend_credentials"] = Credentials(
                env[ENV_BACKEND_KEY], env[ENV_BACKEND_SECRET]
            )
        secrets = {}
        if env.get(ENV_CREDENTIALS_FILE):
            secrets.update(read_credentials_file(Path(env[ENV_CREDENTIALS_FILE])))
        if env.get(ENV_CLIENT_KEY) and env.get(ENV_CLIENT_SECRET):
            secrets[env[ENV_CLIENT_KEY]] = env[ENV_CLIENT_SECRET]
        values["client_secrets"] = secrets
        for name, (field_name, parse) in _TUNABLES.items():
            if env.get(name):
                try:
                    values[field_name] = parse(env[name])
                except ValueError as exc:
                    raise ValueError(f"{name}={env[name]!r}: {exc}") from exc
        values.update({k: v for k, v in overrides.items() if v is not None})
        for required in ("backend_url", "backend_credentials"):
            if required not in values:
                raise ValueError(f"missing {required.replace('_', ' ')}: see `hapi serve --help`")
        return cls(**values)

    def with_changes(self, **changes: Any) -> GatewaySettings:
        """A copy with some fields replaced (settings are immutable)."""
        return replace(self, **changes)


_TUNABLES: dict[str, tuple[str, Any]] = {
    "HAPI_MEMORY_BUDGET": ("memory_budget_bytes", parse_size),
    "HAPI_MAX_QUEUE_DELAY_MS": ("max_queue_delay_ms", float),
    "HAPI_MAX_QUEUE_SAMPLES": ("max_queue_samples", int),
    "HAPI_MAX_OBJECT_BYTES": ("max_object_bytes", parse_size),
    "HAPI_MAX_REQUEST_SAMPLES": ("max_request_samples", int),
    "HAPI_MAX_BATCH_KEYS": ("max_batch_keys", int),
    "HAPI_MAX_DECODED_BYTES": ("max_decoded_bytes", parse_size),
    "HAPI_DEVICE": ("device", str),
    "HAPI_REGISTRY_BUCKET": ("registry_bucket", str),
    "HAPI_FIXED_BATCH_SIZE": ("fixed_batch_size", int),
    "HAPI_DOMAINS": (
        "virtual_host_domains",
        lambda text: tuple(d.strip() for d in text.split(",") if d.strip()),
    ),
    "HAPI_ASSUMED_BANDWIDTH": ("assumed_bandwidth_bps", lambda text: float(parse_bandwidth(text))),
}


def read_credentials_file(path: Path) -> dict[str, str]:
    """Read client credentials: a JSON object ``{"ACCESS_KEY_ID": "SECRET", ...}``.

    Raises:
        ValueError: The file is missing, not JSON, or not a flat string mapping.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read credentials file {path}: {exc}") from exc
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ValueError(f"credentials file {path} must be a JSON object of key id -> secret")
    return data
