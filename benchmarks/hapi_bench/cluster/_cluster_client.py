"""The training client of the multi-node testbed, run in the client's namespace.

:meth:`hapi_bench._cluster.Testbed.client` starts ``python -m hapi_bench._cluster_client``
with a job in :data:`~hapi_bench._cluster.CLIENT_ENV`. It builds an
``IterableFeatureDataset`` over the job's objects, warms every gateway (each loads its
blocks from the registry, wherever they are stored) and says ``ready``; on ``go`` from
its stdin it reads one epoch and reports, one JSON object a line on stdout: ``progress``
after every request's worth of samples, then ``done`` with how often each object's label
was seen, the samples, the seconds and the endpoints that answered. Labels are the objects'
numbers (``.../00012.jpg`` is 12), so the controller can check every sample came once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from typing import Any

from hapi import sdk
from hapi_bench.cluster._cluster import CLIENT_ENV


def object_number(key: str) -> int:
    """``n2/00012.jpg`` -> 12."""
    return int(key.rsplit("/", 1)[-1].split(".", 1)[0])


def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _warm(job: dict[str, Any]) -> None:
    for endpoint, key in job["warm"]:
        s3 = sdk.client(endpoint)
        s3.get_features_batch(
            job["bucket"], [key], model=job["model"], split=job["split"], dtype=job["dtype"]
        ).raise_for_errors()


def _dataset(job: dict[str, Any]) -> Any:
    options: dict[str, Any] = {"region_name": "us-east-1"}
    if job.get("placement"):
        options["placement"] = job["placement"]
    return sdk.IterableFeatureDataset.from_objects(
        [f"s3://{job['bucket']}/{key}" for key in job["keys"]],
        model=job["model"],
        split=job["split"],
        labels=object_number,
        dtype=job["dtype"],
        endpoint_url=job["endpoints"],
        client_options=options,
        request_size=job["request_size"],
        prefetch=job["prefetch"],
        shuffle=False,
    )


def main() -> None:
    """Build, warm, wait for ``go``, read one epoch, report."""
    job = json.loads(os.environ.pop(CLIENT_ENV))
    dataset = _dataset(job)
    _warm(job)
    _say(event="ready")
    if sys.stdin.readline().strip() != "go":
        return
    seen: Counter[int] = Counter()
    started = time.perf_counter()
    for _features, label in dataset:
        seen[int(label)] += 1
        if sum(seen.values()) % job["request_size"] == 0:
            _say(event="progress", samples=sum(seen.values()))
    seconds = time.perf_counter() - started
    stats = dataset.stats
    _say(
        event="done",
        samples=sum(seen.values()),
        seconds=seconds,
        labels={str(k): v for k, v in seen.items()},
        feature_bytes=getattr(stats, "bytes", None) if stats is not None else None,
    )


if __name__ == "__main__":
    main()
