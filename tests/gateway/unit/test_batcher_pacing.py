"""The batcher keeps the pipeline full: a request that is already a batch is answered
as soon as its own samples are computed, not after other requests merged behind it."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hapi.gateway.pushdown._batcher import Batcher, MemoryBudget

SAMPLE = 1000


class RecordingDevice:
    """Doubles its input, records each batch's first value and size; held until released."""

    def __init__(self, events: list[tuple[str, float]]) -> None:
        self.events = events
        self.sizes: list[int] = []
        self.gate = threading.Event()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.gate.wait(5)
        self.sizes.append(len(batch))
        if len(batch):
            self.events.append(("infer", float(batch[0, 0])))
        return batch * 2


def _samples(n: int, start: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32).reshape(n, 1)


def _run(sizes: list[int], budget: int = 64 * SAMPLE) -> tuple[list[tuple[str, float]], list[int]]:
    """Queues requests of ``sizes`` behind a held first request; returns events, batch sizes."""
    events: list[tuple[str, float]] = []
    device = RecordingDevice(events)

    async def client(batcher: Batcher, n: int, start: int) -> None:
        out, _ = await batcher.submit(_samples(n, start))
        assert out.tolist() == (_samples(n, start) * 2).tolist()
        events.append(("done", float(start)))

    async def main() -> None:
        pool = ThreadPoolExecutor(1)
        batcher = Batcher(
            "t", device, per_sample_bytes=SAMPLE, budget=MemoryBudget(total=budget), pool=pool
        )
        tasks = []
        for i, n in enumerate(sizes):
            tasks.append(asyncio.create_task(client(batcher, n, 100 * i)))
            await asyncio.sleep(0.01)  # arrival order; the first holds the device meanwhile
        device.gate.set()
        await asyncio.gather(*tasks)
        await batcher.close()
        pool.shutdown()

    asyncio.run(main())
    return events, device.sizes


def test_requests_of_four_are_not_merged_into_larger_batches():
    _, sizes = _run([4, 4, 4, 4])
    assert sizes == [4, 4, 4, 4]


def test_a_response_completes_before_the_requests_behind_it_are_computed():
    events, _ = _run([4, 4, 4, 4])
    order = [f"{kind} {int(at)}" for kind, at in events]
    for k in range(2):  # response k leaves while k + 1 computes, before k + 2 starts
        assert order.index(f"done {100 * k}") < order.index(f"infer {100 * (k + 2)}")


def test_a_batch_takes_whole_requests_up_to_the_largest_waiting_one():
    _, sizes = _run([4, 1, 2, 3, 4])
    # the held 4 alone, then 1+2+3 (reaching 4 with whole requests), then the last 4
    assert sizes == [4, 6, 4]


def test_single_sample_requests_still_merge():
    _, sizes = _run([1, 1, 1, 1, 1, 1])
    assert sizes == [1, 5]


def test_the_memory_bound_still_cuts_a_request_larger_than_it():
    _, sizes = _run([4, 10, 4], budget=6 * SAMPLE)
    assert sizes == [4, 6, 4, 4]


def test_an_empty_request_is_answered_and_the_batcher_goes_on() -> None:
    """A batch whose every sample came from the cache or failed submits nothing to run;
    the batcher must answer it (empty) and keep serving, not spin on it."""

    async def main() -> tuple[list[int], list[int]]:
        pool = ThreadPoolExecutor(1)
        device = RecordingDevice([])
        device.gate.set()
        batcher = Batcher(
            "t", device, per_sample_bytes=SAMPLE, budget=MemoryBudget(total=64 * SAMPLE), pool=pool
        )
        try:
            empty, _ = await asyncio.wait_for(batcher.submit(_samples(0, 0)), 5)
            after, _ = await asyncio.wait_for(batcher.submit(_samples(2, 7)), 5)
            return list(empty.shape), after.ravel().tolist()
        finally:
            await batcher.close()
            pool.shutdown()

    empty_shape, after = asyncio.run(main())
    assert empty_shape[0] == 0 and after == [14.0, 16.0]
