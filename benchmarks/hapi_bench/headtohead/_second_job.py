"""A second training job sharing the storage node (the loaded cells).

It reads the same objects through hapi's gateway without the feature cache, with every
frozen block run on the storage side (``split = freeze``): the heaviest a neighbour's job
can make the storage node work, and it crosses the link too. It runs as its own process
(``python -m hapi_bench.headtohead._second_job``, its settings in one environment
variable so the secret stays out of ``ps``) on the client's core at a lower priority, so
what it takes from the job being measured is the storage node's core and the link.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from types import FrameType

ENV = "HAPI_H2H_SECOND_JOB"
NICENESS = 10


@dataclass(frozen=True, kw_only=True)
class SecondJob:
    """What the second job reads, and where."""

    endpoint: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    bucket: str
    keys: tuple[str, ...]
    model: str
    split: int
    batch_size: int = 8


def command(cpu: int) -> list[str]:
    """The job's command line: on ``cpu``, at :data:`NICENESS`."""
    return [
        "taskset", "-c", str(cpu), "nice", "-n", str(NICENESS),
        sys.executable, "-m", "hapi_bench.headtohead._second_job",
    ]  # fmt: skip


@contextmanager
def second_job(job: SecondJob, cpu: int) -> Iterator[int]:
    """Run the job for the block; yields its pid."""
    env = {**os.environ, ENV: json.dumps(asdict(job))}
    process = subprocess.Popen(
        command(cpu), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        yield process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> None:
    """Read features in batches, round and round, until SIGTERM."""
    from hapi import sdk

    spec = json.loads(os.environ.pop(ENV))
    job = SecondJob(**{**spec, "keys": tuple(spec["keys"])})
    signal.signal(signal.SIGTERM, _stop)
    client = sdk.client(
        job.endpoint,
        aws_access_key_id=job.access_key_id,
        aws_secret_access_key=job.secret_access_key,
        region_name="us-east-1",
    )
    while True:
        for start in range(0, len(job.keys), job.batch_size):
            keys = list(job.keys[start : start + job.batch_size])
            try:
                client.get_features_batch(job.bucket, keys, model=job.model, split=job.split)
            except sdk.SDKError:  # e.g. SlowDown: a job backs off and goes on
                time.sleep(0.1)


if __name__ == "__main__":
    main()
