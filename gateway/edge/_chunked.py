"""Request bodies as the client meant them: aws-chunked decoding and payload verification.

The gateway streams a body to the backend while it is still arriving, under a declared
Content-Length. A body that fails verification must therefore reach the backend short, so
that the backend discards it: :func:`decode_body` holds back the last piece it has decoded
until every signature, checksum and length has been checked.

Framing: https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html and
https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming-trailers.html
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import importlib
import re
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from .._errors import (
    BadDigest,
    IncompleteBody,
    InvalidArgument,
    InvalidDigest,
    InvalidRequest,
    S3Error,
    SignatureDoesNotMatch,
    XAmzContentSHA256Mismatch,
)
from ._sigv4 import EMPTY_SHA256, Verified

__all__ = ["decode_body"]

_MAX_LINE = 4096
_MAX_TRAILER_BYTES = 16 * 1024
_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")
_SIGNATURE = re.compile(rb"chunk-signature=([0-9a-f]{64})")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_STREAMING = frozenset(
    {"streaming-signed", "streaming-signed-trailer", "streaming-unsigned-trailer"}
)
_SIGNED = frozenset({"streaming-signed", "streaming-signed-trailer"})
_WITH_TRAILER = frozenset({"streaming-signed-trailer", "streaming-unsigned-trailer"})
_CHECKSUM_PREFIX = "x-amz-checksum-"


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def digest(self) -> bytes: ...


class _Crc:
    """A CRC as a hashlib-style object; ``function(data, crc)`` continues a finished CRC."""

    __slots__ = ("_function", "_size", "_value")

    def __init__(self, function: Callable[[bytes, int], int], size: int) -> None:
        self._function = function
        self._size = size
        self._value = 0

    def update(self, data: bytes, /) -> None:
        self._value = self._function(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._size, "big")


class _LaneCrc:
    """A reflected CRC in numpy: awscrt's stand-in, at ~50-150 MiB/s rather than GiB/s.

    A CRC register is linear over GF(2): cut a message into equal lanes, and its register is
    the XOR of each lane's own register advanced over the zero bytes that follow the lane.
    The lanes run side by side in numpy, then neighbours merge pairwise, with one table per
    level for "advance over ``_LANE * 2**level`` zero bytes". Call as ``crc(data, previous)``.
    """

    _LANE = 64

    def __init__(self, polynomial: int, width: int) -> None:
        self._mask = (1 << width) - 1
        self._bytes = width // 8
        self._scalar = []
        for byte in range(256):
            crc = byte
            for _ in range(8):
                crc = (crc >> 1) ^ polynomial if crc & 1 else crc >> 1
            self._scalar.append(crc)
        self._dtype = np.uint32 if width == 32 else np.uint64
        self._table = np.array(self._scalar, dtype=self._dtype)
        self._levels: dict[int, npt.NDArray[Any]] = {}

    def __call__(self, data: bytes, previous: int) -> int:
        register = previous ^ self._mask
        lanes = len(data) // self._LANE
        if lanes >= 8:
            register = self._parallel(data[: lanes * self._LANE], lanes, register)
            data = data[lanes * self._LANE :]
        return self._serial(data, register) ^ self._mask

    def _serial(self, data: bytes, register: int) -> int:
        table = self._scalar
        for byte in data:
            register = table[(register ^ byte) & 0xFF] ^ (register >> 8)
        return register

    def _parallel(self, data: bytes, lanes: int, register: int) -> int:
        columns = np.frombuffer(data, dtype=np.uint8).reshape(lanes, self._LANE).T.copy()
        registers: npt.NDArray[Any] = np.zeros(lanes, dtype=self._dtype)
        registers[0] = register
        for column in columns:
            registers = self._table[(registers ^ column) & 0xFF] ^ (registers >> 8)
        level = 0
        while len(registers) > 1:
            if len(registers) % 2:  # a zero lane in front changes nothing
                registers = np.concatenate((np.zeros(1, dtype=self._dtype), registers))
            registers = self._advance(registers[0::2], level) ^ registers[1::2]
            level += 1
        return int(registers[0])

    def _advance(self, registers: npt.NDArray[Any], level: int) -> npt.NDArray[Any]:
        tables = self._levels.get(level)
        if tables is None:
            tables = self._levels[level] = self._level_tables(level)
        out: npt.NDArray[Any] = tables[0][registers & 0xFF]
        for index in range(1, self._bytes):
            out ^= tables[index][(registers >> (8 * index)) & 0xFF]
        return out

    def _level_tables(self, level: int) -> npt.NDArray[Any]:
        bits = self._bytes * 8
        if level == 0:
            zeros = bytes(self._LANE)
            images = np.array([self._serial(zeros, 1 << b) for b in range(bits)], self._dtype)
        else:
            basis = np.array([1 << b for b in range(bits)], dtype=self._dtype)
            images = self._advance(self._advance(basis, level - 1), level - 1)
        values = np.arange(256)
        tables = np.zeros((self._bytes, 256), dtype=self._dtype)
        for bit in range(bits):
            tables[bit // 8] ^= np.where((values >> (bit % 8)) & 1, images[bit], 0).astype(
                self._dtype
            )
        return tables


def _crt_checksums() -> Any:
    try:
        return importlib.import_module("awscrt.checksums")
    except ImportError:
        return None


_CRT = _crt_checksums()
_crc32c: Callable[[bytes, int], int] = _CRT.crc32c if _CRT is not None else _LaneCrc(0x82F63B78, 32)
_crc64nvme: Callable[[bytes, int], int] = (
    _CRT.crc64nvme if _CRT is not None else _LaneCrc(0x9A6C9329AC4BC9B5, 64)
)
_ALGORITHMS: dict[str, Callable[[], _Digest]] = {
    "crc32": lambda: _Crc(zlib.crc32, 4),
    "crc32c": lambda: _Crc(_crc32c, 4),
    "crc64nvme": lambda: _Crc(_crc64nvme, 8),
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha512": hashlib.sha512,
}


async def decode_body(
    source: AsyncIterator[bytes],
    verified: Verified | None,
    *,
    content_length: int | None,
    headers: Mapping[str, str],
    check_header_checksums: bool = True,
) -> AsyncIterator[bytes]:
    """Yield the payload the client meant to store, verifying it on the way.

    The last non-empty piece is yielded only once the whole body has been verified, so a
    body that fails reaches its consumer short. Memory stays bounded by one read.

    Args:
        source: The raw request body, in reads of any size.
        verified: The request's verified signature (from ``verify_request``); None for an
            anonymous request, whose body passes through.
        content_length: The payload length the consumer was promised: Content-Length for
            a plain body, x-amz-decoded-content-length for an aws-chunked one; None if
            unknown.
        headers: The request headers, lowercase names (Content-MD5, x-amz-checksum-*).
        check_header_checksums: Check ``x-amz-checksum-*`` headers against the payload;
            turn off where they describe something else (CompleteMultipartUpload).

    Yields:
        Payload bytes: aws-chunked framing removed, never an empty piece.

    Raises:
        IncompleteBody: The payload is shorter than declared or its framing is cut off.
        InvalidRequest: The payload is longer than declared, or its framing is malformed.
        SignatureDoesNotMatch: A chunk or trailer signature is wrong.
        XAmzContentSHA256Mismatch: The payload's SHA-256 differs from the signed one.
        BadDigest: Content-MD5 or an x-amz-checksum-* header or trailer does not match (a
            checksum header that is not base64 matches nothing).
        InvalidDigest: Content-MD5 is not base64.
        InvalidArgument: A checksum trailer is not base64.
    """
    checks = _PayloadChecks(verified, headers, content_length, check_header_checksums)
    decoder = None
    if verified is not None and verified.payload_mode in _STREAMING:
        decoder = _ChunkDecoder(verified)
    held = b""
    async for data in source:
        for piece in decoder.feed(data) if decoder is not None else (data,):
            if piece:
                checks.update(piece)
                if held:
                    yield held
                held = piece
    if decoder is not None:
        decoder.close()
    checks.finish(decoder.trailers if decoder is not None else {})
    if held:
        yield held


class _PayloadChecks:
    """The payload's declared length, hashes and checksums, checked as it streams."""

    def __init__(
        self,
        verified: Verified | None,
        headers: Mapping[str, str],
        content_length: int | None,
        check_header_checksums: bool,
    ) -> None:
        lengths = {content_length}
        if verified is not None and verified.payload_mode in _STREAMING:
            lengths.add(verified.decoded_content_length)
        lengths.discard(None)
        if len(lengths) > 1:
            raise InvalidRequest("x-amz-decoded-content-length disagrees with the body length.")
        self._expected_length = lengths.pop() if lengths else None
        self._length = 0
        self._digests: dict[str, _Digest] = {}
        # (algorithm, expected digest, error class, what to call it in the message)
        self._expectations: list[tuple[str, bytes, type[Exception], str]] = []
        self._trailer_names = verified.trailer_names if verified is not None else ()
        if verified is not None and verified.payload_sha256 is not None:
            self._expect("sha256", bytes.fromhex(verified.payload_sha256), "x-amz-content-sha256")
        lowered = {name.lower(): value for name, value in headers.items()}
        if "content-md5" in lowered:
            md5 = _b64("content-md5", lowered["content-md5"], InvalidDigest)
            self._expect("md5", md5, "content-md5")
        if check_header_checksums:
            for name, value in lowered.items():
                algorithm = name.removeprefix(_CHECKSUM_PREFIX)
                if name.startswith(_CHECKSUM_PREFIX) and algorithm in _ALGORITHMS:
                    # Not base64 is one more wrong digest: the store answers BadDigest too.
                    self._expect(algorithm, _b64(name, value, BadDigest), name)
        for name in self._trailer_names:
            if name.startswith(_CHECKSUM_PREFIX):
                self._digest(_trailer_algorithm(name))

    def _digest(self, algorithm: str) -> _Digest:
        digest = self._digests.get(algorithm)
        if digest is None:
            if algorithm == "md5":
                digest = hashlib.md5(usedforsecurity=False)
            else:
                digest = _ALGORITHMS[algorithm]()
            self._digests[algorithm] = digest
        return digest

    def _expect(self, algorithm: str, expected: bytes, label: str) -> None:
        self._digest(algorithm)
        error: type[Exception] = BadDigest
        if label == "x-amz-content-sha256":
            error = XAmzContentSHA256Mismatch
        self._expectations.append((algorithm, expected, error, label))

    def update(self, piece: bytes) -> None:
        self._length += len(piece)
        if self._expected_length is not None and self._length > self._expected_length:
            raise InvalidRequest(f"The payload is longer than {self._expected_length} bytes.")
        for digest in self._digests.values():
            digest.update(piece)

    def finish(self, trailers: Mapping[str, str]) -> None:
        if self._expected_length is not None and self._length < self._expected_length:
            raise IncompleteBody(
                f"The payload has {self._length} bytes, not the {self._expected_length} declared."
            )
        expectations = list(self._expectations)
        for name in self._trailer_names:
            if name not in trailers:
                raise IncompleteBody(f"The trailer {name}, declared in x-amz-trailer, is missing.")
            if name.startswith(_CHECKSUM_PREFIX):
                expected = _b64(name, trailers[name], InvalidArgument)
                expectations.append((_trailer_algorithm(name), expected, BadDigest, name))
        for name in trailers:
            if name not in self._trailer_names:
                raise InvalidRequest(f"The trailer {name} was not declared in x-amz-trailer.")
        digests = {algorithm: d.digest() for algorithm, d in self._digests.items()}
        for algorithm, expected, error, label in expectations:
            if digests[algorithm] != expected:
                raise error(f"The payload does not match its {label}.")


def _trailer_algorithm(name: str) -> str:
    algorithm = name.removeprefix(_CHECKSUM_PREFIX)
    if algorithm not in _ALGORITHMS:
        raise InvalidRequest(f"The checksum trailer {name} is not supported.")
    return algorithm


def _b64(name: str, value: str, error: type[S3Error]) -> bytes:
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise error(f"The value of {name} is not valid base64.") from None


class _ChunkDecoder:
    """An aws-chunked parser fed reads of any size; checks chunk and trailer signatures.

    A body is ``size[;chunk-signature=sig]\\r\\n data \\r\\n`` repeated, a zero-size chunk,
    optional ``name:value\\r\\n`` trailers (with ``x-amz-trailer-signature`` when signed),
    and an empty line.
    """

    def __init__(self, verified: Verified) -> None:
        self._signed = verified.payload_mode in _SIGNED
        self._trailers_allowed = verified.payload_mode in _WITH_TRAILER
        self._trailer_signed = verified.payload_mode == "streaming-signed-trailer"
        self._key = verified.signing_key
        self._context = f"{verified.amz_date}\n{verified.scope}\n"
        self._previous = verified.signature
        self._state = self._on_size_line
        self._line = bytearray()
        self._remaining = 0  # bytes of the current chunk's data still to come
        self._chunk_hash = hashlib.sha256()
        self._chunk_signature = ""
        self._trailer_bytes = 0
        self._trailer_text: list[str] = []
        self._trailer_signature: str | None = None
        self._done = False
        self.trailers: dict[str, str] = {}

    def feed(self, data: bytes) -> list[bytes]:
        """Consume one read; return the payload bytes it completed, possibly none."""
        pieces: list[bytes] = []
        position, end = 0, len(data)
        while position < end:
            if self._done:
                raise InvalidRequest("The request has data after the end of its aws-chunked body.")
            if self._remaining > 0:
                take = min(self._remaining, end - position)
                piece = data if take == end else data[position : position + take]
                if self._signed:
                    self._chunk_hash.update(piece)
                pieces.append(piece)
                position += take
                self._remaining -= take
            else:
                position = self._read_line(data, position, end)
        return pieces

    def close(self) -> None:
        """Check that the body ended where its framing says it does."""
        if not self._done:
            raise IncompleteBody("The aws-chunked body ended before its final chunk.")

    def _read_line(self, data: bytes, position: int, end: int) -> int:
        limit = min(end, position + _MAX_LINE - len(self._line))
        newline = data.find(b"\n", position, limit)
        if newline < 0:
            if limit < end:
                raise InvalidRequest("An aws-chunked line is too long.")
            self._line += data[position:end]
            return end
        self._line += data[position : newline + 1]
        line = bytes(self._line)
        self._line.clear()
        if not line.endswith(b"\r\n"):
            raise InvalidRequest("aws-chunked lines must end with CRLF.")
        self._state(line[:-2])
        return newline + 1

    def _on_size_line(self, line: bytes) -> None:
        size_text, _, extension = line.partition(b";")
        if not _CHUNK_SIZE.fullmatch(size_text):
            raise InvalidRequest(f"Bad aws-chunked chunk size {size_text[:32]!r}.")
        size = int(size_text, 16)
        if self._signed:
            match = _SIGNATURE.fullmatch(extension)
            if match is None:
                raise InvalidRequest("A signed aws-chunked chunk lacks its chunk-signature.")
            self._chunk_signature = match.group(1).decode()
            self._chunk_hash = hashlib.sha256()
        if size == 0:
            self._verify_chunk(EMPTY_SHA256)
            self._state = self._on_trailer_line
        else:
            self._remaining = size
            self._state = self._on_data_end

    def _on_data_end(self, line: bytes) -> None:
        if line:
            raise InvalidRequest("An aws-chunked chunk is longer than its declared size.")
        if self._signed:
            self._verify_chunk(self._chunk_hash.hexdigest())
        self._state = self._on_size_line

    def _on_trailer_line(self, line: bytes) -> None:
        if not line:
            self._finish_trailers()
            return
        self._trailer_bytes += len(line)
        if not self._trailers_allowed or self._trailer_signature is not None:
            raise InvalidRequest("Unexpected data after the final aws-chunked chunk.")
        if self._trailer_bytes > _MAX_TRAILER_BYTES:
            raise InvalidRequest("The aws-chunked trailers are too large.")
        name_bytes, colon, value_bytes = line.partition(b":")
        if not colon:
            raise InvalidRequest("A trailer line is not name:value.")
        try:
            name = name_bytes.decode("ascii").strip().lower()
            value = value_bytes.decode("ascii").strip()
        except UnicodeDecodeError:
            raise InvalidRequest("Trailer lines must be ASCII.") from None
        if name == "x-amz-trailer-signature" and self._trailer_signed:
            self._trailer_signature = value
        else:
            self.trailers[name] = value
            self._trailer_text.append(f"{name}:{value}\n")

    def _finish_trailers(self) -> None:
        if self._trailer_signed:
            if self._trailer_signature is None or not _HEX64.fullmatch(self._trailer_signature):
                raise InvalidRequest("The signed trailer lacks x-amz-trailer-signature.")
            digest = hashlib.sha256("".join(self._trailer_text).encode()).hexdigest()
            expected = self._hmac(
                f"AWS4-HMAC-SHA256-TRAILER\n{self._context}{self._previous}\n{digest}"
            )
            if not hmac.compare_digest(expected, self._trailer_signature):
                raise SignatureDoesNotMatch("The trailer signature does not match.")
        self._done = True

    def _verify_chunk(self, data_sha256: str) -> None:
        if not self._signed:
            return
        expected = self._hmac(
            f"AWS4-HMAC-SHA256-PAYLOAD\n{self._context}{self._previous}\n"
            f"{EMPTY_SHA256}\n{data_sha256}"
        )
        if not hmac.compare_digest(expected, self._chunk_signature):
            raise SignatureDoesNotMatch("An aws-chunked chunk signature does not match.")
        self._previous = expected

    def _hmac(self, string_to_sign: str) -> str:
        return hmac.new(self._key, string_to_sign.encode(), "sha256").hexdigest()
