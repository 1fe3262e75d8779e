"""Building a dataset: list the objects, pin the model version, choose the split, resolve
labels. Done once, in the process that constructs the dataset; the result is a picklable
value that DataLoader workers and DDP ranks share unchanged, so every process reads the
same objects with the same model version at the same split."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from hapi.models import Manifest, ModelError, Registry, RuntimeSettings
from hapi.models import NoSuchModel as MissingModel
from hapi.protocol import DEFAULT_REGISTRY_BUCKET, ENCODINGS
from hapi.protocol import WIRE_DTYPES as DTYPES

from ..client._client import client
from ..client._endpoints import resolve_endpoints
from ..client._errors import ModelUnavailable, NoSuchModel
from ..client._sources import (
    IMAGE_SUFFIXES,
    SHARD_SUFFIXES,
    Labels,
    list_objects,
    parse_uri,
    resolve_labels,
    same_bucket,
    sampled_object_bytes,
)
from ..planning._link import Bandwidth, BandwidthMemory, endpoint_key
from ..planning._split import (
    ClientTimes,
    SplitChoice,
    choose_split,
    gateway_auth,
    measure_client,
    parse_bandwidth,
)
from ._compute import Spec
from ._shards import count_shards

SplitArg = int | Literal["auto"] | None
LabelsArg = str | Callable[[str], int] | None


@dataclass(frozen=True)
class Source:
    """The objects of a dataset.

    Args:
        bucket: Their bucket.
        prefix: The prefix they were listed under (``""`` for explicit objects).
        keys: Their keys, in dataset order.
        sizes: Their sizes in bytes, when listed.
        shards: Whether they are WebDataset tar shards.
        etags: Their ETags, when listed.
        counts: The samples in each shard (``None`` for images: one each).
    """

    bucket: str
    prefix: str
    keys: tuple[str, ...]
    sizes: tuple[int, ...] | None
    shards: bool
    etags: tuple[str, ...] | None = None
    counts: tuple[int, ...] | None = None

    @property
    def raw_bytes(self) -> int | None:
        """Total bytes of the objects, when known."""
        return None if self.sizes is None else sum(self.sizes)


@dataclass(frozen=True)
class Prepared:
    """Everything a dataset class needs; ``s3`` is this process's client (not shared);
    ``memory`` keeps the bandwidth the job measures (``split="auto"`` only)."""

    source: Source
    labels: Labels
    spec: Spec
    choice: SplitChoice
    s3: Any
    memory: BandwidthMemory | None = None


@dataclass(frozen=True, kw_only=True)
class Options:
    """The arguments every constructor shares (see ``FeatureDataset.from_prefix``)."""

    model: str
    split: SplitArg = "auto"
    freeze: int | None = None
    labels: LabelsArg = "folder"
    dtype: str = "float32"
    encoding: str = "zeros"
    endpoint_url: str | Sequence[str] | None = None
    client_options: Mapping[str, Any] | None = None
    registry_bucket: str = DEFAULT_REGISTRY_BUCKET
    runtime: RuntimeSettings | None = None
    request_size: int = 32
    bandwidth: float | str | None = None
    local_cache: str | os.PathLike[str] | None = None

    @classmethod
    def of_call(cls, arguments: Mapping[str, Any]) -> Options:
        """The options among a constructor's arguments (its ``locals()``): each constructor
        spells out its typed keywords, and they are gathered here, once."""
        return cls(**{f.name: arguments[f.name] for f in dataclasses.fields(cls)})


def list_source(s3: Any, what: str | Sequence[str], *, shards: bool) -> Source:
    """A prefix URI (listed) or explicit object URIs, as a :class:`Source`; shards' samples
    are counted."""
    if isinstance(what, str):
        bucket, prefix = parse_uri(what)
        listed = list_objects(s3, bucket, prefix, SHARD_SUFFIXES if shards else IMAGE_SUFFIXES)
        keys, sizes, etags = zip(*listed, strict=True)
        source = Source(bucket, prefix, tuple(keys), tuple(sizes), shards, tuple(etags))
    else:
        bucket, named = same_bucket(what)
        source = Source(bucket, "", tuple(named), None, shards)
    if not shards:
        return source
    counts = count_shards(s3, source.bucket, source.keys, source.sizes)
    return replace(source, counts=counts)


def prepare(
    what: str | Sequence[str],
    options: Options,
    *,
    shards: bool,
    readers_in_turn: int | None = None,
) -> Prepared:
    """Resolve a dataset's objects, model, split and labels; ``readers_in_turn``: the
    readers ``split="auto"`` plans for that each wait for a batch before computing on it.

    Raises:
        NoSuchModel: The registry has no such model.
        ValueError: Bad arguments, or no objects found.
        RequestError: The store failed to list or to read a label manifest.
        LabelError: An object has no label.
    """
    if options.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {options.dtype!r}")
    if options.encoding not in ENCODINGS:
        raise ValueError(
            f"encoding must be one of {', '.join(ENCODINGS)}, not {options.encoding!r}"
        )
    if options.request_size < 1:
        raise ValueError(f"request_size must be >= 1, not {options.request_size}")
    endpoints = resolve_endpoints(options.endpoint_url, os.environ)
    extra = dict(options.client_options or {})
    s3 = client(list(endpoints) or None, **extra)
    source = list_source(s3, what, shards=shards)
    manifest = _manifest(s3, options)
    freeze = _freeze(manifest, options.freeze)
    memory = BandwidthMemory.from_environment(os.environ) if options.split == "auto" else None
    start = _start(options.bandwidth, os.environ, memory, endpoints)
    choice = _choose(manifest, freeze, options, endpoints, source, s3, start, readers_in_turn)
    spec = Spec(
        endpoints=endpoints,
        client_options=extra,
        registry_bucket=options.registry_bucket,
        manifest=manifest,
        freeze=freeze,
        split=choice.split,
        dtype=options.dtype,
        encoding=options.encoding,
        runtime=options.runtime or RuntimeSettings(),
        local_cache=None if options.local_cache is None else os.fspath(options.local_cache),
        etags=None if source.etags is None else dict(zip(source.keys, source.etags, strict=True)),
    )
    labels = resolve_labels(options.labels, s3, source.bucket, source.prefix, source.keys)
    return Prepared(source, labels, spec, choice, s3, memory)


PROBE = "probe"
"""``bandwidth="probe"``: measure the link now (about a second of it) before planning."""


def _start(
    bandwidth: float | str | None,
    environ: Mapping[str, str],
    memory: BandwidthMemory | None,
    endpoints: Sequence[str],
) -> Bandwidth | str | None:
    """The figure ``split="auto"`` starts from: one remembered for these endpoints within
    its lifetime, else the hint (``bandwidth=``, else ``HAPI_BANDWIDTH``), else ``None``;
    or :data:`PROBE` when asked to probe.

    Raises:
        ValueError: The hint is not a bandwidth.
    """
    hint = bandwidth if bandwidth is not None else environ.get("HAPI_BANDWIDTH") or None
    if isinstance(hint, str) and hint.strip().lower() == PROBE:
        return PROBE
    bits = parse_bandwidth(hint)
    remembered = memory.recall(endpoint_key(endpoints)) if memory and endpoints else None
    if remembered is not None:
        return remembered
    return None if bits is None else Bandwidth(bits, "hint")


def _manifest(s3: Any, options: Options) -> Manifest:
    bucket = options.registry_bucket
    try:
        return Registry(s3, bucket).get_manifest(options.model)
    except MissingModel as exc:
        raise NoSuchModel(
            "NoSuchModel", str(exc), bucket=bucket, key=f"models/{options.model}"
        ) from exc
    except ModelError as exc:
        raise ModelUnavailable(f"cannot read model {options.model!r}: {exc}") from exc


def _freeze(manifest: Manifest, freeze: int | None) -> int:
    freeze = manifest.freeze if freeze is None else freeze
    if not 1 <= freeze <= len(manifest.blocks):
        raise ValueError(
            f"freeze must be in 1..{len(manifest.blocks)} for {manifest.ref} "
            f"(its own freeze point is {manifest.freeze}), not {freeze}"
        )
    return freeze


def _choose(
    manifest: Manifest,
    freeze: int,
    options: Options,
    endpoints: Sequence[str],
    source: Source,
    s3: Any,
    start: Bandwidth | str | None,
    readers_in_turn: int | None,
) -> SplitChoice:
    split = options.split
    if split is None:
        return SplitChoice(None, "no pushdown, as asked: raw objects, every block here", "given")
    if split == "auto":
        raw = source.raw_bytes
        per_sample = raw / len(source.keys) if raw else None
        if per_sample is None and not source.shards:  # named, not listed: ask the store
            per_sample = sampled_object_bytes(s3, source.bucket, source.keys)
        runtime = options.runtime or RuntimeSettings()
        registry = Registry(s3, options.registry_bucket)

        def measure(blocks: bool) -> ClientTimes:
            first = source.keys[0]
            return measure_client(
                s3, registry, manifest, source.bucket, first, runtime, blocks=blocks
            )

        return choose_split(
            manifest,
            freeze,
            options.dtype,
            endpoints=endpoints,
            bandwidth=start if isinstance(start, Bandwidth) else None,
            probe=start == PROBE,
            raw_bytes=per_sample,
            dataset_size=len(source.keys),
            batch_size=options.request_size,
            auth=gateway_auth(s3),
            measure=measure,
            encoding=options.encoding,
            readers_in_turn=readers_in_turn,
        )
    last = min(freeze, manifest.freeze)
    if isinstance(split, bool) or not isinstance(split, int) or not 0 <= split <= last:
        raise ValueError(f"split must be 'auto', None or an integer in 0..{last}, not {split!r}")
    return SplitChoice(split, f"split {split}, as asked", "given")
