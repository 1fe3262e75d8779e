"""The storage-side batcher with an injected executor: batching, OOM split-and-retry,
back-pressure and cancellation, on the CPU."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hapi.gateway._errors import InsufficientMemory, InvalidRequest, SlowDown
from hapi.gateway.pushdown._batcher import Batcher, MemoryBudget, OutOfMemory

SAMPLE = 1000  # bytes per sample in these tests


class FakeDevice:
    """Doubles its input; raises OutOfMemory above ``fits`` samples; records batch sizes."""

    def __init__(self, fits: int = 10**9, delay: float = 0.0) -> None:
        self.fits = fits
        self.delay = delay
        self.sizes: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.gate.wait(5)
        if len(batch) > self.fits:
            raise OutOfMemory(f"{len(batch)} samples do not fit")
        self.sizes.append(len(batch))
        if self.delay:
            threading.Event().wait(self.delay)
        return batch * 2


def _batcher(device: FakeDevice, budget: int = 64 * SAMPLE, **kwargs) -> Batcher:
    pool = ThreadPoolExecutor(1)
    return Batcher(
        "t", device, per_sample_bytes=SAMPLE, budget=MemoryBudget(total=budget), pool=pool, **kwargs
    )


def _samples(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32).reshape(n, 1)


def test_concurrent_requests_share_one_batch():
    device = FakeDevice()
    device.gate.clear()  # hold the device so that requests pile up behind the first batch

    async def main():
        batcher = _batcher(device, max_delay_s=0.001)
        first = asyncio.create_task(batcher.submit(_samples(1)))
        await asyncio.sleep(0.01)
        rest = [asyncio.create_task(batcher.submit(_samples(1, 10 * i))) for i in range(1, 6)]
        await asyncio.sleep(0.02)
        device.gate.set()
        results = await asyncio.gather(first, *rest)
        await batcher.close()
        return results

    results = asyncio.run(main())
    for i, (out, _) in enumerate(results[1:], start=1):
        assert out.tolist() == (_samples(1, 10 * i) * 2).tolist()  # each gets its own samples back
    # the other five plain GETs were merged (requests of several samples are not: see
    # tests/gateway/unit/test_batcher_pacing.py)
    assert device.sizes == [1, 5]


def test_batch_size_follows_the_memory_budget():
    device = FakeDevice()

    async def main():
        batcher = _batcher(device, budget=8 * SAMPLE, max_delay_s=0.01)
        assert batcher.max_batch_size() == 8
        out, used = await batcher.submit(_samples(20))
        await batcher.close()
        return out, used

    out, used = asyncio.run(main())
    assert out.tolist() == (_samples(20) * 2).tolist()
    assert device.sizes == [8, 8, 4] and used == 8


def test_oom_splits_the_batch_and_lowers_the_estimate():
    device = FakeDevice(fits=5)  # the estimate says 64 fit; really only 5 do

    async def main():
        batcher = _batcher(device, max_delay_s=0.01)
        out, _ = await batcher.submit(_samples(40))
        size_after = batcher.max_batch_size()
        again, _ = await batcher.submit(_samples(12))
        await batcher.close()
        return batcher, out, size_after, again

    batcher, out, size_after, again = asyncio.run(main())
    assert out.tolist() == (_samples(40) * 2).tolist()  # nothing lost, order kept
    assert max(device.sizes) <= 5
    assert size_after <= 5 and batcher.stats.oom_events > 0
    assert again.tolist() == (_samples(12) * 2).tolist()


def test_only_a_sample_that_alone_does_not_fit_fails():
    device = FakeDevice(fits=0)

    async def main():
        batcher = _batcher(device, max_delay_s=0.01)
        with pytest.raises(InsufficientMemory, match="does not fit"):
            await batcher.submit(_samples(4))
        await batcher.close()

    asyncio.run(main())


def test_queue_bound_gives_slowdown_with_retry_after():
    device = FakeDevice()
    device.gate.clear()

    async def main():
        batcher = _batcher(device, max_queue_samples=10, max_delay_s=0.001)
        first = asyncio.create_task(batcher.submit(_samples(4)))
        await asyncio.sleep(0.02)  # taken by the (blocked) device
        queued = asyncio.create_task(batcher.submit(_samples(8)))
        await asyncio.sleep(0.01)
        with pytest.raises(SlowDown) as err:
            await batcher.submit(_samples(5))
        device.gate.set()
        await asyncio.gather(first, queued)
        await batcher.close()
        return err.value

    error = asyncio.run(main())
    assert error.retry_after == 1 and error.status == 503


def test_cancelled_request_is_not_computed():
    device = FakeDevice()
    device.gate.clear()

    async def main():
        batcher = _batcher(device, budget=4 * SAMPLE, max_delay_s=0.001)
        busy = asyncio.create_task(batcher.submit(_samples(4)))
        await asyncio.sleep(0.02)
        gone = asyncio.create_task(batcher.submit(_samples(4, 100)))
        await asyncio.sleep(0.01)
        gone.cancel()  # the client disconnected while queued
        device.gate.set()
        await busy
        kept, _ = await batcher.submit(_samples(2, 200))
        await batcher.close()
        return kept

    kept = asyncio.run(main())
    assert kept.tolist() == (_samples(2, 200) * 2).tolist()
    assert device.sizes == [4, 2]  # the cancelled four never ran


def test_tenants_share_the_budget():
    budget = MemoryBudget(total=64 * SAMPLE)
    pool = ThreadPoolExecutor(1)
    a = Batcher("a", FakeDevice(), per_sample_bytes=SAMPLE, budget=budget, pool=pool)
    b = Batcher("b", FakeDevice(), per_sample_bytes=SAMPLE, budget=budget, pool=pool)
    budget.activate("a")
    assert a.max_batch_size() == 64
    budget.activate("b")
    assert a.max_batch_size() == b.max_batch_size() == 32
    budget.weights = 32 * SAMPLE
    assert a.max_batch_size() == 16


def test_waits_only_for_announced_requests():
    device = FakeDevice()

    async def main():
        batcher = _batcher(device, max_delay_s=2.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with batcher.expecting() as alone_arrival:
            await alone_arrival.submit(_samples(1), wait=False)  # nothing else on its way
        alone = loop.time() - started
        with batcher.expecting() as one, batcher.expecting() as two:  # two still decoding
            first = asyncio.create_task(one.submit(_samples(1), wait=False))
            await asyncio.sleep(0.05)
            second = asyncio.create_task(two.submit(_samples(2, 5), wait=False))
            await asyncio.gather(first, second)
        await batcher.close()
        return alone

    alone = asyncio.run(main())
    assert alone < 1.0  # far below the 2 s queue delay
    assert device.sizes == [1, 3]  # the first waited for the second, announced one


def test_heavy_batches_wait_longer_for_announced_requests():
    """A batch whose samples take long to run waits up to a share of its expected run
    time for announced requests, though that is longer than the queue delay: the wait is
    small beside the run, and a fuller batch runs each sample for less."""

    async def announced_pair(device: FakeDevice) -> list[int]:
        batcher = _batcher(device, max_delay_s=0.001)
        with batcher.expecting() as warm:  # the batcher learns the time per sample
            await warm.submit(_samples(1), wait=False)
        with batcher.expecting() as one, batcher.expecting() as two:
            first = asyncio.create_task(one.submit(_samples(1), wait=False))
            await asyncio.sleep(0.03)  # the second request is still decoding
            second = asyncio.create_task(two.submit(_samples(2, 5), wait=False))
            await asyncio.gather(first, second)
        await batcher.close()
        return device.sizes[1:]

    heavy = asyncio.run(announced_pair(FakeDevice(delay=0.1)))  # 100 ms a sample
    light = asyncio.run(announced_pair(FakeDevice()))  # microseconds a sample
    assert heavy == [3]  # waited 30 ms for the second request: a share of 100 ms x 3
    assert light == [1, 2]  # waited only the 1 ms queue delay


def test_withdrawn_announcement_releases_the_wait():
    device = FakeDevice()

    async def main():
        batcher = _batcher(device, max_delay_s=5.0)
        with batcher.expecting() as arrival:
            task = asyncio.create_task(arrival.submit(_samples(1), wait=False))
            with pytest.raises(RuntimeError), batcher.expecting():
                await asyncio.sleep(0.05)
                raise RuntimeError("the other request failed while decoding")
            out, _ = await asyncio.wait_for(task, 1.0)
        await batcher.close()
        return out

    assert asyncio.run(main()).tolist() == [[0.0]]


def test_an_announcement_ends_exactly_once_whatever_happens():
    device = FakeDevice()

    async def main():
        batcher = _batcher(device, max_delay_s=0.001)
        with batcher.expecting() as submitted:
            await submitted.submit(_samples(1), wait=False)
            await submitted.submit(_samples(1), wait=False)  # a later window: not announced
            assert not submitted.expected
        with pytest.raises(asyncio.CancelledError), batcher.expecting() as cancelled:
            assert cancelled.expected
            raise asyncio.CancelledError
        with batcher.expecting():
            pass  # nothing to submit (every sample came from the cache)
        incoming = dict(batcher._incoming)
        await batcher.close()
        return incoming

    assert asyncio.run(main()) == {}


def test_a_partially_taken_cancelled_request_is_not_grown():
    device = FakeDevice()
    device.gate.clear()

    async def main():
        batcher = _batcher(device, budget=4 * SAMPLE, max_delay_s=0.001)
        gone = asyncio.create_task(batcher.submit(_samples(12)))
        await asyncio.sleep(0.02)  # its first 4 are on the (blocked) device
        other = asyncio.create_task(batcher.submit(_samples(2, 100)))
        await asyncio.sleep(0.01)
        gone.cancel()  # the client disconnected mid-request
        device.gate.set()
        kept, _ = await other
        await batcher.close()
        return batcher, kept

    batcher, kept = asyncio.run(main())
    assert kept.tolist() == (_samples(2, 100) * 2).tolist()
    assert device.sizes == [4, 2]  # the other 8 of the cancelled 12 never ran
    figures = batcher.stats.as_dict()
    assert figures["samples_dropped"] == 8 and figures["requests_cancelled"] == 1
    assert batcher.queued == 0


def test_a_request_larger_than_the_queue_can_never_fit_and_says_so():
    async def main():
        batcher = _batcher(FakeDevice(), max_queue_samples=10)
        with pytest.raises(InvalidRequest, match="10"):
            await batcher.submit(_samples(11))
        await batcher.close()

    asyncio.run(main())


def test_a_waiting_submit_gets_room_instead_of_slowdown():
    device = FakeDevice()
    device.gate.clear()

    async def main():
        batcher = _batcher(device, budget=4 * SAMPLE, max_queue_samples=6, max_delay_s=0.001)
        first = asyncio.create_task(batcher.submit(_samples(6)))
        await asyncio.sleep(0.02)  # 4 taken, 2 queued
        waiting = asyncio.create_task(batcher.submit(_samples(5, 50), wait=True))
        await asyncio.sleep(0.02)
        assert not waiting.done()
        device.gate.set()
        results = await asyncio.gather(first, waiting)
        await batcher.close()
        return results

    (_, _), (out, _) = asyncio.run(main())
    assert out.tolist() == (_samples(5, 50) * 2).tolist()


def test_busy_share_is_the_running_time_of_the_last_window(monkeypatch):
    # Batches of 2 s ending at t=100, 104 and 108 fill 6 s of the 10 s before t=108; as
    # the window moves on, each batch leaves it, the last one second by second.
    from hapi.gateway.pushdown import _batcher

    stats = _batcher.BatcherStats()
    clock = iter([100.0, 104.0, 108.0])
    monkeypatch.setattr(_batcher.time, "monotonic", lambda: next(clock))
    for _ in range(3):
        stats.record(4, 2.0, 0)
    assert _batcher.BUSY_WINDOW_S == 10.0
    assert stats.busy_share(108.0) == pytest.approx(0.6)
    assert stats.busy_share(111.0) == pytest.approx(0.4)  # the first batch left the window
    assert stats.busy_share(117.0) == pytest.approx(0.1)  # 1 s of the last one's 2 s
    assert stats.busy_share(119.0) == 0.0
    assert _batcher.BatcherStats().busy_share(0.0) == 0.0


def test_a_job_sending_one_request_at_a_time_shows_busy_with_an_empty_queue():
    # What the planner's view reads between a sequential job's requests: no queue, but
    # the device ran that job's batches for most of the last seconds.
    device = FakeDevice(delay=0.05)

    async def main():
        batcher = _batcher(device)
        for _ in range(6):
            await batcher.submit(np.ones((2, 4), np.float32), identity="other")
        assert batcher.queued == 0
        share = batcher.stats.as_dict()["busy_share"]
        await batcher.close()
        return share

    share = asyncio.run(main())
    assert 6 * 0.05 / 10.0 * 0.9 <= share <= 1.0
