"""The bandwidth a job remembers per endpoint (a real file in a temporary XDG cache
directory), and the estimate it makes from its own responses."""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import pickle
import threading
from pathlib import Path

import pytest

from hapi.sdk.planning._link import (
    DEFAULT_LIFETIME_S,
    BandwidthMemory,
    EpochLog,
    LinkEstimate,
    Served,
    SpanLog,
)
from hapi.sdk.planning._stats import served_stats

GATEWAY = "http://gateway.test:9080"


def test_the_file_lives_in_the_xdg_cache_directory(tmp_path: Path) -> None:
    memory = BandwidthMemory.from_environment({"XDG_CACHE_HOME": str(tmp_path)})
    assert memory.path == tmp_path / "hapi" / "bandwidth.json"
    relative = BandwidthMemory.from_environment({"XDG_CACHE_HOME": "not/absolute"})
    assert relative.path == Path.home() / ".cache" / "hapi" / "bandwidth.json"


def test_a_figure_is_used_within_its_lifetime_and_ignored_after(tmp_path: Path) -> None:
    memory = BandwidthMemory(tmp_path / "hapi" / "bandwidth.json", lifetime_s=3600.0)
    memory.remember(GATEWAY, 12e6, now=1000.0)
    kept = memory.recall(GATEWAY, now=1000.0 + 3599.0)
    assert kept is not None and (kept.bits_per_second, kept.source) == (12e6, "remembered")
    assert kept.measured_at == 1000.0
    assert memory.recall(GATEWAY, now=1000.0 + 3601.0) is None
    assert memory.recall("http://another.test", now=1001.0) is None
    assert DEFAULT_LIFETIME_S == 24 * 3600.0


def test_figures_of_several_endpoints_and_processes_share_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bandwidth.json"
    BandwidthMemory(path).remember(GATEWAY, 1e6, now=10.0)
    BandwidthMemory(path).remember("http://other.test", 2e6, now=20.0)
    BandwidthMemory(path).remember(GATEWAY, 3e6, now=30.0)  # the newer figure replaces
    saved = json.loads(path.read_text())
    assert saved["endpoints"] == {
        GATEWAY: {"bits_per_second": 3e6, "measured_at": 30.0},
        "http://other.test": {"bits_per_second": 2e6, "measured_at": 20.0},
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bandwidth.json"]  # no leftovers


def test_concurrent_writers_never_leave_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "bandwidth.json"
    memory = BandwidthMemory(path)
    memory.remember(GATEWAY, 1e6)
    seen: list[object] = []

    def write(n: int) -> None:
        for i in range(50):
            BandwidthMemory(path).remember(f"http://writer{n}.test", float(i + 1))

    def read() -> None:
        for _ in range(200):
            seen.append(json.loads(path.read_text())["format"])

    threads = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    threads.append(threading.Thread(target=read))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == ["hapi-bandwidth/1"] * 200


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe\x00",
        json.dumps({"format": "someone-else/3", "endpoints": {}}).encode(),
        json.dumps([1, 2, 3]).encode(),
        json.dumps({"format": "hapi-bandwidth/1", "endpoints": "all of them"}).encode(),
    ],
    ids=["corrupt", "binary", "foreign", "a-list", "no-endpoints"],
)
def test_a_corrupt_or_foreign_file_is_ignored_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    path = tmp_path / "bandwidth.json"
    path.write_bytes(content)
    memory = BandwidthMemory(path)
    with caplog.at_level(logging.WARNING, logger="hapi.sdk"):
        assert memory.recall(GATEWAY) is None
        memory.remember(GATEWAY, 5e6)  # replaces it, without a second warning
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and str(path) in warned[0].getMessage()
    again = memory.recall(GATEWAY)
    assert again is not None and again.bits_per_second == 5e6


def test_an_entry_that_is_not_a_figure_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "bandwidth.json"
    bad = {"bits_per_second": True, "measured_at": 1.0}
    negative = {"bits_per_second": -5.0, "measured_at": 1.0}
    endpoints = {GATEWAY: bad, "http://b.test": negative, "http://c.test": "fast"}
    path.write_text(json.dumps({"format": "hapi-bandwidth/1", "endpoints": endpoints}))
    memory = BandwidthMemory(path, lifetime_s=1e12)
    assert [memory.recall(e, now=2.0) for e in endpoints] == [None, None, None]


def test_an_unwritable_cache_directory_costs_only_the_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    memory = BandwidthMemory(blocker / "hapi" / "bandwidth.json")
    memory.remember(GATEWAY, 1e6)  # logged, not raised
    assert memory.recall(GATEWAY) is None


def _fed(estimate: LinkEstimate, sizes_and_seconds: list[tuple[int, float]]) -> None:
    now = 0.0
    for size, seconds in sizes_and_seconds:
        estimate.add(size, (now, now + seconds))
        now += seconds


def test_the_estimate_is_bytes_over_time_on_the_wire_with_overlaps_counted_once() -> None:
    estimate = LinkEstimate()
    estimate.add(1_000_000, (0.0, 1.0))
    estimate.add(1_000_000, (0.5, 1.5))  # half of it overlapped the first
    assert estimate.bandwidth_bps() == pytest.approx(2_000_000 * 8 / 1.5)
    assert estimate.bandwidth_bps(1) == pytest.approx(8e6)


def test_a_steady_link_is_stable_after_the_minimum_and_checkpoints_every_few() -> None:
    estimate = LinkEstimate(min_responses=8)
    checkpoints, now = [], 0.0
    for i in range(16):
        seconds = 0.1 * (1.05 if i % 2 else 0.95)
        estimate.add(100_000, (now, now + seconds))
        now += seconds
        checkpoints.append(estimate.checkpoint())
    assert all(c is None for c in checkpoints[:7])
    taken = [i + 1 for i, c in enumerate(checkpoints) if c is not None]
    assert taken == [8, 12, 16]
    assert checkpoints[7] == pytest.approx(8e6, rel=0.06)


def test_a_link_still_changing_is_not_stable() -> None:
    estimate = LinkEstimate(min_responses=8)
    _fed(estimate, [(100_000, 0.1)] * 4 + [(100_000, 1.0)] * 4)  # ten times slower now
    assert estimate.responses == 8 and not estimate.stable
    assert estimate.checkpoint() is None


def _append(log: SpanLog, first: int) -> None:
    for i in range(first, first + 50):
        log.add(1000 + i, (float(i), float(i) + 0.5))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_span_log_gathers_every_process_and_only_its_owner_removes_it(method) -> None:
    log = SpanLog()
    context = multiprocessing.get_context(method)
    workers = [context.Process(target=_append, args=(log, first)) for first in (0, 50)]
    for worker in workers:
        worker.start()
    _append(log, 100)
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    spans = log.spans()
    assert len(log) == len(spans) == 150
    # whole records from three processes, in the order the requests started
    assert [start for _, (start, _) in spans] == [float(i) for i in range(150)]
    assert all(nbytes == 1000 + int(start) for nbytes, (start, _) in spans)
    assert log.readers() == 3
    assert os.path.exists(log.path)  # the workers' exits removed nothing
    path = log.path
    del log, spans
    gc.collect()
    assert not os.path.exists(path)


def test_a_span_log_whose_owner_went_away_is_not_written_again(tmp_path: Path) -> None:
    owner = SpanLog()
    copy = pickle.loads(pickle.dumps(owner))  # as a spawned worker holds it
    copy.add(10, (0.0, 1.0))
    assert len(owner) == 1
    path = owner.path
    del owner
    gc.collect()
    copy.add(10, (1.0, 2.0))  # logged nowhere, and no stray file created
    assert not os.path.exists(path)
    assert len(copy) == 0 and copy.spans() == []


def _serve(log: EpochLog, split: int) -> None:
    for i in range(3):
        start = 10.0 * i
        log.add(
            Served(4, split, (start, start + 2.0), (start + 2.0, start + 2.5), 1000, os.getpid())
        )


def test_the_epoch_log_gathers_every_process_and_empties_when_taken() -> None:
    log = EpochLog()
    worker = multiprocessing.get_context("fork").Process(target=_serve, args=(log, 3))
    worker.start()
    worker.join(60)
    assert worker.exitcode == 0
    _serve(log, 3)
    taken = log.take()
    assert len(taken) == 6 and len({s.pid for s in taken}) == 2
    assert taken[0] == Served(4, 3, (0.0, 2.0), (2.0, 2.5), 1000, worker.pid)
    assert log.take() == [] and len(log) == 0
    _serve(log, 5)  # what comes after a take is the next epoch's
    assert [s.split for s in log.take()] == [5, 5, 5]


def test_an_epochs_figures_count_the_responses_at_its_split() -> None:
    served = [
        Served(4, 3, (0.0, 2.0), (2.0, 2.5), 1000, 1),
        Served(4, 3, (1.0, 3.0), (3.0, 3.5), 3000, 2),  # overlapping: counted once
        Served(0, 3, (0.0, 0.0), (3.0, 3.1), 500, 2),  # a second part of the same batch
        Served(4, 5, (5.0, 9.0), (9.0, 9.5), 10**6, 1),  # the split before a move
    ]
    stats = served_stats(7, served, 3, seconds=12.0)
    assert (stats.epoch, stats.samples, stats.requests, stats.split) == (7, 8, 2, 3)
    assert stats.seconds == 12.0 and stats.mode == "pushdown"
    assert stats.storage_seconds == pytest.approx(3.0)  # [0, 3]
    assert stats.transfer_seconds == pytest.approx(1.0)  # [2, 2.5] and [3, 3.5]
    assert stats.transfer_bytes == 4500
    assert stats.bandwidth_bps == pytest.approx(4500 * 8 / 1.0)
    assert stats.storage_ms_per_sample == pytest.approx(3000 / 8)
