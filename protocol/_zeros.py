"""The ``zeros`` encoding of a pushdown answer: the safetensors bytes with zero words left out.

Features taken after a ReLU are about half zeros (ResNet18's splits 4 and 8, 51-53%;
EfficientNet-Lite0's pooled features, 46%: docs/results.md), and a dense answer carries
every one of them over the link. A client that asks for ``encoding=zeros`` gets the same
safetensors bytes in frames that drop the zero words; it decodes them back to exactly the
dense body (the encoding is lossless, a check of the bytes, not of the floats).

The body is a sequence of frames, each a kind byte and a little-endian ``u32`` ``n``, the
bytes the frame decodes to:

- ``RAW`` (0): ``n`` bytes as they are (the safetensors header, the labels, and rows that
  have too few zeros to pay for their mask);
- ``WORDS_2`` (2) and ``WORDS_4`` (4): ``n`` is a multiple of the word size ``w``; a mask
  of one bit a word (``ceil(n / w / 8)`` bytes, least significant bit first; set: the word
  is not zero), then the non-zero words in order;
- ``END`` (255): the last frame; ``n`` is the whole decoded body's length, so a body cut
  short anywhere is an error, never a shorter tensor.

Frames stream: the gateway encodes each window of rows as it is computed, and the body's
length is not known before its end. Encoding and decoding run at memory speed (numpy), far
from zlib's 27-96 MB/s on the storage core.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._errors import CutShort, InvalidValue

ENCODINGS = ("dense", "zeros")
"""A pushdown answer's encodings: ``dense`` (the safetensors body) or ``zeros``."""

RAW, WORDS_2, WORDS_4, END = 0, 2, 4, 255
_FRAME = struct.Struct("<BI")
_WORDS: dict[int, np.dtype[Any]] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
MAX_FRAME = (1 << 32) - 1
PAYS = 0.95
"""A frame is sent without its zeros only when that leaves at most this share of its bytes
(mask included, :func:`zeros_share`): counting the zeros is cheap, gathering the rest is
not free."""


def zeros_share(zeros: float, word: int) -> float:
    """The share of a frame's dense bytes the encoding sends when ``zeros`` of its
    ``word``-byte words are zero: the rest of the words and a bit a word, or all of them
    where that would not pay (:data:`PAYS`). What a planner prices a split's bytes at."""
    packed = (1.0 - zeros) + 1.0 / (8 * word)
    return packed if packed <= PAYS else 1.0


def share_of_zeros(values: np.ndarray) -> float:
    """The share of ``values`` that are exactly zero (a ReLU's features: about half): the
    ``zeros`` argument of :func:`zeros_share`."""
    return 1.0 - int(np.count_nonzero(values)) / max(1, values.size)


def raw_frames(data: bytes | memoryview) -> list[bytes | memoryview]:
    """``data`` as ``RAW`` frames (several when it is over :data:`MAX_FRAME`)."""
    view = memoryview(data).cast("B")
    parts: list[bytes | memoryview] = []
    for start in range(0, len(view), MAX_FRAME):
        piece = view[start : start + MAX_FRAME]
        parts += [_FRAME.pack(RAW, len(piece)), piece]
    return parts


def word_frames(data: bytes | memoryview, word: int) -> list[bytes | memoryview]:
    """``data`` (words of ``word`` bytes, 2 or 4) as one frame without its zero words, or
    as it is when too few of its words are zero (:data:`PAYS`)."""
    view = memoryview(data).cast("B")
    if word not in _WORDS or len(view) % word or len(view) > MAX_FRAME or not len(view):
        return raw_frames(view)
    words = np.frombuffer(view, _WORDS[word])
    kept = words != 0
    if zeros_share(1.0 - np.count_nonzero(kept) / len(words), word) == 1.0:
        return raw_frames(view)
    mask = np.packbits(kept, bitorder="little")
    # np.compress gathers about 4x faster than indexing with the boolean mask.
    return [_FRAME.pack(word, len(view)), mask.tobytes(), np.compress(kept, words).tobytes()]


def end_frame(total: int) -> bytes:
    """The last frame: ``total`` bytes decoded in all."""
    return _FRAME.pack(END, total)


def decode_zeros(body: bytes | memoryview) -> bytes:
    """The dense bytes of a ``zeros`` body.

    Raises:
        CutShort: The body ends before its end frame.
        InvalidValue: A frame of an unknown kind, bytes after the end frame, or an end
            frame that does not match what the frames decoded to.
    """
    return b"".join(_frames(memoryview(body).cast("B")))


def _frames(view: memoryview) -> Iterator[memoryview]:
    """Each frame's decoded bytes."""
    at = total = 0
    while True:
        if at + _FRAME.size > len(view):
            raise CutShort(f"zeros encoding cut short at byte {at} (no end frame)")
        kind, n = _FRAME.unpack_from(view, at)
        at += _FRAME.size
        if kind == END:
            if n != total:
                raise InvalidValue(f"zeros encoding decoded {total} bytes, its end says {n}")
            if at != len(view):
                raise InvalidValue(f"{len(view) - at} bytes after the zeros encoding's end")
            return
        if kind == RAW:
            yield _take(view, at, n)
            at += n
        elif kind in _WORDS:
            words, at = _words(view, at, kind, n)
            yield words.data.cast("B")
        else:
            raise InvalidValue(f"unknown zeros frame kind {kind} at byte {at - _FRAME.size}")
        total += n


def _take(view: memoryview, at: int, n: int) -> memoryview:
    if at + n > len(view):
        raise CutShort(f"zeros frame at byte {at} cut short ({len(view) - at} of {n} bytes)")
    return view[at : at + n]


def _words(view: memoryview, at: int, word: int, n: int) -> tuple[np.ndarray, int]:
    """One words frame's dense words, and where the next frame starts."""
    if n % word:
        raise InvalidValue(f"zeros frame at byte {at}: {n} bytes is not whole {word}-byte words")
    count = n // word
    mask = np.frombuffer(_take(view, at, (count + 7) // 8), np.uint8)
    at += len(mask)
    kept = np.unpackbits(mask, count=count, bitorder="little").view(bool)
    nonzero = int(np.count_nonzero(kept))
    values = np.frombuffer(_take(view, at, nonzero * word), _WORDS[word])
    if nonzero and not np.all(values):
        raise InvalidValue(f"zeros frame at byte {at}: a word sent is zero (its mask is wrong)")
    words = np.zeros(count, _WORDS[word])
    words[np.flatnonzero(kept)] = values  # about 3.5x faster than assigning through the mask
    return words, at + nonzero * word


ZEROS_ENTRY = b"HAPIZRO1"
"""The first bytes of a feature-cache entry kept in this encoding (:func:`compact_entry`).
Read as a safetensors header length they would be over 10^18 bytes, so a dense entry,
which starts with its header's length, never starts with them."""


def compact_entry(entry: bytes, word: int) -> bytes:
    """A cache entry (safetensors, its tensors in ``word``-byte words or whole multiples
    of them) kept without its zero words: :data:`ZEROS_ENTRY`, the header as it is, the
    tensors' words, the end frame; or ``entry`` as it is when that would not be smaller.
    A ReLU's features take about half the bytes to write, to hold and to read back."""
    view = memoryview(entry).cast("B")
    if len(view) < 8:
        return entry
    head = 8 + int.from_bytes(view[:8], "little")
    if head > len(view) or (len(view) - head) % word:
        return entry
    frames = [*raw_frames(view[:head]), *word_frames(view[head:], word), end_frame(len(view))]
    size = len(ZEROS_ENTRY) + sum(len(part) for part in frames)
    return b"".join([ZEROS_ENTRY, *frames]) if size < len(view) else entry


def expand_entry(stored: bytes) -> bytes:
    """The safetensors entry of what the cache keeps (compacted or not).

    Raises:
        InvalidValue: A compacted entry whose frames do not decode (see :func:`decode_zeros`).
    """
    if stored[: len(ZEROS_ENTRY)] != ZEROS_ENTRY:
        return stored
    return decode_zeros(memoryview(stored)[len(ZEROS_ENTRY) :])
