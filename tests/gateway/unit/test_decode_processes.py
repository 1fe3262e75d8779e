"""Decoding in worker processes: the same bits as in a thread, a killed worker fails only
the sample it held, the pool recovers, and no shared-memory segment is left behind."""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from hapi.gateway.pushdown._decode_processes import DecodeProcesses, DecodeWorkerLost
from hapi.gateway.pushdown._handler import _chunks
from hapi.models import PendingSample, UndecodableObject
from hapi.models.testing import get_preset
from hapi.protocol import ViewParams
from tests.support import kill_the_busy_one

SHM = Path("/dev/shm")


def _segments() -> set[str]:
    return {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()


@pytest.fixture(scope="module")
def processes() -> Iterator[DecodeProcesses]:
    with DecodeProcesses(2) as pool:
        yield pool


def _jpeg(width: int, height: int, seed: int, fmt: str = "JPEG") -> bytes:
    rng = np.random.default_rng(seed)
    # smooth gradients plus noise: a photo-like image that JPEG does not flatten
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // max(width, 1)), (y * 255 // max(height, 1)), (x + y) % 256], -1)
    noise = rng.integers(0, 40, (height, width, 3))
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


@settings(max_examples=25, deadline=None)
@given(
    width=st.integers(16, 640),
    height=st.integers(16, 640),
    seed=st.integers(0, 2**16),
    preset=st.sampled_from(["imagenet", "efficientnet-lite"]),
    fmt=st.sampled_from(["JPEG", "PNG"]),
    viewed=st.booleans(),
    flip=st.booleans(),
)
def test_a_worker_decodes_the_same_bits_as_a_thread(
    processes, width, height, seed, preset, fmt, viewed, flip
):
    chosen = get_preset(preset)
    box = (height // 4, width // 4, max(1, height // 2), max(1, width // 2))
    jitter = {"order": ("brightness", "contrast"), "factors": (1.2, 0.8)}
    view = ViewParams(view=0, box=box, flip=flip, **jitter) if viewed else None
    sample = PendingSample("k.jpg", _jpeg(width, height, seed, fmt), view=view)
    expected = sample.decode(chosen)
    row = np.full((1, *chosen.sample_shape), np.nan, np.float32)
    (seconds,) = processes.decode([sample], chosen, max_pixels=64_000_000, out=row)
    np.testing.assert_array_equal(row[0], expected)
    assert seconds > 0


def test_an_undecodable_image_is_reported_with_its_key(processes):
    preset = get_preset("imagenet")
    broken = PendingSample("shard.tar", b"\xff\xd8\xff not a jpeg", member="shard.tar#a.jpg")
    row = np.empty(preset.sample_shape, np.float32)
    with pytest.raises(UndecodableObject) as raised:
        processes.decode([broken], preset, max_pixels=64_000_000, out=row[None])
    assert raised.value.key == "shard.tar#a.jpg"
    too_big = PendingSample("big.jpg", _jpeg(300, 300, 1))
    with pytest.raises(UndecodableObject, match="exceeds the limit"):
        processes.decode([too_big], preset, max_pixels=10_000, out=row[None])
    # the workers go on serving
    fine = PendingSample("ok.jpg", _jpeg(64, 64, 2))
    processes.decode([fine], preset, max_pixels=64_000_000, out=row[None])
    np.testing.assert_array_equal(row, fine.decode(preset))


def test_a_worker_killed_mid_sample_fails_that_sample_only_and_is_replaced():
    before = _segments()
    preset = get_preset("imagenet")
    slow = PendingSample("huge.png", _jpeg(4000, 3000, 3, "PNG"))  # a PNG decodes slowly
    quick = PendingSample("small.jpg", _jpeg(200, 150, 4))
    with DecodeProcesses(2) as pool:
        assert _segments() - before  # one slot per worker
        first_pids = set(pool.pids)
        row = np.empty(preset.sample_shape, np.float32)
        for _ in first_pids:  # each worker in turn, so both are past their imports
            pool.decode([quick], preset, max_pixels=64_000_000, out=row[None])
        outcome: dict[str, BaseException | None] = {}

        def decode_slow() -> None:
            try:
                pool.decode(
                    [slow],
                    preset,
                    max_pixels=64_000_000,
                    out=np.empty((1, *preset.sample_shape), np.float32),
                )
                outcome["slow"] = None
            except BaseException as exc:
                outcome["slow"] = exc

        thread = threading.Thread(target=decode_slow)
        thread.start()  # the worker holding the slow sample burns CPU on it: killed
        busy = kill_the_busy_one(first_pids, thread, ticks=2, polls=2000)
        # meanwhile the other worker serves
        pool.decode([quick], preset, max_pixels=64_000_000, out=row[None])
        np.testing.assert_array_equal(row, quick.decode(preset))
        thread.join(60)
        assert isinstance(outcome["slow"], DecodeWorkerLost)
        assert "huge.png" in str(outcome["slow"]) and "killed" in str(outcome["slow"])
        # recovered: two live workers again, one of them new, and both serve
        assert len(pool.pids) == 2 and busy not in pool.pids and set(pool.pids) != first_pids
        for _ in range(4):
            pool.decode([quick], preset, max_pixels=64_000_000, out=row[None])
            np.testing.assert_array_equal(row, quick.decode(preset))
    assert _segments() == before  # nothing left in /dev/shm


def test_a_worker_that_died_while_idle_costs_no_sample():
    preset = get_preset("imagenet")
    quick = PendingSample("small.jpg", _jpeg(120, 90, 5))
    row = np.empty(preset.sample_shape, np.float32)
    with DecodeProcesses(1) as pool:
        (pid,) = pool.pids
        os.kill(pid, signal.SIGKILL)
        for _ in range(500):
            if not pool.pids:
                break
            time.sleep(0.01)
        pool.decode([quick], preset, max_pixels=64_000_000, out=row[None])  # no DecodeWorkerLost
        np.testing.assert_array_equal(row, quick.decode(preset))
        assert pool.pids and pool.pids != [pid]


def test_a_larger_input_grows_the_slot():
    before = _segments()
    big = get_preset("imagenet")
    sample = PendingSample("a.jpg", _jpeg(300, 300, 6))
    with DecodeProcesses(1) as pool:
        wide = dataclasses.replace(big, resize=320, crop=320)  # over the first slot's 256 px
        row = np.empty(wide.sample_shape, np.float32)
        pool.decode([sample], wide, max_pixels=64_000_000, out=row[None])
        np.testing.assert_array_equal(row, sample.decode(wide))
    assert _segments() == before


def test_a_chunk_is_decoded_in_one_message_and_stops_at_an_undecodable_image(processes):
    preset = get_preset("efficientnet-lite")
    chunk = [PendingSample(f"{i}.jpg", _jpeg(100 + 37 * i, 90 + 11 * i, i)) for i in range(5)]
    rows = np.empty((len(chunk), *preset.sample_shape), np.float32)
    times = processes.decode(chunk, preset, max_pixels=64_000_000, out=rows)
    assert len(times) == 5 and min(times) > 0
    for row, sample in zip(rows, chunk, strict=True):
        np.testing.assert_array_equal(row, sample.decode(preset))
    broken = [*chunk[:2], PendingSample("bad.jpg", b"not an image"), chunk[3]]
    with pytest.raises(UndecodableObject) as raised:
        processes.decode(broken, preset, max_pixels=64_000_000, out=rows[:4])
    assert raised.value.key == "bad.jpg"


@pytest.mark.parametrize(
    ("samples", "workers", "chunks"),
    [
        (1, 2, [(0, 1)]),
        (3, 2, [(0, 2), (2, 3)]),
        (32, 2, [(0, 8), (8, 16), (16, 24), (24, 32)]),
        (10, 4, [(0, 3), (3, 6), (6, 9), (9, 10)]),
        (0, 2, []),
    ],
)
def test_a_window_goes_out_in_chunks_that_keep_every_worker_busy(samples, workers, chunks):
    assert _chunks(samples, workers) == chunks
