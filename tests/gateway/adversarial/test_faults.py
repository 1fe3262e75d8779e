"""The store dies mid-transfer: the client sees it, nothing partial lands, service resumes.

A store of its own (not the session's), killed with SIGKILL and started again on the
same port and data directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config

from hapi.store import EmbeddedStore, StoreSettings, free_port, load_or_create_credentials
from tests.gateway.adversarial._support import connection, encode_request, read_reply
from tests.support import RunningGateway, gateway_process, signed_headers

MiB = 1024 * 1024
BUCKET = "fragile"


@pytest.fixture(scope="module")
def fragile(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[EmbeddedStore, RunningGateway, Any]]:
    root = tmp_path_factory.mktemp("fragile-store")
    creds = load_or_create_credentials(root / "state", None, None)
    settings = StoreSettings(
        data_dir=root / "data",
        port=free_port(),
        access_key_id=creds.access_key_id,
        secret_access_key=creds.secret_access_key,
    )
    with EmbeddedStore(settings) as store:
        direct = boto3.client(
            "s3",
            endpoint_url=store.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=creds.access_key_id,
            aws_secret_access_key=creds.secret_access_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )
        direct.create_bucket(Bucket=BUCKET)
        with gateway_process(
            backend_url=store.endpoint_url,
            backend_key=creds.access_key_id,
            backend_secret=creds.secret_access_key,
            log_dir=tmp_path_factory.mktemp("fragile-gateway"),
        ) as gateway:
            yield store, gateway, direct


def _kill(store: EmbeddedStore) -> None:
    assert store.pid is not None
    os.killpg(store.pid, signal.SIGKILL)


def _revive(store: EmbeddedStore) -> None:
    store.stop()  # reaps the killed process
    store.start()


def _get(gateway: RunningGateway, key: str) -> httpx.Response:
    path = f"/{BUCKET}/{key}"
    return httpx.get(gateway.endpoint_url + path, headers=signed_headers(gateway, "GET", path))


def _recovers(gateway: RunningGateway, key: str, body: bytes) -> None:
    """The first requests after a restart may meet pooled connections to the dead store."""
    for _ in range(5):
        reply = _get(gateway, key)
        if reply.status_code == 200:
            assert reply.content == body
            return
        assert reply.status_code == 503, reply.text
        time.sleep(0.5)
    raise AssertionError("the gateway did not recover once the store was back")


def _held(direct: Any, key: str) -> bytes | None:
    try:
        return direct.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except direct.exceptions.NoSuchKey:
        return None


def _stream_until_killed(gateway: RunningGateway, store: EmbeddedStore, path: str) -> int:
    """Read ``path``, killing the store after the first MiB; the bytes received."""
    received = 0
    headers = signed_headers(gateway, "GET", path)
    with httpx.stream("GET", gateway.endpoint_url + path, headers=headers) as reply:
        assert reply.status_code == 200
        for chunk in reply.iter_raw(256 * 1024):
            if received < MiB <= received + len(chunk):
                _kill(store)
            received += len(chunk)
    return received


def test_store_killed_mid_get_truncates_visibly(fragile):
    store, gateway, direct = fragile
    body = os.urandom(64 * MiB)
    direct.put_object(Bucket=BUCKET, Key="big", Body=body)
    with pytest.raises(httpx.RemoteProtocolError):  # never a clean, short body
        _stream_until_killed(gateway, store, f"/{BUCKET}/big")
    _revive(store)
    _recovers(gateway, "big", body)


@pytest.mark.parametrize("existing", [True, False], ids=["overwrite", "new-key"])
def test_store_killed_mid_put_leaves_no_object(fragile, existing):
    store, gateway, direct = fragile
    key = f"half-{existing}"
    original = b"original bytes"
    if existing:
        direct.put_object(Bucket=BUCKET, Key=key, Body=original)
    path = f"/{BUCKET}/{key}"
    size = 32 * MiB
    headers = signed_headers(gateway, "PUT", path, headers={"content-length": str(size)})
    status = None
    with connection(gateway) as sock:
        sock.sendall(encode_request("PUT", path, headers) + os.urandom(4 * MiB))
        _kill(store)
        with contextlib.suppress(OSError):
            for _ in range(28):
                sock.sendall(os.urandom(MiB))
        with contextlib.suppress(OSError, ConnectionError):
            status = read_reply(sock).status
    assert status in (None, 503)
    _revive(store)
    assert _held(direct, key) == (original if existing else None)
    if existing:
        _recovers(gateway, key, original)
