"""An unsigned pushdown runs only where the store lets the same unsigned GET through."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

import httpx
import pytest
from PIL import Image
from skimage import data as samples

_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": "*",
            "Action": ["s3:GetObject"],
            "Resource": ["arn:aws:s3:::{bucket}/public/*"],
        }
    ],
}


@pytest.fixture
def images(backend_s3, bucket) -> str:
    buf = io.BytesIO()
    Image.fromarray(samples.chelsea()).save(buf, "JPEG", quality=90)
    for prefix in ("public", "private"):
        backend_s3.put_object(Bucket=bucket, Key=f"{prefix}/cat.jpg", Body=buf.getvalue())
    backend_s3.put_bucket_policy(
        Bucket=bucket, Policy=json.dumps(_POLICY).replace("{bucket}", bucket)
    )
    return bucket


def _code(reply: httpx.Response) -> str:
    return ET.fromstring(reply.content).findtext("Code") or "" if reply.content else ""


@pytest.mark.parametrize(("prefix", "status"), [("public", 200), ("private", 403)])
def test_unsigned_pushdown_follows_the_stores_answer(
    gateway, store, registered, images, prefix, status
):
    direct = httpx.get(f"{store.endpoint_url}/{images}/{prefix}/cat.jpg")
    features = httpx.get(
        f"{gateway.endpoint_url}/{images}/{prefix}/cat.jpg",
        params={"hapi-model": "r18", "hapi-split": "2", "hapi-format": "json"},
        timeout=120,
    )
    assert direct.status_code == features.status_code == status
    if status == 200:
        assert features.json()["shape"][0] == 1
    else:
        assert _code(features) == _code(direct) == "AccessDenied"


def test_unsigned_batch_gets_features_only_for_readable_keys(gateway, registered, images):
    body = json.dumps(
        {
            "keys": ["public/cat.jpg", "private/cat.jpg"],
            "model": "r18",
            "split": 2,
            "format": "json",
        }
    )
    reply = httpx.post(
        f"{gateway.endpoint_url}/{images}?hapi-batch",
        content=body,
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    summary = reply.json()
    assert summary["shape"][0] == 1
    assert "AccessDenied" in json.dumps(summary)
