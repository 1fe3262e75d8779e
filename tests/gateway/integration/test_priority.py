"""The session's gateway (``compute_niceness`` and ``decode_niceness`` at their defaults,
10 and 5) runs pushdown's work below its request handling: the thread that spends the CPU
of a run of pushdown requests (the blocks, in onnxruntime, whichever thread it runs them
on) runs 10 nice steps below the gateway's main thread, which serves the requests at the
priority it was started at, and the threads that decode the images 5 steps below that."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import numpy as np
from skimage import data as samples

from tests.support import RunningGateway, encode_image, signed_headers

STEPS = 10  # GatewaySettings.compute_niceness's default
DECODE_STEPS = 5  # GatewaySettings.decode_niceness's default


def _threads(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of ``pid``: (nice value, CPU ticks so far)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended while we looked
            continue
        found[int(task.name)] = (int(fields[16]), int(fields[11]) + int(fields[12]))
    return found


def _pushdown(gw: RunningGateway, bucket: str, key: str) -> None:
    path = f"/{bucket}/{key}?hapi-model=r18&hapi-split=6&hapi-cache=bypass"
    reply = httpx.get(
        gw.endpoint_url + path, headers=signed_headers(gw, "GET", path, body=b""), timeout=300
    )
    assert reply.status_code == 200, reply.text


def test_the_blocks_run_below_the_requests_and_the_requests_at_the_gateways_priority(
    gateway, registered, backend_s3, unique_bucket
) -> None:
    # A large photo (1200x1804), so that its decoding spends clock ticks of its own.
    big = encode_image(np.tile(samples.chelsea(), (4, 4, 1)), "JPEG")
    backend_s3.put_object(Bucket=unique_bucket, Key="cat.jpg", Body=big)
    _pushdown(gateway, unique_bucket, "cat.jpg")  # the session loaded, its threads started
    before = _threads(gateway.pid)
    for _ in range(6):
        _pushdown(gateway, unique_bucket, "cat.jpg")
    after = _threads(gateway.pid)
    main = gateway.pid
    base = after[main][0]
    assert base == os.getpriority(os.PRIO_PROCESS, 0)  # as the test (which started it) runs
    spent = {tid: after[tid][1] - before.get(tid, (0, 0))[1] for tid in after if tid != main}
    busiest = max(spent, key=spent.__getitem__)
    blocks, decoding = min(19, base + STEPS), min(19, base + STEPS + DECODE_STEPS)
    assert spent[busiest] > 0
    assert after[busiest][0] in {blocks, decoding}, (after, spent)  # the work, not the loop
    # The threads that worked ran at the three priorities and no other: the requests',
    # the blocks' and the decoding's.
    worked = {after[tid][0] for tid in spent if spent[tid] > 0}
    assert worked - {base} == {blocks, decoding}, (after, spent)
