"""A second training job sharing the storage node (the loaded cells).

It reads the same objects through hapi's gateway without the feature cache, with every
frozen block run on the storage side (``split = freeze``): the heaviest a neighbour's job
can make the storage node work, and it crosses the link too. It runs as its own process
(``python -m hapi_bench.headtohead._second_job``, its settings in one environment
variable so the secret stays out of ``ps``) on the client's core at a lower priority, so
what it takes from the job being measured is the storage node's core and the link.
:func:`second_job` returns once the job has been answered and then kept working for
:data:`SETTLE_S` (the span of the gateway's busy share): a neighbour's job has been
running for a while when another plans, and the planner reads its load from that span.
"""

from __future__ import annotations

import json
import os
import select
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
READY = b"answered\n"  # the job's one line on stdout, after its first answer
START_TIMEOUT_S = 120.0
SETTLE_S = 10.0  # the gateway's BUSY_WINDOW_S
CLEAR_S = 10.0
"""How long the block's exit waits after the job has stopped: the gateway's busy share
covers its last 10 s, so a quiet cell that follows a loaded one planned, before this
wait, with the ended job still busy in its view (x1.5-1.8 on its storage side's price in
every quiet cell after the first, 2026-12-02)."""


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
    """Run the job for the block; yields its pid once it is established (answered, then
    :data:`SETTLE_S` of work); returns once the gateway's view no longer counts it busy
    (:data:`CLEAR_S` after it stopped).

    Raises:
        RuntimeError: The job exited or had no answer within :data:`START_TIMEOUT_S`.
    """
    env = {**os.environ, ENV: json.dumps(asdict(job))}
    process = subprocess.Popen(
        command(cpu), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    try:
        _wait_answered(process)
        time.sleep(SETTLE_S)
        yield process.pid
    finally:
        assert process.stdout is not None
        process.stdout.close()
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    time.sleep(CLEAR_S)


def _wait_answered(process: subprocess.Popen[bytes]) -> None:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline() if ready else b""
    if line != READY:
        code = process.poll()
        state = f"exited with {code}" if code is not None else "is still silent"
        raise RuntimeError(
            f"the second job had no answer within {START_TIMEOUT_S:.0f} s and {state}"
        )


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
    announced = False
    while True:
        for start in range(0, len(job.keys), job.batch_size):
            keys = list(job.keys[start : start + job.batch_size])
            try:
                client.get_features_batch(job.bucket, keys, model=job.model, split=job.split)
            except sdk.SDKError:  # e.g. SlowDown: a job backs off and goes on
                time.sleep(0.1)
                continue
            if not announced:
                sys.stdout.buffer.write(READY)
                sys.stdout.buffer.flush()
                announced = True


if __name__ == "__main__":
    main()
