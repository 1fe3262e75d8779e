"""Bodies stream through the gateway: its memory does not grow with object size."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import httpx

MiB = 1024 * 1024
SIZE = 192 * MiB  # far above the bound asserted below, so buffering a body would fail


def _chunks() -> Iterator[bytes]:
    block = hashlib.sha256(b"stream").digest() * (MiB // 32)
    for _ in range(SIZE // MiB):
        yield block


def test_large_put_and_get_stream_with_bounded_memory(gateway, s3, backend_s3, bucket):
    gateway.reset_peak_rss()
    baseline = gateway.rss_bytes()
    put_url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "large"})
    reply = httpx.put(
        put_url, content=_chunks(), headers={"content-length": str(SIZE)}, timeout=120
    )
    assert reply.status_code == 200, reply.text
    assert backend_s3.head_object(Bucket=bucket, Key="large")["ContentLength"] == SIZE

    digest, received = hashlib.sha256(), 0
    get_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "large"})
    with httpx.stream("GET", get_url, timeout=120) as stream:
        for chunk in stream.iter_raw():
            digest.update(chunk)
            received += len(chunk)
    expected = hashlib.sha256()
    for chunk in _chunks():
        expected.update(chunk)
    assert received == SIZE and digest.hexdigest() == expected.hexdigest()
    growth = gateway.peak_rss_bytes() - baseline
    assert growth < 48 * MiB, (
        f"gateway RSS grew by {growth / MiB:.0f} MiB for a {SIZE // MiB} MiB body"
    )
