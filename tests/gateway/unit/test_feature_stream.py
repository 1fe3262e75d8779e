"""How a features response goes out: whole when small (its Server-Timing covering every
window, and the gateway's ``total`` time), streamed from its first window when large."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hapi.gateway.pushdown._stream import WHOLE_RESPONSE_BYTES, Answer, FeatureStream
from hapi.protocol import InvalidValue, decode_features, decode_zeros
from tests.planner.synthetic import manifest as synthetic_manifest


def _answer(
    samples: int, row: tuple[int, ...], started: float | None = None, encoding: str = "dense"
) -> Answer:
    params = SimpleNamespace(dtype="float32", split=1, augment=None, encoding=encoding)
    keys = [SimpleNamespace(key=f"k{i}", label=None, meta=None) for i in range(samples)]
    answer = Answer(synthetic_manifest(), params, keys, row, timings={"decode": 1.0})  # type: ignore[arg-type]
    answer.started = started
    return answer


def _send_all(answer: Answer, windows: list[np.ndarray]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def run() -> None:
        stream = FeatureStream(send, answer)
        for rows in windows:
            await stream.rows(rows)
            answer.timings["infer"] = answer.timings.get("infer", 0.0) + 5.0  # a later window
        await stream.finish()

    asyncio.run(run())
    return sent


def _timing(message: dict[str, Any]) -> dict[str, float]:
    value = dict(message["headers"])[b"server-timing"].decode()
    return {p.split(";dur=")[0]: float(p.split(";dur=")[1]) for p in value.split(", ")}


def test_a_small_response_is_sent_whole_and_its_timing_covers_every_window() -> None:
    started = time.perf_counter() - 0.5  # arrived half a second ago
    answer = _answer(4, (8,), started)
    windows = [np.full((2, 8), 1.0, np.float32), np.full((2, 8), 2.0, np.float32)]
    sent = _send_all(answer, windows)
    # Nothing went out before the last window: headers, the safetensors head, then the rest.
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 2
    timing = _timing(sent[0])
    assert timing["infer"] == 10.0  # both windows' inference, not the first one's only
    assert 500 <= timing["total"] <= 2000  # the whole half second since it arrived
    body = b"".join(m["body"] for m in sent[1:])
    tensors, _ = decode_features(body)
    np.testing.assert_array_equal(tensors["features"], np.concatenate(windows))


def test_a_large_response_streams_from_its_first_window() -> None:
    row = (WHOLE_RESPONSE_BYTES // 4,)  # one row is a whole MiB: past the limit
    answer = _answer(2, row)
    windows = [np.zeros((1, *row), np.float32), np.ones((1, *row), np.float32)]
    sent = _send_all(answer, windows)
    kinds = [m["type"] for m in sent]
    assert kinds[0] == "http.response.start" and len(sent) == 5  # head, two windows, tail
    assert "infer" not in _timing(sent[0])  # sent before any later window ran
    tensors, _ = decode_features(b"".join(m["body"] for m in sent[1:]))
    np.testing.assert_array_equal(tensors["features"], np.concatenate(windows))


def test_an_encoded_small_response_is_sent_whole_with_its_encoded_length() -> None:
    answer = _answer(4, (8,), encoding="zeros")
    windows = [np.zeros((2, 8), np.float32), np.full((2, 8), 2.0, np.float32)]
    sent = _send_all(answer, windows)
    headers = dict(sent[0]["headers"])
    body = b"".join(m["body"] for m in sent[1:])
    assert headers[b"x-hapi-encoding"] == b"zeros"
    assert int(headers[b"content-length"]) == len(body)
    tensors, _ = decode_features(decode_zeros(body))
    np.testing.assert_array_equal(tensors["features"], np.concatenate(windows))


def test_an_encoded_large_response_streams_each_window_as_frames_and_ends_with_its_length() -> None:
    row = (WHOLE_RESPONSE_BYTES // 4,)
    answer = _answer(2, row, encoding="zeros")
    windows = [np.zeros((1, *row), np.float32), np.ones((1, *row), np.float32)]
    sent = _send_all(answer, windows)
    headers = dict(sent[0]["headers"])
    assert b"content-length" not in headers and headers[b"x-hapi-encoding"] == b"zeros"
    assert len(sent) == 5  # head, two windows, the tail with the end frame
    assert len(sent[2]["body"]) < 40_000  # a MiB of zeros: its mask alone
    body = b"".join(m["body"] for m in sent[1:])
    tensors, _ = decode_features(decode_zeros(body))
    np.testing.assert_array_equal(tensors["features"], np.concatenate(windows))
    with pytest.raises(InvalidValue, match="no end frame"):  # cut before the last message
        decode_zeros(b"".join(m["body"] for m in sent[1:-1]))
