"""What the pushdown adversarial tests share: signed requests, tiny images, tar shards."""

from __future__ import annotations

import io
import json
import tarfile
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from PIL import Image

from tests.support import RunningGateway, signed_headers

MIB = 1024 * 1024


def tiny_png(value: int = 0) -> bytes:
    """A 1x1 PNG: a few dozen bytes that decode to a full 224x224 model input."""
    buf = io.BytesIO()
    Image.new("RGB", (1, 1), (value % 256, 7, 9)).save(buf, "PNG")
    return buf.getvalue()


def png_shard(members: int) -> bytes:
    """A WebDataset tar of ``members`` 1x1 PNGs (about 1 KiB per member)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(members):
            payload = tiny_png(i)
            info = tarfile.TarInfo(f"s/{i:06d}.png")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def put_many(backend_s3: Any, bucket: str, objects: dict[str, bytes]) -> None:
    """Upload objects straight to the store, a few at a time."""
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda kv: backend_s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]),
                objects.items(),
            )
        )


def signed_get(
    gateway: RunningGateway, path: str, headers: dict[str, str] | None = None, timeout: float = 300
) -> httpx.Response:
    signed = signed_headers(gateway, "GET", path, headers=headers)
    return httpx.get(gateway.endpoint_url + path, headers=signed, timeout=timeout)


def signed_batch(
    gateway: RunningGateway, bucket: str, body: bytes, query: str = "hapi-batch"
) -> httpx.Response:
    path = f"/{bucket}?{query}"
    headers = signed_headers(gateway, "POST", path, body=body)
    return httpx.post(gateway.endpoint_url + path, content=body, headers=headers, timeout=300)


def batch_body(keys: list[str], **fields: Any) -> bytes:
    return json.dumps({"keys": keys, **fields}).encode()


def stats(gateway: RunningGateway) -> dict[str, Any]:
    reply = signed_get(gateway, "/_hapi/stats", timeout=30)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def error_of(reply: httpx.Response) -> tuple[str, str, str]:
    """(Code, Message, RequestId) of an S3 XML error body."""
    root = ET.fromstring(reply.content)
    return (
        root.findtext("Code") or "",
        root.findtext("Message") or "",
        root.findtext("RequestId") or "",
    )
