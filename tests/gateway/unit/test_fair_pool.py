"""The decoding threads shared by identities: jobs run round-robin across identities, a
cancelled job never runs, and a job's exception reaches whoever awaits it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hapi.gateway.pushdown._fairness import FairPool


def test_a_backlog_of_one_identity_does_not_delay_another():
    ran: list[str] = []
    gate = threading.Event()

    def job(name: str) -> str:
        gate.wait(5)
        ran.append(name)
        return name

    with FairPool(1, "test") as pool:
        flood = [pool.submit("flood", job, f"flood {i}") for i in range(5)]
        light = [pool.submit("light", job, f"light {i}") for i in range(2)]
        gate.set()
        assert [f.result(5) for f in light] == ["light 0", "light 1"]
        assert [f.result(5) for f in flood] == [f"flood {i}" for i in range(5)]
    # first come, first served would run light's jobs last (at 5 and 6); in turn, each
    # waits for at most one more of the flood's than the one on the thread
    assert ran.index("light 0") <= 2 and ran.index("light 1") <= 4


def test_identities_run_through_run_in_executor_and_errors_reach_the_caller():
    def fails() -> None:
        raise ValueError("undecodable")

    async def main(pool: FairPool) -> int:
        loop = asyncio.get_running_loop()
        with pytest.raises(ValueError, match="undecodable"):
            await loop.run_in_executor(pool.serving("a"), fails)
        return await loop.run_in_executor(pool.serving("b"), sum, [1, 2, 3])

    with FairPool(2, "test") as pool:
        assert asyncio.run(main(pool)) == 6


def test_a_cancelled_job_never_runs():
    ran: list[int] = []
    gate = threading.Event()

    with FairPool(1, "test") as pool:
        first = pool.submit("a", lambda: gate.wait(5))
        cancelled = pool.submit("a", ran.append, 1)
        kept = pool.submit("b", ran.append, 2)
        assert cancelled.cancel()
        gate.set()
        first.result(5), kept.result(5)
    assert ran == [2]
