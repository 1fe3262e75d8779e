"""Pushdown: a GET naming a model and a split returns features instead of the object.

``GET /{bucket}/{key}`` with ``x-hapi-model`` / ``x-hapi-split`` (or ``hapi-*`` query
parameters) on an image or a WebDataset tar shard, and ``POST /{bucket}?hapi-batch`` with
a JSON list of keys. The gateway fetches the objects from the backend, decodes and
preprocesses them in a worker pool (off the event loop), runs blocks ``[0, split)``
through the shared batcher, and answers with safetensors (or a JSON summary).
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import parse_qsl
from xml.etree import ElementTree

import httpx
import numpy as np

from hapi import planner
from hapi.models import WIRE_DTYPES as DTYPES
from hapi.models import Manifest, ObjectIdentity, Sample, UndecodableObject, decode_object
from hapi.models import encode_features as encode

from ._addressing import object_path
from ._cache import FeatureCache, identity_from, parse_mode
from ._cached import lookup_all, merge, per_key, store_all
from ._errors import (
    BackendError,
    InsufficientMemory,
    InvalidArgument,
    S3Error,
    ServiceUnavailable,
    UnprocessableObject,
)
from ._metrics import Metrics
from ._settings import GatewaySettings
from ._sigv4 import sign_request
from ._tenants import Tenants
from ._types import ASGIReceive, ASGISend

T = TypeVar("T")
FORMATS = ("safetensors", "json")
_MAX_BATCH_BODY = 1024 * 1024
_FETCH_CONCURRENCY = 32


@dataclass(frozen=True)
class Params:
    """What a pushdown request asks for."""

    model: str
    split: int | None  # None: ``auto``, the planner chooses
    dtype: str = "float32"
    format: str = "safetensors"
    bandwidth_bps: float | None = None  # the client's link, for ``auto``
    cache: str = "use"  # ``use``, ``bypass`` or ``refresh`` the feature cache


def parse_params(headers: Mapping[str, str], raw_query: str) -> Params | None:
    """Pushdown parameters from ``x-hapi-*`` headers or ``hapi-*`` query parameters.

    Returns:
        None when the request names no model (a plain read).

    Raises:
        InvalidArgument: A parameter is missing or invalid.
    """
    query = dict(parse_qsl(raw_query, keep_blank_values=True))

    def get(name: str) -> str | None:
        return headers.get(f"x-{name}") or query.get(name)

    model = get("hapi-model")
    if not model:
        return None
    return make_params(
        model,
        get("hapi-split"),
        get("hapi-dtype"),
        get("hapi-format"),
        get("hapi-bandwidth"),
        get("hapi-cache"),
    )


def make_params(
    model: str, split: Any, dtype: Any, fmt: Any, bandwidth: Any = None, cache: Any = None
) -> Params:
    """Validate pushdown parameters (from headers, query or a batch body)."""
    if split is None:
        raise InvalidArgument(
            "a pushdown request needs x-hapi-split (an integer 0..freeze, or auto)"
        )
    try:
        mode = parse_mode(cache)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if split == "auto":
        return Params(model, None, *_dtype_format(dtype, fmt), _bandwidth(bandwidth), mode)
    try:
        index = int(split)
    except (TypeError, ValueError):
        raise InvalidArgument(f"x-hapi-split must be an integer, not {split!r}") from None
    if index < 0:
        raise InvalidArgument(f"x-hapi-split must be >= 0, not {index}")
    return Params(model, index, *_dtype_format(dtype, fmt), None, mode)


def _dtype_format(dtype: Any, fmt: Any) -> tuple[str, str]:
    dtype = dtype or "float32"
    if dtype not in DTYPES:
        raise InvalidArgument(f"x-hapi-dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    fmt = fmt or "safetensors"
    if fmt not in FORMATS:
        raise InvalidArgument(f"x-hapi-format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return dtype, fmt


def _bandwidth(text: Any) -> float | None:
    if text is None:
        return None
    try:
        return float(planner.parse_bandwidth(str(text)))
    except ValueError as exc:
        raise InvalidArgument(f"x-hapi-bandwidth: {exc}") from exc


@dataclass
class _Result:
    manifest: Manifest
    params: Params
    samples: list[Sample]
    features: np.ndarray
    errors: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    batch_size: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # samples per object key
    identities: dict[str, ObjectIdentity] = field(default_factory=dict)  # as fetched
    cache: str = "bypass"  # the x-hapi-cache answer: hit, miss or bypass


class Pushdown:
    """Serves pushdown requests.

    Args:
        settings: Gateway settings (backend URL and credentials, limits).
        client: Getter of the upstream HTTP client.
        tenants: Manifests, sessions and batchers.
        decode_pool: Worker threads for decoding and preprocessing.
        cache: The feature cache (``None``: none).
        metrics: Where object fetches are counted.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        client: Any,
        tenants: Tenants,
        decode_pool: Executor,
        cache: FeatureCache | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._client = client
        self.tenants = tenants
        self._decode_pool = decode_pool
        self.cache = cache
        self._signed = True

    def unsigned(self) -> Pushdown:
        """This pushdown fetching objects unsigned, for an anonymous caller: the store's
        ACLs and bucket policies judge each fetch as they would the caller's own GET."""
        view = copy.copy(self)
        view._signed = False
        return view

    async def get(
        self, send: ASGISend, receive: ASGIReceive, bucket: str, key: str, params: Params
    ) -> None:
        """Features of one object (an image, or every sample of a shard)."""
        result = await _cancel_on_disconnect(
            self._serve(bucket, [key], params, per_key_errors=False), receive
        )
        await _respond(send, result)

    async def batch(self, send: ASGISend, receive: ASGIReceive, bucket: str, body: bytes) -> None:
        """Features of several objects, stacked in key order; failures listed per key."""
        keys, params = _parse_batch(body)
        result = await _cancel_on_disconnect(
            self._serve(bucket, keys, params, per_key_errors=True), receive
        )
        await _respond(send, result)

    async def _serve(
        self, bucket: str, keys: Sequence[str], params: Params, *, per_key_errors: bool
    ) -> _Result:
        """The features of ``keys``: cached entries where there are, computed otherwise
        (and then written to the cache in the background)."""
        cache = self.cache
        if cache is None or not cache.enabled or params.cache == "bypass":
            return await self._features(bucket, keys, params, per_key_errors=per_key_errors)
        manifest = await self.tenants.manifest(params.model)
        params = self._resolved(manifest, params)
        assert params.split is not None
        split, dtype = params.split, params.dtype
        started = time.perf_counter()
        parts = await lookup_all(
            cache, bucket, keys, manifest, split, dtype, params.cache, signed=self._signed
        )
        lookup_ms = (time.perf_counter() - started) * 1000
        missing = [key for key in keys if key not in parts]
        result = _Result(manifest, params, [], np.zeros(0))
        if missing:
            result = await self._features(bucket, missing, params, per_key_errors=per_key_errors)
            fresh = per_key(missing, result.features, result.samples, result.counts)
            store_all(cache, manifest, split, dtype, fresh, result.identities)
            parts = {**parts, **fresh}
        result.features, result.samples = merge(keys, parts, _output_shape(manifest, split))
        result.params = params
        result.cache = "miss" if missing else "hit"
        result.timings = {"cache": lookup_ms, **result.timings}
        return result

    def _resolved(self, manifest: Manifest, params: Params) -> Params:
        if params.split is None:
            params = replace(params, split=self.choose_split(manifest, params))
        assert params.split is not None
        if params.split > manifest.freeze:
            raise InvalidArgument(
                f"x-hapi-split must be in 0..{manifest.freeze} for {manifest.ref}, not {params.split}"
            )
        return params

    async def _features(
        self, bucket: str, keys: Sequence[str], params: Params, *, per_key_errors: bool
    ) -> _Result:
        manifest = await self.tenants.manifest(params.model)
        params = self._resolved(manifest, params)
        assert params.split is not None
        batcher = await self.tenants.batcher(manifest, params.split) if params.split else None
        result = _Result(manifest, params, [], np.zeros(0))
        started = time.perf_counter()
        if batcher is not None:
            batcher.announce()
        try:
            samples = await self._load_all(bucket, keys, manifest, result, per_key_errors)
        except BaseException:
            if batcher is not None:
                batcher.withdraw()
            raise
        result.samples = samples
        result.timings["decode"] = (time.perf_counter() - started) * 1000 - result.timings.get(
            "fetch", 0.0
        )
        inputs = (
            np.stack([s.array for s in samples])
            if samples
            else np.zeros((0, *manifest.input.shape), np.float32)
        )
        started = time.perf_counter()
        if batcher is not None and len(inputs):
            result.features, result.batch_size = await batcher.submit(inputs, announced=True)
        else:
            if batcher is not None:
                batcher.withdraw()
            result.features = (
                inputs
                if batcher is None
                else np.zeros((0, *_output_shape(manifest, params.split)), np.float32)
            )
        result.timings["infer"] = (time.perf_counter() - started) * 1000
        return result

    def choose_split(self, manifest: Manifest, params: Params) -> int:
        """``split=auto``: the planner's best split on the gateway's view (its memory share
        and load; the client's bandwidth from ``x-hapi-bandwidth``, else the configured
        assumption). Raw objects are not an option here: the client asked for features.
        """
        budget = self.tenants.budget
        profile = planner.profile_from_manifest(
            manifest,
            storage_memory_bytes=budget.share(),
            storage_load=float(max(1, budget.active_tenants)),
            wire_dtype=params.dtype,
        )
        bandwidth = params.bandwidth_bps or self._settings.assumed_bandwidth_bps
        options = [
            c
            for c in planner.plan(manifest, profile, bandwidth).candidates
            if c.split is not None and c.feasible
        ]
        if not options:
            raise InsufficientMemory(
                f"no split of {manifest.ref} fits the storage side's memory budget"
            )
        best = min(options, key=lambda c: c.epoch_s).split
        assert best is not None
        return int(best)

    async def _load_all(
        self,
        bucket: str,
        keys: Sequence[str],
        manifest: Manifest,
        result: _Result,
        per_key_errors: bool,
    ) -> list[Sample]:
        limit = asyncio.Semaphore(_FETCH_CONCURRENCY)
        fetch_ms: list[float] = []

        async def one(key: str) -> list[Sample]:
            async with limit:
                started = time.perf_counter()
                data, identity = await self._fetch(bucket, key)
                fetch_ms.append((time.perf_counter() - started) * 1000)
            samples = await self._decode(data, manifest, f"{bucket}/{key}", key)
            result.counts[key] = len(samples)
            if identity is not None:
                result.identities[key] = identity
            return samples

        outcomes = await asyncio.gather(*(one(k) for k in keys), return_exceptions=True)
        result.timings["fetch"] = max(fetch_ms, default=0.0)
        samples: list[Sample] = []
        for key, outcome in zip(keys, outcomes, strict=True):
            if isinstance(outcome, S3Error) and per_key_errors:
                result.errors[key] = f"{outcome.code}: {outcome.message}"
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                samples.extend(outcome)
        return samples

    async def _fetch(self, bucket: str, key: str) -> tuple[bytes, ObjectIdentity | None]:
        # The whole object is needed before decoding can start (image codecs and tar
        # indexes want random access); objects are capped at max_object_bytes.
        url = self._settings.backend_url + object_path(bucket, key)
        if self._metrics is not None:
            self._metrics.object_fetches.inc()
        headers = (
            sign_request(
                method="GET",
                url=url,
                headers={},
                credentials=self._settings.backend_credentials,
                region=self._settings.region,
            )
            if self._signed
            else {}
        )
        try:
            async with self._client().stream("GET", url, headers=headers) as reply:
                if reply.status_code != 200:
                    raise _backend_error(reply.status_code, await reply.aread(), f"/{bucket}/{key}")
                size = int(reply.headers.get("content-length", "0"))
                if size > self._settings.max_object_bytes:
                    raise UnprocessableObject(
                        f"object is {size} bytes, over the pushdown limit of {self._settings.max_object_bytes}",
                        resource=f"/{bucket}/{key}",
                    )
                return bytes(await reply.aread()), identity_from(bucket, key, reply.headers)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(
                f"the backend store cannot be reached: {exc!r}", retry_after=1
            ) from exc

    async def _decode(self, data: bytes, manifest: Manifest, name: str, key: str) -> list[Sample]:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._decode_pool,
                lambda: decode_object(
                    data, manifest.preprocess, key=key, max_pixels=self._settings.max_image_pixels
                ),
            )
        except UndecodableObject as exc:
            raise UnprocessableObject(
                f"{exc} (model {manifest.ref} needs an image or a tar shard)", resource=f"/{name}"
            ) from exc


def _parse_batch(body: bytes) -> tuple[list[str], Params]:
    if len(body) > _MAX_BATCH_BODY:
        raise InvalidArgument(f"a batch body is limited to {_MAX_BATCH_BODY} bytes")
    try:
        spec = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"the batch body is not JSON: {exc}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("keys"), list) or not spec["keys"]:
        raise InvalidArgument(
            'a batch body is {"keys": [...], "model": ..., "split": ..., "dtype": ...}'
        )
    keys = spec["keys"]
    if not all(isinstance(k, str) and k for k in keys):
        raise InvalidArgument("batch keys must be non-empty strings")
    if not isinstance(spec.get("model"), str):
        raise InvalidArgument("the batch body needs a model name")
    return keys, make_params(
        spec["model"],
        spec.get("split"),
        spec.get("dtype"),
        spec.get("format"),
        spec.get("bandwidth"),
        spec.get("cache"),
    )


def _backend_error(status: int, body: bytes, resource: str) -> S3Error:
    try:
        root = ElementTree.fromstring(body)
        code, message = root.findtext("Code") or "BackendError", root.findtext("Message") or ""
    except ElementTree.ParseError:
        code, message = "BackendError", body[:200].decode(errors="replace")
    return BackendError(
        code, status, message or f"the backend answered HTTP {status}", resource=resource
    )


def _output_shape(manifest: Manifest, split: int) -> tuple[int, ...]:
    return (
        tuple(manifest.input.shape)
        if split == 0
        else tuple(manifest.blocks[split - 1].output_shape)
    )


async def _cancel_on_disconnect(work: Awaitable[T], receive: ASGIReceive) -> T:
    """Run ``work`` but cancel it if the client goes away (its queued samples are dropped)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            raise ConnectionAbortedError("client disconnected during pushdown")
        return task.result()
    finally:
        watcher.cancel()


async def _disconnected(receive: ASGIReceive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _respond(send: ASGISend, result: _Result) -> None:
    manifest, params = result.manifest, result.params
    shape = ",".join(str(n) for n in result.features.shape)
    timing = ", ".join(f"{name};dur={ms:.2f}" for name, ms in result.timings.items())
    if params.format == "json":
        body, content_type = json.dumps(_summary(result), indent=1).encode(), b"application/json"
    else:
        body, content_type = _safetensors(result), b"application/octet-stream"
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"x-hapi-model", manifest.ref.encode()),
        (b"x-hapi-split", str(params.split).encode()),
        (b"x-hapi-shape", shape.encode()),
        (b"x-hapi-dtype", params.dtype.encode()),
        (b"x-hapi-batch-size", str(result.batch_size).encode()),
        (b"x-hapi-cache", result.cache.encode()),
        (b"server-timing", timing.encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _labels(samples: list[Sample]) -> np.ndarray | None:
    if not any(s.label is not None for s in samples):
        return None
    return np.array([-1 if s.label is None else s.label for s in samples], dtype=np.int64)


def _metadata(result: _Result) -> dict[str, str]:
    meta = {
        "model": result.manifest.name,
        "version": str(result.manifest.version),
        "split": str(result.params.split),
        "keys": json.dumps([s.key for s in result.samples]),
    }
    if result.errors:
        meta["errors"] = json.dumps(result.errors)
    if any(s.meta for s in result.samples):
        meta["samples"] = json.dumps([s.meta for s in result.samples])
    return meta


def _safetensors(result: _Result) -> bytes:
    return bytes(
        encode(
            result.features,
            dtype=result.params.dtype,
            labels=_labels(result.samples),
            metadata=_metadata(result),
        )
    )


def _summary(result: _Result) -> dict[str, Any]:
    f = result.features
    labels = _labels(result.samples)
    return {
        **_metadata(result),
        "keys": [s.key for s in result.samples],
        "errors": result.errors,
        "shape": list(f.shape),
        "dtype": result.params.dtype,
        "min": float(f.min()) if f.size else None,
        "max": float(f.max()) if f.size else None,
        "mean": float(f.mean()) if f.size else None,
        "first_values": [float(v) for v in f.reshape(-1)[:8]],
        "labels": None if labels is None else labels.tolist(),
        "storage_batch_size": result.batch_size,
        "timings_ms": {k: round(v, 2) for k, v in result.timings.items()},
        "bytes_as_safetensors": len(_safetensors(result)),
    }
