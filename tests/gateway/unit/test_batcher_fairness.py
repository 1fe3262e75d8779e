"""The batcher between identities: fair order over samples, no credit for idleness, no
one held up by another's window, time slices while shared, fair room in a full queue,
and each batch metered to its identities; with an injected executor, on the CPU."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hapi.gateway._errors import SlowDown
from hapi.gateway.pushdown import _batcher as batcher_module
from hapi.gateway.pushdown._batcher import Batcher, MemoryBudget

SAMPLE = 1000


class Device:
    """Doubles its input; records each batch (its first value and size); held until its
    gate opens; takes ``per_sample`` seconds a sample."""

    def __init__(self, per_sample: float = 0.0) -> None:
        self.per_sample = per_sample
        self.batches: list[tuple[int, int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.gate.wait(5)
        self.batches.append((int(batch[0, 0]) if len(batch) else -1, len(batch)))
        if self.per_sample:
            threading.Event().wait(self.per_sample * len(batch))
        return batch * 2

    @property
    def sizes(self) -> list[int]:
        return [size for _, size in self.batches]

    @property
    def firsts(self) -> list[int]:
        return [first for first, _ in self.batches]


def _batcher(device: Device, **kwargs) -> Batcher:
    kwargs.setdefault("max_delay_s", 0.001)
    return Batcher(
        "t",
        device,
        per_sample_bytes=SAMPLE,
        budget=MemoryBudget(total=64 * SAMPLE),
        pool=ThreadPoolExecutor(1),
        **kwargs,
    )


def _samples(n: int, start: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32).reshape(n, 1)


async def _submit(batcher: Batcher, identity: str, n: int, start: int, **kwargs) -> np.ndarray:
    out, _ = await batcher.submit(_samples(n, start), identity=identity, **kwargs)
    assert out.tolist() == (_samples(n, start) * 2).tolist()  # its own samples, in order
    return out


async def _behind_a_held_batch(
    device: Device, batcher: Batcher, requests: list[tuple[str, int, int]]
) -> None:
    """Submit ``requests`` (identity, samples, first value) in order while the device
    holds a first batch of four of ``flood``'s; then let it run them all."""
    device.gate.clear()
    tasks = [asyncio.create_task(_submit(batcher, "flood", 4, 0))]
    await asyncio.sleep(0.02)  # on the (held) device
    for identity, n, start in requests:
        tasks.append(asyncio.create_task(_submit(batcher, identity, n, start)))
        await asyncio.sleep(0.005)  # arrival order
    device.gate.set()
    await asyncio.gather(*tasks)
    await batcher.close()


@pytest.fixture
def unsliced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches as large as they would be for one identity (slices are tested apart)."""
    monkeypatch.setattr(batcher_module, "_SLICE_S", 3600.0)


def test_a_backlog_of_one_identity_does_not_delay_another(unsliced):
    device = Device()
    flood = [("flood", 4, 100 * i) for i in range(1, 4)]
    asyncio.run(_behind_a_held_batch(device, _batcher(device), [*flood, ("light", 1, 999)]))
    # the light request goes right after the batch on the device, alone: not behind the
    # flood's backlog (first come, first served), nor merged with a window of it
    assert device.batches == [(0, 4), (999, 1), (100, 4), (200, 4), (300, 4)]


def test_identities_take_turns_by_samples(unsliced):
    device = Device()
    a = [("a", 2, 100 + 10 * i) for i in range(3)]
    b = [("b", 2, 200 + 10 * i) for i in range(3)]
    asyncio.run(_behind_a_held_batch(device, _batcher(device), [*a, *b]))
    assert device.firsts == [0, 100, 200, 110, 210, 120, 220]


def test_an_idle_identity_banks_no_credit(unsliced):
    device = Device()

    async def main() -> None:
        batcher = _batcher(device)
        for i in range(5):  # "flood" alone for a while: 20 samples served
            await _submit(batcher, "flood", 4, 1000 + 10 * i)
        flood = [("flood", 4, 100 * i) for i in range(1, 4)]
        light = [("light", 4, 500 + 10 * i) for i in range(3)]
        await _behind_a_held_batch(device, batcher, [*flood, *light])

    asyncio.run(main())
    # light joins at the current virtual time, so the two alternate; with credit for the
    # time it was idle, its three requests would all go first
    assert device.firsts[5:] == [0, 500, 100, 510, 200, 520, 300]


def test_single_samples_of_several_identities_still_merge(unsliced):
    device = Device()
    singles = [(name, 1, 100 * k + i) for i in range(3) for k, name in enumerate("ab", 1)]
    asyncio.run(_behind_a_held_batch(device, _batcher(device), singles))
    assert device.sizes == [4, 6]


def test_while_identities_share_a_batcher_batches_are_time_slices():
    device = Device(per_sample=0.004)  # a slice of 10 ms holds two samples at most

    async def main() -> None:
        batcher = _batcher(device)
        await _submit(batcher, "flood", 8, 0)  # alone: one batch of 8
        with batcher.expecting("light") as arrival:  # light is fetching and decoding
            flood = asyncio.create_task(_submit(batcher, "flood", 8, 100))
            await asyncio.sleep(0.005)
            out, _ = await arrival.submit(_samples(1, 999), wait=False)
        await flood
        await batcher.close()
        assert out.tolist() == [[1998.0]]

    asyncio.run(main())
    assert device.sizes[0] == 8
    assert max(device.sizes[1:]) <= 2 and sum(device.sizes[1:]) == 9
    assert device.firsts.index(999) <= 3  # after a slice or two of the flood's 8, not all


def test_each_batch_is_metered_to_its_identities_by_samples(unsliced):
    device = Device(per_sample=0.01)
    metered: list[tuple[str, int, float]] = []

    async def main() -> None:
        batcher = _batcher(device, meter=lambda *m: metered.append(m))
        requests = [("a", 1, 10), ("a", 1, 11), ("a", 1, 12), ("b", 1, 20)]
        await _behind_a_held_batch(device, batcher, requests)

    asyncio.run(main())
    assert device.sizes == [4, 4]
    first, second = metered[:1], sorted(metered[1:])
    assert [(who, n) for who, n, _ in first] == [("flood", 4)]
    assert [(who, n) for who, n, _ in second] == [("a", 3), ("b", 1)]
    (_, _, a_s), (_, _, b_s) = second
    assert a_s == pytest.approx(3 * b_s) and a_s + b_s >= 0.04


def test_a_full_queue_refuses_only_an_identity_that_holds_it(unsliced):
    device = Device()
    device.gate.clear()

    async def main() -> SlowDown:
        batcher = _batcher(device, max_queue_samples=8)
        held = asyncio.create_task(_submit(batcher, "flood", 4, 0))
        await asyncio.sleep(0.02)  # on the (held) device
        queued = [asyncio.create_task(_submit(batcher, "flood", 4, v)) for v in (100, 150)]
        await asyncio.sleep(0.01)  # the queue is full, all of it the flood's
        with pytest.raises(SlowDown) as refused:
            await batcher.submit(_samples(1, 300), identity="flood")
        later = asyncio.create_task(_submit(batcher, "flood", 4, 200, wait=True))
        await asyncio.sleep(0.005)
        light = asyncio.create_task(_submit(batcher, "light", 1, 999))  # waits, no SlowDown
        await asyncio.sleep(0.01)
        assert not light.done()
        device.gate.set()
        await asyncio.gather(held, *queued, later, light)
        await batcher.close()
        return refused.value

    refused = asyncio.run(main())
    assert refused.status == 503 and refused.retry_after == 1
    # the first room (after the batch of 100) went to light, though the flood waited longer
    assert device.firsts == [0, 100, 999, 150, 200]
