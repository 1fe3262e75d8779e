"""Helpers shared by the gateway's tests: the in-process app's seams, aws-chunked encoders."""

from __future__ import annotations

import hashlib
import hmac
import io
from collections.abc import Iterable, Mapping

import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum
from PIL import Image

from hapi import models
from hapi.gateway.edge._sigv4 import Verified
from hapi.gateway.pushdown import _profiles
from hapi.models import Manifest

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

# The in-process app: the client credential it accepts, the address it is reached at.
CLIENT = ("CLIENTKEY", "client-secret")
GATEWAY = "http://gw.test"


class ManualClock:
    """Seconds that move only when a test moves them (``clock.now += 1.0``)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class MemoryRegistry:
    """A registry of manifests held in a dict (no blocks: the runner is a fake)."""

    def __init__(self, *manifests: Manifest) -> None:
        self._manifests = {m.name: m for m in manifests}

    async def get_manifest(self, ref: str) -> Manifest:
        found = self._manifests.get(ref.split("@")[0])
        if found is None or ("@" in ref and ref != found.ref):
            raise models.NoSuchModel(ref)
        return found

    async def list_models(self) -> list[Manifest]:
        return sorted(self._manifests.values(), key=lambda m: m.name)

    async def fetch_blocks(self, manifest: Manifest, start: int, stop: int) -> list[bytes | None]:
        raise AssertionError("the fake runner needs no blocks")


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


OBJECTS = {"/data/cat.png": _png(), "/data/notes.bin": b"not an image at all"}


def memory_store(request: httpx.Request) -> httpx.Response:
    """An ``httpx.MockTransport`` handler standing for the store: it serves ``OBJECTS``."""
    body = OBJECTS.get(request.url.path)
    if body is None:
        return httpx.Response(404, content=b"<Error><Code>NoSuchKey</Code></Error>")
    return httpx.Response(200, stream=httpx.ByteStream(body), headers={"etag": '"e"'})


def client_signed(method: str, url: str, body: bytes | None = None) -> dict[str, str]:
    """Headers of ``method url`` signed with ``CLIENT`` the way boto3 signs (botocore's S3
    SigV4 header signer), the payload unsigned."""
    request = AWSRequest(
        method=method, url=url, data=body, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}
    )
    S3SigV4Auth(BotoCredentials(*CLIENT), "s3", "us-east-1").add_auth(request)
    return dict(request.headers.items())


def encode_signed(
    chunks: Iterable[bytes], verified: Verified, trailers: dict[str, str] | None = None
) -> tuple[bytes, list[str]]:
    """A test-only aws-chunked encoder with chunk (and trailer) signatures, per the AWS docs."""
    previous, body, signatures = verified.signature, bytearray(), []
    for data in [*chunks, b""]:
        previous = _hmac(
            verified,
            f"AWS4-HMAC-SHA256-PAYLOAD\n{verified.amz_date}\n{verified.scope}\n{previous}\n"
            f"{EMPTY_SHA256}\n{hashlib.sha256(data).hexdigest()}",
        )
        signatures.append(previous)
        body += f"{len(data):x};chunk-signature={previous}\r\n".encode() + data
        body += b"\r\n" if data else b""
    if trailers is not None:
        canonical = "".join(f"{name}:{value}\n" for name, value in trailers.items())
        signature = _hmac(
            verified,
            f"AWS4-HMAC-SHA256-TRAILER\n{verified.amz_date}\n{verified.scope}\n{previous}\n"
            f"{hashlib.sha256(canonical.encode()).hexdigest()}",
        )
        signatures.append(signature)
        body += canonical.replace("\n", "\r\n").encode()
        body += f"x-amz-trailer-signature:{signature}\r\n".encode()
    body += b"\r\n"
    return bytes(body), signatures


def _hmac(verified: Verified, string_to_sign: str) -> str:
    return hmac.new(verified.signing_key, string_to_sign.encode(), "sha256").hexdigest()


def botocore_chunked(
    payload: bytes, checksum_cls=Crc32Checksum, name="x-amz-checksum-crc32", chunk_size=None
):
    """``payload`` as botocore's aws-chunked body with an unsigned checksum trailer."""
    wrapper = AwsChunkedWrapper(
        io.BytesIO(payload), checksum_cls=checksum_cls, checksum_name=name, chunk_size=chunk_size
    )
    return wrapper.read()


def fake_probes(monkeypatch: pytest.MonkeyPatch, share: float = 0.5) -> list[float]:
    """Replace the gateway's core-share probe with one that answers ``share`` at once;
    returns the list each call appends its ``seconds`` to."""
    probes: list[float] = []

    def probe(seconds: float) -> float:
        probes.append(seconds)
        return share

    monkeypatch.setattr(_profiles, "probe_share", probe)
    return probes


S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def listing(sizes: Mapping[str, int], prefix: str) -> httpx.Response:
    """One page of a ListObjectsV2 answer: the objects (key: size) under ``prefix``."""
    listed = "".join(
        f"<Contents><Key>{key}</Key><Size>{size}</Size>"
        "<LastModified>2026-12-01T00:00:00Z</LastModified></Contents>"
        for key, size in sizes.items()
        if key.startswith(prefix)
    )
    return httpx.Response(
        200, content=f'<ListBucketResult xmlns="{S3_NS}">{listed}</ListBucketResult>'
    )
