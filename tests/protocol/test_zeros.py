"""The ``zeros`` encoding: lossless for any bytes, smaller only where zero words are, and a
body cut, padded or forged anywhere is an error, never other features."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hapi.protocol import ZEROS_ENTRY, InvalidValue, compact_entry, expand_entry
from hapi.protocol._zeros import decode_zeros, end_frame, raw_frames, word_frames


@st.composite
def _words(draw: st.DrawFn) -> tuple[bytes, int]:
    """Bytes of ``word``-byte words, each zero with a drawn probability."""
    word = draw(st.sampled_from([2, 4]))
    count = draw(st.integers(0, 300))
    share = draw(st.floats(0, 1))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = rng.integers(1, 2 ** (8 * word), count, dtype=np.uint64)
    values[rng.random(count) < share] = 0
    return values.astype(f"<u{word}").tobytes(), word


def _body(*pieces: tuple[bytes, int | None]) -> bytes:
    """Frames as the gateway sends them: each piece raw (``None``) or as words."""
    parts: list[bytes | memoryview] = []
    for data, word in pieces:
        parts += raw_frames(data) if word is None else word_frames(data, word)
    total = sum(len(data) for data, _ in pieces)
    return b"".join(bytes(p) for p in [*parts, end_frame(total)])


@given(_words(), st.binary(max_size=40), st.binary(max_size=17))
def test_any_bytes_come_back_exactly(words: tuple[bytes, int], head: bytes, tail: bytes) -> None:
    data, word = words
    assert decode_zeros(_body((head, None), (data, word), (tail, None))) == head + data + tail
    assert decode_zeros(_body((data, word))) == data


@given(_words())
def test_a_frame_is_smaller_by_its_zero_words_or_no_larger_than_raw(
    words: tuple[bytes, int],
) -> None:
    data, word = words
    body = _body((data, word))
    count = len(data) // word
    zeros = count - int(np.count_nonzero(np.frombuffer(data, f"<u{word}")))
    framing = 2 * 5  # the frame's kind and length, and the end frame's
    packed = len(data) - zeros * word + (count + 7) // 8 + framing
    assert len(body) <= len(data) + framing
    if count and zeros >= 0.2 * count + 1:  # pays by far: always sent without its zeros
        assert len(body) == packed


@pytest.mark.parametrize("word", [2, 4])
def test_bytes_that_are_not_whole_words_go_raw(word: int) -> None:
    data = bytes(4 * 10 + 1)  # all zeros, but one byte over whole words
    assert word_frames(data, word)[0] == struct.pack("<BI", 0, len(data))
    assert decode_zeros(_body((data, word))) == data


@given(st.data())
def test_a_body_cut_anywhere_is_an_error(data: st.DataObject) -> None:
    values = np.zeros(64, "<u4")
    values[::3] = 7
    body = _body((b"head", None), (values.tobytes(), 4))
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(InvalidValue):
        decode_zeros(body[:cut])


def test_a_forged_body_is_an_error_with_its_reason() -> None:
    values = np.zeros(64, "<u4")
    values[::3] = 7
    good = _body((values.tobytes(), 4))
    with pytest.raises(InvalidValue, match="bytes after"):
        decode_zeros(good + b"x")
    with pytest.raises(InvalidValue, match="its end says"):
        decode_zeros(good[:-4] + struct.pack("<I", 255))
    with pytest.raises(InvalidValue, match="unknown zeros frame kind 9"):
        decode_zeros(struct.pack("<BI", 9, 4) + b"abcd" + end_frame(4))
    with pytest.raises(InvalidValue, match="not whole 4-byte words"):
        decode_zeros(struct.pack("<BI", 4, 6) + b"\x3f" + end_frame(6))
    # A mask that claims a word is there which the frame sends as zero.
    forged = struct.pack("<BI", 4, 8) + b"\x03" + struct.pack("<II", 5, 0) + end_frame(8)
    with pytest.raises(InvalidValue, match="a word sent is zero"):
        decode_zeros(forged)


@given(_words(), st.integers(0, 3), st.booleans())
def test_a_cache_entry_comes_back_exactly_compacted_or_not(
    words: tuple[bytes, int], labels: int, half: bool
) -> None:
    from hapi.protocol import encode_features

    data, word = words
    dtype = "float16" if word == 2 else "float32"
    rows = np.frombuffer(data, f"<f{word}").astype(np.float32).reshape(-1, 1)
    if half:
        rows = np.where(np.arange(len(rows))[:, None] % 2 == 0, 0.0, rows).astype(np.float32)
    label = np.arange(len(rows), dtype=np.int64) if labels and len(rows) else None
    entry = encode_features(rows, dtype=dtype, labels=label, metadata={"keys": "[]"})
    stored = compact_entry(entry, word)
    assert expand_entry(stored) == entry
    assert stored == entry or (stored.startswith(ZEROS_ENTRY) and len(stored) < len(entry))
    assert not entry.startswith(ZEROS_ENTRY)  # a dense entry starts with its header's length


def test_a_compacted_entry_that_does_not_decode_is_an_error() -> None:
    values = np.zeros(64, "<u4")
    entry_like = (8).to_bytes(8, "little") + b"{}      " + values.tobytes()
    stored = compact_entry(entry_like, 4)
    assert stored.startswith(ZEROS_ENTRY)
    with pytest.raises(InvalidValue):
        expand_entry(stored[:-3])
