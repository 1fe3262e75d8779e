"""The baseline loader: raw objects with plain GETs, decoded and run entirely here.

Built the way a careful user would build it without hapi: ``depth`` GETs in flight on
their own threads keep the link busy while this thread decodes a batch
(``hapi.models._decode``, exactly what the gateway runs) and runs every frozen block on
it, so fetching and computing overlap as two pipeline stages.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from hapi.models import Manifest, decode_object
from hapi_bench.testbed._data import CLASSES

FETCH_THREADS = 4


@dataclass
class LoaderStats:
    """What one pass read and waited."""

    samples: int = 0
    bytes_received: int = 0
    wait_seconds: float = 0.0


def label_of(key: str) -> int:
    """The class index of ``images/<class>/<n>.jpg``."""
    return CLASSES.index(key.split("/")[-2])


class RawLoader:
    """Batches of ``(features [B, ...], labels)`` from raw objects.

    Args:
        s3: A boto3 S3 client (thread-safe; its pool should hold ``FETCH_THREADS``).
        bucket: The objects' bucket.
        keys: The objects, in order.
        manifest: The model (its preprocessing preset).
        session: An onnxruntime session of blocks ``[0, freeze)``.
        batch_size: Samples per batch.
        depth: Objects requested ahead of the batch being computed.
    """

    def __init__(
        self,
        s3: Any,
        bucket: str,
        keys: Sequence[str],
        manifest: Manifest,
        session: Any,
        *,
        batch_size: int,
        depth: int,
    ) -> None:
        self._s3 = s3
        self._bucket = bucket
        self._keys = list(keys)
        self._preset = manifest.preprocess
        self._session = session
        self._input = session.get_inputs()[0].name
        self._batch = batch_size
        self._depth = max(depth, batch_size)
        self.stats = LoaderStats()

    def _get(self, key: str) -> bytes:
        return bytes(self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read())

    def __iter__(self) -> Iterator[tuple[np.ndarray, list[int]]]:
        self.stats = LoaderStats()
        keys = iter(self._keys)
        with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="bench-get") as pool:
            pending: deque[tuple[str, Future[bytes]]] = deque()

            def refill() -> None:
                while len(pending) < self._depth and (key := next(keys, None)) is not None:
                    pending.append((key, pool.submit(self._get, key)))

            refill()
            while pending:
                batch = [pending.popleft() for _ in range(min(self._batch, len(pending)))]
                refill()
                yield self._compute(batch)

    def _compute(self, batch: list[tuple[str, Future[bytes]]]) -> tuple[np.ndarray, list[int]]:
        arrays: list[np.ndarray] = []
        labels: list[int] = []
        for key, future in batch:
            started = time.perf_counter()
            data = future.result()
            self.stats.wait_seconds += time.perf_counter() - started
            self.stats.bytes_received += len(data)
            arrays.extend(s.array for s in decode_object(data, self._preset, key=key))
            labels.append(label_of(key))
        features = self._session.run(None, {self._input: np.stack(arrays)})[0]
        self.stats.samples += len(labels)
        return np.asarray(features), labels
