"""aws-chunked decoding and payload verification, against AWS's published vectors and botocore."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import io
import random
import zlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.config import Config
from botocore.httpchecksum import Crc32Checksum, Sha1Checksum, Sha256Checksum

from hapi.gateway._errors import (
    BadDigest,
    IncompleteBody,
    InvalidArgument,
    InvalidDigest,
    InvalidRequest,
    S3Error,
    SignatureDoesNotMatch,
    XAmzContentSHA256Mismatch,
)
from hapi.gateway.edge import _chunked
from hapi.gateway.edge._chunked import decode_body
from hapi.gateway.edge._sigv4 import Verified, verify_request
from tests.gateway.support import botocore_chunked, encode_signed

# The example of https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html and
# https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming-trailers.html
DOC_AKID = "AKIAIOSFODNN7EXAMPLE"
DOC_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DOC_NOW = datetime(2013, 5, 24, 0, 5, tzinfo=UTC)
DOC_CHUNKS = [b"a" * 65536, b"a" * 1024]
DOC_PAYLOAD = b"".join(DOC_CHUNKS)
DOC_SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
DOC_CHUNK_SIGNATURES = [
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
]
DOC_TRAILER_SEED = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e"
DOC_TRAILER_FINAL_CHUNK_SIGNATURE = (
    "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992"
)
DOC_TRAILER_SIGNATURE = "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435"
DOC_CRC32C = "sOO8/Q=="


def doc_verified(*, trailer: bool) -> Verified:
    """Verify the documented seed request; its result drives the chunk checks."""
    scope = f"{DOC_AKID}/20130524/us-east-1/s3/aws4_request"
    headers = [
        ("host", "s3.amazonaws.com"),
        ("x-amz-date", "20130524T000000Z"),
        ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        ("content-encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", "66560"),
    ]
    if trailer:
        mode, seed = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER", DOC_TRAILER_SEED
        headers.append(("x-amz-trailer", "x-amz-checksum-crc32c"))
        signed = "content-encoding;host;x-amz-content-sha256;x-amz-date;"
        signed += "x-amz-decoded-content-length;x-amz-storage-class;x-amz-trailer"
    else:
        mode, seed = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", DOC_SEED
        headers.append(("content-length", "66824"))
        signed = "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
        signed += "x-amz-decoded-content-length;x-amz-storage-class"
    headers.append(("x-amz-content-sha256", mode))
    headers.append(
        (
            "authorization",
            f"AWS4-HMAC-SHA256 Credential={scope},SignedHeaders={signed},Signature={seed}",
        )
    )
    return verify_request(
        method="PUT",
        raw_path="/examplebucket/chunkObject.txt",
        raw_query="",
        headers=headers,
        secrets={DOC_AKID: DOC_SECRET},
        now=DOC_NOW,
    )


def unsigned_trailer_verified(length: int, trailer: str = "x-amz-checksum-crc32") -> Verified:
    return dataclasses.replace(
        doc_verified(trailer=True),
        payload_mode="streaming-unsigned-trailer",
        decoded_content_length=length,
        trailer_names=(trailer,),
    )


def plain_verified(mode: str, payload: bytes) -> Verified:
    declared = hashlib.sha256(payload).hexdigest() if mode == "sha256" else None
    return dataclasses.replace(
        doc_verified(trailer=False),
        payload_mode=mode,
        payload_sha256=declared,
        decoded_content_length=None,
        trailer_names=(),
    )


def splits(body: bytes, size: int | None, seed: int = 0) -> list[bytes]:
    """``body`` in reads of ``size`` bytes; random sizes for 0; one read for None."""
    if size is None:
        return [body]
    rng, reads, position = random.Random(seed), [], 0
    while position < len(body):
        step = size or rng.randint(1, 9000)
        reads.append(body[position : position + step])
        position += step
    return reads


def decode(
    reads: list[bytes],
    verified: Verified | None,
    *,
    content_length: int | None = None,
    headers: dict[str, str] | None = None,
    **options: bool,
) -> tuple[bytes, S3Error | None]:
    """Run decode_body; return what it yielded and the error it raised, if any."""

    async def source() -> AsyncIterator[bytes]:
        for read in reads:
            yield read

    async def main() -> tuple[bytes, S3Error | None]:
        out = bytearray()
        pieces = decode_body(
            source(), verified, content_length=content_length, headers=headers or {}, **options
        )
        try:
            async for piece in pieces:
                assert piece, "decode_body yielded an empty piece"
                out += piece
        except S3Error as exc:
            return bytes(out), exc
        return bytes(out), None

    return asyncio.run(main())


SPLITS = [1, 7, 4096, 0, None]


# --- the AWS documentation's vectors -------------------------------------------------------


def test_doc_seed_signature_verifies():
    verified = doc_verified(trailer=False)
    assert verified.payload_mode == "streaming-signed"
    assert verified.decoded_content_length == 66560
    assert verified.signature == DOC_SEED


def test_encoder_reproduces_the_doc_chunk_signatures():
    body, signatures = encode_signed(DOC_CHUNKS, doc_verified(trailer=False))
    assert signatures == DOC_CHUNK_SIGNATURES
    assert len(body) == 66824  # the documented Content-Length


def test_encoder_reproduces_the_doc_trailer_signatures():
    verified = doc_verified(trailer=True)
    assert verified.trailer_names == ("x-amz-checksum-crc32c",)
    _, signatures = encode_signed(DOC_CHUNKS, verified, {"x-amz-checksum-crc32c": DOC_CRC32C})
    assert signatures[-2:] == [DOC_TRAILER_FINAL_CHUNK_SIGNATURE, DOC_TRAILER_SIGNATURE]


@pytest.mark.parametrize("size", SPLITS)
def test_decodes_the_doc_signed_body(size):
    body, _ = encode_signed(DOC_CHUNKS, doc_verified(trailer=False))
    out, error = decode(splits(body, size), doc_verified(trailer=False), content_length=66560)
    assert error is None
    assert out == DOC_PAYLOAD


@pytest.mark.parametrize("size", SPLITS)
def test_decodes_the_doc_signed_trailer_body(size):
    verified = doc_verified(trailer=True)
    body, _ = encode_signed(DOC_CHUNKS, verified, {"x-amz-checksum-crc32c": DOC_CRC32C})
    out, error = decode(splits(body, size), verified)
    assert error is None
    assert out == DOC_PAYLOAD


# --- botocore's aws-chunked encoder (STREAMING-UNSIGNED-PAYLOAD-TRAILER) --------------------


@pytest.mark.parametrize("size", SPLITS)
@pytest.mark.parametrize(
    ("checksum_cls", "name"),
    [
        (Crc32Checksum, "x-amz-checksum-crc32"),
        (Sha1Checksum, "x-amz-checksum-sha1"),
        (Sha256Checksum, "x-amz-checksum-sha256"),
    ],
)
def test_decodes_botocore_unsigned_trailer_bodies(size, checksum_cls, name):
    payload = random.Random(1).randbytes(100_000)
    body = botocore_chunked(payload, checksum_cls, name, chunk_size=8192)
    out, error = decode(splits(body, size), unsigned_trailer_verified(len(payload), name))
    assert error is None
    assert out == payload


def test_decodes_a_real_boto3_put_over_https():
    payload = random.Random(2).randbytes(3 * 1024 * 1024 + 5)
    captured = {}

    class Captured(Exception):
        pass

    def before_send(request, **_):
        parts = urlsplit(request.url)
        headers = [
            (n.lower(), v.decode() if isinstance(v, bytes) else str(v))
            for n, v in request.headers.items()
        ]
        # The wire carries one Host; botocore's CRT signer (with awscrt) already sets it.
        if not any(name == "host" for name, _ in headers):
            headers.append(("host", parts.netloc))
        captured["headers"] = headers
        captured["request"] = dict(
            method=request.method, raw_path=parts.path, raw_query=parts.query
        )
        captured["body"] = request.body.read()
        raise Captured

    client = boto3.client(
        "s3",
        endpoint_url="https://s3.example.test",
        region_name="us-east-1",
        aws_access_key_id="AKID",
        aws_secret_access_key="SECRET",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    client.meta.events.register("before-send", before_send)
    with pytest.raises(Captured):
        client.put_object(Bucket="b", Key="k", Body=io.BytesIO(payload))
    verified = verify_request(
        **captured["request"], headers=captured["headers"], secrets={"AKID": "SECRET"}
    )
    assert verified.payload_mode == "streaming-unsigned-trailer"
    out, error = decode(splits(captured["body"], 65536), verified, content_length=len(payload))
    assert error is None
    assert out == payload


def test_empty_payload():
    verified = unsigned_trailer_verified(0)
    out, error = decode([botocore_chunked(b"")], verified, content_length=0)
    assert (out, error) == (b"", None)


# --- tampering: the right error, and the payload's last bytes never leave -------------------


def signed_body() -> tuple[bytes, Verified]:
    verified = doc_verified(trailer=True)
    return encode_signed(DOC_CHUNKS, verified, {"x-amz-checksum-crc32c": DOC_CRC32C})[0], verified


def tampered(body: bytes, old: bytes, new: bytes, *, last: bool = False) -> bytes:
    index = body.rindex(old) if last else body.index(old)
    return body[:index] + new + body[index + len(old) :]


SIGNED_TAMPERING = {
    "flipped data byte": (lambda b: b[:200] + b"b" + b[201:], SignatureDoesNotMatch),
    "flipped last data byte": (
        lambda b: tampered(b, b"a\r\n0;", b"b\r\n0;"),
        SignatureDoesNotMatch,
    ),
    "wrong chunk signature": (
        lambda b: b.replace(b"chunk-signature=2", b"chunk-signature=3", 1),
        SignatureDoesNotMatch,
    ),
    "bad trailer checksum": (
        lambda b: b.replace(DOC_CRC32C.encode(), b"AAAAAA=="),
        SignatureDoesNotMatch,  # the trailer signature covers the checksum
    ),
    "bad trailer signature": (
        lambda b: b.replace(DOC_TRAILER_SIGNATURE.encode(), b"0" * 64),
        SignatureDoesNotMatch,
    ),
    "truncated body": (lambda b: b[: len(b) // 2], IncompleteBody),
    "truncated before trailers": (lambda b: b[: b.index(b"x-amz-checksum-crc32c")], IncompleteBody),
    "missing final blank line": (lambda b: b[:-2], IncompleteBody),
    "chunk longer than declared": (lambda b: b.replace(b"400;", b"3ff;", 1), InvalidRequest),
    "bad chunk size": (lambda b: b.replace(b"400;", b"4g0;", 1), InvalidRequest),
    "no chunk signature": (lambda b: tampered(b, b"400;chunk-signature=", b"400;"), InvalidRequest),
    "LF without CR": (lambda b: b.replace(b"\r\n", b"\n", 1), InvalidRequest),
    "data after the end": (lambda b: b + b"0\r\n\r\n", InvalidRequest),
}


@pytest.mark.parametrize("case", sorted(SIGNED_TAMPERING))
@pytest.mark.parametrize("size", [1, 7, None])
def test_signed_tampering_is_caught_before_the_last_byte(case, size):
    body, verified = signed_body()
    tamper, error = SIGNED_TAMPERING[case]
    out, raised = decode(splits(tamper(body), size), verified, content_length=len(DOC_PAYLOAD))
    assert isinstance(raised, error), raised
    # Unverified bytes may have gone out, but never all of them: the backend sees a short body.
    assert len(out) < len(DOC_PAYLOAD)


UNSIGNED_PAYLOAD = bytes(range(256)) * 300
UNSIGNED_CRC32 = base64.b64encode(zlib.crc32(UNSIGNED_PAYLOAD).to_bytes(4, "big"))
WRONG_CRC32 = base64.b64encode((zlib.crc32(UNSIGNED_PAYLOAD) ^ 1).to_bytes(4, "big"))


def unsigned_body(**kwargs: object) -> bytes:
    return botocore_chunked(UNSIGNED_PAYLOAD, chunk_size=10_000, **kwargs)


UNSIGNED_TAMPERING = {
    "flipped data byte": (lambda b: b[:300] + bytes([b[300] ^ 1]) + b[301:], BadDigest),
    "bad trailer checksum": (lambda b: b.replace(UNSIGNED_CRC32, WRONG_CRC32), BadDigest),
    "trailer not base64": (lambda b: b.replace(b"crc32:", b"crc32:*", 1), InvalidArgument),
    "trailer missing": (lambda b: b[: b.index(b"x-amz-checksum")] + b"\r\n", IncompleteBody),
    "undeclared trailer": (lambda b: b[:-2] + b"x-amz-meta-x:1\r\n\r\n", InvalidRequest),
    "truncated body": (lambda b: b[:-100], IncompleteBody),
    "short chunk": (lambda b: b.replace(b"2710\r\n", b"2711\r\n", 1), InvalidRequest),
}


@pytest.mark.parametrize("case", sorted(UNSIGNED_TAMPERING))
@pytest.mark.parametrize("size", [1, 7, None])
def test_unsigned_trailer_tampering_is_caught_before_the_last_byte(case, size):
    tamper, error = UNSIGNED_TAMPERING[case]
    verified = unsigned_trailer_verified(len(UNSIGNED_PAYLOAD))
    out, raised = decode(splits(tamper(unsigned_body()), size), verified)
    assert isinstance(raised, error), raised
    assert len(out) < len(UNSIGNED_PAYLOAD)


def test_decoded_length_must_match():
    body = unsigned_body()
    out, error = decode([body], unsigned_trailer_verified(len(UNSIGNED_PAYLOAD) + 1))
    assert isinstance(error, IncompleteBody)
    assert len(out) < len(UNSIGNED_PAYLOAD)
    out, error = decode(splits(body, 4096), unsigned_trailer_verified(len(UNSIGNED_PAYLOAD) - 1))
    assert isinstance(error, InvalidRequest)
    assert len(out) < len(UNSIGNED_PAYLOAD) - 1


def test_content_length_disagreeing_with_decoded_length_is_refused():
    verified = unsigned_trailer_verified(len(UNSIGNED_PAYLOAD))
    _, error = decode([unsigned_body()], verified, content_length=len(UNSIGNED_PAYLOAD) + 1)
    assert isinstance(error, InvalidRequest)


def test_trailers_only_in_trailer_modes():
    verified = doc_verified(trailer=False)
    body, _ = encode_signed(DOC_CHUNKS, verified)
    body = body[:-2] + b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    out, error = decode([body], verified)
    assert isinstance(error, InvalidRequest)
    assert out == b""


# --- plain bodies ---------------------------------------------------------------------------

PAYLOAD = b"the quick brown fox jumps over the lazy dog\n" * 1000


@pytest.mark.parametrize("mode", ["unsigned", "sha256"])
@pytest.mark.parametrize("size", [1, 4096, None])
def test_plain_bodies_pass_through(mode, size):
    out, error = decode(
        splits(PAYLOAD, size), plain_verified(mode, PAYLOAD), content_length=len(PAYLOAD)
    )
    assert error is None
    assert out == PAYLOAD


def test_sha256_mismatch_withholds_the_last_piece():
    verified = plain_verified("sha256", PAYLOAD)
    out, error = decode(splits(PAYLOAD[:-1] + b"?", 1000), verified, content_length=len(PAYLOAD))
    assert isinstance(error, XAmzContentSHA256Mismatch)
    assert out == PAYLOAD[:-1000]


@pytest.mark.parametrize("delta", [-1, 1])
def test_plain_body_length_must_match_content_length(delta):
    out, error = decode(splits(PAYLOAD, 1000), None, content_length=len(PAYLOAD) + delta)
    assert isinstance(error, IncompleteBody if delta > 0 else InvalidRequest)
    assert len(out) < len(PAYLOAD) + min(delta, 0)


def checksum_headers(payload: bytes) -> dict[str, str]:
    crc32 = zlib.crc32(payload).to_bytes(4, "big")
    return {
        "content-md5": base64.b64encode(hashlib.md5(payload).digest()).decode(),
        "x-amz-checksum-crc32": base64.b64encode(crc32).decode(),
        "x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(payload).digest()).decode(),
        "x-amz-checksum-type": "FULL_OBJECT",
        "x-amz-sdk-checksum-algorithm": "CRC32",
    }


@pytest.mark.parametrize("header", ["content-md5", "x-amz-checksum-crc32", "x-amz-checksum-sha256"])
def test_checksum_headers_are_verified(header):
    headers = checksum_headers(PAYLOAD)
    out, error = decode([PAYLOAD], plain_verified("unsigned", PAYLOAD), headers=headers)
    assert (out, error) == (PAYLOAD, None)
    headers[header] = checksum_headers(b"other")[header]
    out, error = decode(splits(PAYLOAD, 100), plain_verified("unsigned", PAYLOAD), headers=headers)
    assert isinstance(error, BadDigest)
    assert len(out) < len(PAYLOAD)


def test_header_checksums_can_be_left_alone():
    headers = {"x-amz-checksum-crc32": "AAAAAA=="}
    _, error = decode([PAYLOAD], None, headers=headers)
    assert isinstance(error, BadDigest)
    out, error = decode([PAYLOAD], None, headers=headers, check_header_checksums=False)
    assert (out, error) == (PAYLOAD, None)


@pytest.mark.parametrize(
    ("header", "error"),
    [
        # As the store answers: Content-MD5 that is not base64 is InvalidDigest, a checksum
        # header that is not base64 (or not the digest's length) is just a wrong one.
        ("content-md5", InvalidDigest),
        ("x-amz-checksum-sha256", BadDigest),
        ("x-amz-checksum-crc64nvme", BadDigest),
    ],
)
@pytest.mark.parametrize("value", ["bad", "not base64!"])
def test_malformed_checksum_header(header, error, value):
    out, raised = decode([PAYLOAD], None, headers={header: value})
    assert type(raised) is error
    assert out == b""
    _, raised = decode([PAYLOAD], None, headers={header: "AAAA"})  # base64, too short
    assert type(raised) is BadDigest


# --- streaming and memory -------------------------------------------------------------------


def test_large_chunks_stream_incrementally():
    """An 8 MiB chunk fed in 64 KiB reads comes out as it arrives, one read held back."""
    payload = random.Random(3).randbytes(8 * 1024 * 1024)
    body = botocore_chunked(payload, chunk_size=len(payload))
    reads = splits(body, 65536)
    consumed = 0
    yielded_at = []

    async def source() -> AsyncIterator[bytes]:
        nonlocal consumed
        for read in reads:
            consumed += 1
            yield read

    async def main() -> bytes:
        out = bytearray()
        async for piece in decode_body(
            source(), unsigned_trailer_verified(len(payload)), content_length=None, headers={}
        ):
            assert len(piece) <= 65536
            yielded_at.append(consumed)
            out += piece
        return bytes(out)

    assert asyncio.run(main()) == payload
    assert yielded_at[0] <= 2
    assert all(at - index <= 3 for index, at in enumerate(yielded_at))


# --- CRC fallbacks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        (_chunked._LaneCrc(0x82F63B78, 32), 0xE3069283),
        (_chunked._LaneCrc(0x9A6C9329AC4BC9B5, 64), 0xAE8B14860A799888),
        (_chunked._LaneCrc(0xEDB88320, 32), zlib.crc32(b"123456789")),
        (_chunked._crc32c, 0xE3069283),
        (_chunked._crc64nvme, 0xAE8B14860A799888),
    ],
)
def test_crc_check_values(function, expected):
    assert function(b"123456789", 0) == expected
    assert function(b"6789", function(b"12345", 0)) == expected


def test_crc32c_of_the_doc_payload():
    digest = _chunked._crc32c(DOC_PAYLOAD, 0).to_bytes(4, "big")
    assert base64.b64encode(digest).decode() == DOC_CRC32C


def test_crc64nvme_trailer():
    payload = b"hello crc64"
    value = _chunked._crc64nvme(payload, 0).to_bytes(8, "big")
    name = "x-amz-checksum-crc64nvme"
    body = f"{len(payload):x}\r\n".encode() + payload + b"\r\n0\r\n"
    body += f"{name}:{base64.b64encode(value).decode()}\r\n\r\n".encode()
    out, error = decode(splits(body, 3), unsigned_trailer_verified(len(payload), name))
    assert (out, error) == (payload, None)


@pytest.mark.parametrize("length", [0, 1, 511, 512, 513, 64 * 9 + 3, 100_003])
def test_lane_crc_matches_zlib(length):
    data = random.Random(length).randbytes(length)
    crc32 = _chunked._LaneCrc(0xEDB88320, 32)
    assert crc32(data, 0) == zlib.crc32(data)
    assert crc32(data[length // 3 :], crc32(data[: length // 3], 0)) == zlib.crc32(data)
