"""Prometheus metrics of one gateway instance (a registry per app, no globals)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

# render()'s "every identity's series" (what an admin key sees); never an access key id.
ALL_IDENTITIES = "*"
# Where an object pushdown fetched was, as the placement label says it.
FETCH_PLACEMENTS = ("local", "remote", "unknown")
_M = TypeVar("_M", bound=MetricWrapperBase)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class Metrics:
    """Counters and histograms; ``render()`` gives the ``/metrics`` body."""

    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=True)
    )

    def __post_init__(self) -> None:
        labels = ("operation", "status")
        self.requests = Counter(
            "hapi_requests",
            "Requests handled, by S3 operation and status.",
            labels,
            registry=self.registry,
        )
        self.latency = Histogram(
            "hapi_request_duration_seconds",
            "Time from request to last response byte.",
            ("operation",),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bytes_in = Counter(
            "hapi_received_bytes",
            "Request body bytes received from clients.",
            ("operation",),
            registry=self.registry,
        )
        self.bytes_out = Counter(
            "hapi_sent_bytes",
            "Response body bytes sent to clients.",
            ("operation",),
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "hapi_upstream_errors",
            "Upstream failures (unreachable, reset, truncated).",
            ("kind",),
            registry=self.registry,
        )

        self.object_fetches = Counter(
            "hapi_pushdown_object_fetches",
            "Objects pushdown fetched from the store (cache hits fetch none), by placement: "
            "local (this node holds the object), remote (another node does: its bytes crossed "
            "the network) or unknown (no placement lookup, or no answer from it).",
            ("placement",),
            registry=self.registry,
        )
        self.object_fetch_bytes = Counter(
            "hapi_pushdown_object_fetch_bytes",
            "Object bytes pushdown fetched from the store, by placement (local, remote, "
            "unknown; as hapi_pushdown_object_fetches).",
            ("placement",),
            registry=self.registry,
        )
        for placement in FETCH_PLACEMENTS:  # every series from the start, zero until counted
            self.object_fetches.labels(placement)
            self.object_fetch_bytes.labels(placement)
        self.pushdown_samples = Counter(
            "hapi_pushdown_samples",
            "Pushdown samples served, by identity (the caller's access key id, or anonymous) "
            "and source: computed (ran the frozen blocks here), decoded (split 0: decoded and "
            "preprocessed only) or cache (rows from the feature cache, no compute).",
            ("identity", "source"),
            registry=self.registry,
        )
        self.pushdown_compute = Counter(
            "hapi_pushdown_compute_seconds",
            "Storage-side compute time by identity: each batch's run time, shared among the "
            "identities in it in proportion to their samples (cache hits and decoding cost "
            "none here).",
            ("identity",),
            registry=self.registry,
        )
        self.pushdown_rate_limited = Counter(
            "hapi_pushdown_rate_limited",
            "Pushdown requests refused with SlowDown for going over the identity's request "
            "rate (identity_requests_per_s), by identity.",
            ("identity",),
            registry=self.registry,
        )
        self.identity_limited = Counter(
            "hapi_identity_limited",
            "Requests refused with SlowDown for going over one of the identity's bounds "
            "(upstream: identity_upstream_requests, pushdown: identity_pushdown_requests), "
            "and cache writes skipped for its cache_write bytes, by identity and bound.",
            ("identity", "bound"),
            registry=self.registry,
        )
        self.cache_lookups = Counter(
            "hapi_cache_lookups",
            "Feature cache lookups, by model and result (hit, miss, rejected: an entry without a "
            "valid MAC; skipped: an object of a cold context fetched without a lookup).",
            ("model", "result"),
            registry=self.registry,
        )
        self.cache_bytes = Counter(
            "hapi_cache_bytes",
            "Feature cache bytes read from and written to the cache bucket.",
            ("model", "direction"),
            registry=self.registry,
        )
        self.cache_writes = Counter(
            "hapi_cache_writes",
            "Feature cache writes, by model and outcome (written, skipped, failed).",
            ("model", "outcome"),
            registry=self.registry,
        )
        self.cache_writes_pending = Gauge(
            "hapi_cache_writes_pending",
            "Feature cache writes and access records queued or being written now.",
            registry=self.registry,
        )
        self.cache_memory = Gauge(
            "hapi_cache_memory_bytes",
            "Bytes of the feature cache's packs this process wrote and holds in memory.",
            registry=self.registry,
        )
        # Counted in a plain int by the event loop that serves every request (no lock per
        # change), read when scraped.
        self.requests_in_flight = 0
        self.in_flight = Gauge(
            "hapi_requests_in_flight", "Requests being handled now.", registry=self.registry
        )
        self.in_flight.set_function(lambda: float(self.requests_in_flight))
        self.queued_samples = Gauge(
            "hapi_batcher_queued_samples",
            "Samples waiting in the storage-side batchers (all tenants).",
            registry=self.registry,
        )
        # The storage node's efficiency, per model version and split (as Triton shows it).
        per_model = ("model", "split")
        self.model_requests = Counter(
            "hapi_pushdown_model_requests",
            "Pushdown requests, by model version and split.",
            per_model,
            registry=self.registry,
        )
        self.model_samples = Counter(
            "hapi_pushdown_model_samples",
            "Pushdown samples answered (computed, decoded or from the cache), by model "
            "version and split.",
            per_model,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "hapi_pushdown_batch_size",
            "Storage-side batch sizes (samples run through the blocks together), by model "
            "version and split; its count is the batches run.",
            per_model,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "hapi_pushdown_queue_wait_seconds",
            "How long a request's samples waited in the batcher before their batch ran, by "
            "model version and split.",
            per_model,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=self.registry,
        )
        self.inference_seconds = Counter(
            "hapi_pushdown_inference_seconds",
            "Seconds the blocks ran (wall time of each storage-side batch), by model version "
            "and split.",
            per_model,
            registry=self.registry,
        )
        self.decode_seconds = Counter(
            "hapi_pushdown_decode_seconds",
            "Seconds decoding and preprocessing samples, by model version and split: CPU "
            "seconds with Pillow, the batch's wall seconds with DALI.",
            per_model,
            registry=self.registry,
        )
        self._series: dict[tuple[str, int], _RequestSeries] = {}
        self._children: dict[tuple[int, tuple[str, ...]], MetricWrapperBase] = {}
        self.device_memory = Gauge(
            "hapi_device_memory_used_bytes",
            "Memory in use on the inference GPU, read at each scrape (0 on a CPU-only node).",
            registry=self.registry,
        )

    def series(self, metric: _M, *values: str) -> _M:
        """``metric.labels(*values)``, looked up once per combination: ``labels()`` locks
        and builds tuples, several times in every pushdown request otherwise."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return cast(_M, child)

    def observe(
        self, operation: str, status: int, seconds: float, sent: int, received: int
    ) -> None:
        """Record one finished request."""
        series = self._series.get((operation, status))
        if series is None:  # labels() locks and builds tuples: once per pair, not per request
            series = self._series[operation, status] = _RequestSeries(
                self.requests.labels(operation, str(status)),
                self.latency.labels(operation),
                self.bytes_out.labels(operation),
                self.bytes_in.labels(operation),
            )
        series.requests.inc()
        series.latency.observe(seconds)
        if sent:
            series.bytes_out.inc(sent)
        if received:
            series.bytes_in.inc(received)

    def computed(self, identity: str, samples: int, seconds: float) -> None:
        """Meter one identity's samples of one storage-side batch and its share of the
        batch's run time."""
        self.pushdown_samples.labels(identity, "computed").inc(samples)
        self.pushdown_compute.labels(identity).inc(seconds)

    def batch_observer(
        self, model: str, split: int
    ) -> Callable[[int, float, Sequence[float]], None]:
        """What one batcher reports after each batch: its size, run time and queue waits."""
        labels = (model, str(split))
        sizes, waits = self.batch_size.labels(*labels), self.queue_wait.labels(*labels)
        ran = self.inference_seconds.labels(*labels)

        def observe(size: int, seconds: float, queued: Sequence[float]) -> None:
            sizes.observe(size)
            ran.inc(seconds)
            for wait in queued:
                waits.observe(wait)

        return observe

    def render(self, identity: str | None = ALL_IDENTITIES) -> tuple[bytes, str]:
        """The exposition body and its content type.

        Args:
            identity: Whose per-identity series to show: :data:`ALL_IDENTITIES` (an admin),
                one access key id (a client sees its own), or None (none: a public page).
        """
        if identity == ALL_IDENTITIES:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        return generate_latest(_OnlyIdentity(self.registry, identity)), CONTENT_TYPE_LATEST


class _RequestSeries(NamedTuple):
    """One (operation, status)'s children of the per-request metrics."""

    requests: Counter
    latency: Histogram
    bytes_out: Counter
    bytes_in: Counter


@dataclass(frozen=True)
class _OnlyIdentity:
    """A view of a registry whose per-identity samples are ``identity``'s alone."""

    registry: CollectorRegistry
    identity: str | None

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            kept = [
                sample
                for sample in family.samples
                if sample.labels.get("identity", self.identity) == self.identity
            ]
            if kept or not family.samples:
                clone = Metric(family.name, family.documentation, family.type, family.unit)
                clone.samples = kept
                yield clone
