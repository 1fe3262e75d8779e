"""The per-identity request rate of pushdown: a token bucket per identity whose burst is
one second's worth, refusing with SlowDown and a Retry-After of when the next may come."""

from __future__ import annotations

import pytest

from hapi.gateway._errors import SlowDown
from hapi.gateway.pushdown._fairness import RequestRate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_one_seconds_worth_then_slowdown_until_refilled():
    clock = Clock()
    rate = RequestRate(4, clock)
    for _ in range(4):
        rate.take("a")
    with pytest.raises(SlowDown) as refused:
        rate.take("a")
    assert refused.value.status == 503 and refused.value.retry_after == 1
    clock.now += 0.25  # one request's worth
    rate.take("a")
    with pytest.raises(SlowDown):
        rate.take("a")


def test_identities_have_buckets_of_their_own():
    clock = Clock()
    rate = RequestRate(1, clock)
    rate.take("flood")
    with pytest.raises(SlowDown):
        rate.take("flood")
    rate.take("light")  # untouched by the flood


def test_a_slow_rate_says_how_long_to_wait():
    clock = Clock()
    rate = RequestRate(0.2, clock)
    rate.take("a")  # the burst is one request
    clock.now += 1.0
    with pytest.raises(SlowDown) as refused:
        rate.take("a")
    assert refused.value.retry_after == 4


def test_idle_time_refills_no_more_than_the_burst():
    clock = Clock()
    rate = RequestRate(2, clock)
    rate.take("a")
    clock.now += 3600
    rate.take("a")
    rate.take("a")
    with pytest.raises(SlowDown):
        rate.take("a")


def test_no_rate_is_no_limit():
    rate = RequestRate(0)
    for _ in range(1000):
        rate.take("a")
