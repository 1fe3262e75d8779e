"""Helpers for tests that run the real gateway as a process, and sign requests to it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from hapi.store import free_port

if TYPE_CHECKING:
    import numpy as np

    from hapi.protocol import Credentials
    from hapi.store import EmbeddedStore

HAPI = str(Path(sys.executable).parent / "hapi")


@dataclass
class RunningGateway:
    endpoint_url: str
    access_key_id: str
    secret_access_key: str
    backend_access_key_id: str
    backend_secret_access_key: str
    process: subprocess.Popen[bytes]
    log_path: Path
    admin_access_key_id: str = ""
    admin_secret_access_key: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_bytes(self) -> int:
        return _status_kb(self.pid, "VmRSS") * 1024

    def peak_rss_bytes(self) -> int:
        return _status_kb(self.pid, "VmHWM") * 1024

    def reset_peak_rss(self) -> None:
        # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def cpu_ticks(pid: int) -> int:
    """User + system CPU of ``pid`` so far, in clock ticks (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def kill_the_busy_one(pids: Iterable[int], work: Any, *, ticks: int, polls: int) -> int:
    """SIGKILL the first of ``pids`` to spend more than ``ticks`` of CPU while ``work`` (a
    started thread) runs; returns its pid. Fails when none did before ``work`` ended."""
    start = {pid: cpu_ticks(pid) for pid in pids}
    for _ in range(polls):
        busy = next((p for p, t in start.items() if cpu_ticks(p) > t + ticks), None)
        if busy is not None:
            os.kill(busy, signal.SIGKILL)
            return busy
        if not work.is_alive():
            break
        time.sleep(0.005)
    raise AssertionError("no process started on the work")


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def store_gateway(
    store: EmbeddedStore, log_dir: Path, **kwargs: Any
) -> contextlib.AbstractContextManager[RunningGateway]:
    """:func:`gateway_process` in front of ``store``, with the store's own identity as the
    gateway's backend identity; ``kwargs`` as :func:`gateway_process` takes them."""
    return gateway_process(
        backend_url=store.endpoint_url,
        backend_key=store.credentials.access_key_id,
        backend_secret=store.credentials.secret_access_key,
        log_dir=log_dir,
        **kwargs,
    )


@contextlib.contextmanager
def gateway_process(
    *,
    backend_url: str,
    backend_key: str,
    backend_secret: str,
    log_dir: Path,
    extra_args: tuple[str, ...] = (),
    start_timeout: float = 90.0,  # three starting at once on a loaded 2-core machine
    prefix: tuple[str, ...] = (),
    keys: Mapping[str, Mapping[str, Any]] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[RunningGateway]:
    """Run ``hapi serve`` on a free loopback port (behind ``prefix``, e.g. ``taskset -c
    1``); stop it afterwards, whatever happens. ``keys`` are more client keys, the
    credentials file's ``{"keys": ...}`` (roles, upstream identities); ``env``, more
    variables (settings such as ``HAPI_MAX_CONNECTIONS``)."""
    port = free_port()
    if keys is not None:
        credentials_file = log_dir / f"credentials-{port}.json"
        credentials_file.write_text(json.dumps({"keys": keys}))
        extra_args = (*extra_args, "--credentials-file", str(credentials_file))
    key, secret = "GWTEST" + os.urandom(5).hex().upper(), os.urandom(20).hex()
    admin, admin_secret = "GWADMIN" + os.urandom(5).hex().upper(), os.urandom(20).hex()
    env = {
        **os.environ,
        **(env or {}),
        "HAPI_BACKEND_URL": backend_url,
        "HAPI_BACKEND_ACCESS_KEY_ID": backend_key,
        "HAPI_BACKEND_SECRET_ACCESS_KEY": backend_secret,
        "HAPI_ACCESS_KEY_ID": key,
        "HAPI_SECRET_ACCESS_KEY": secret,
        "HAPI_ADMIN_ACCESS_KEY_ID": admin,
        "HAPI_ADMIN_SECRET_ACCESS_KEY": admin_secret,
    }
    log_path = log_dir / f"gateway-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*prefix, HAPI, "-v", "serve", "--port", str(port), *extra_args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    gw = RunningGateway(
        f"http://127.0.0.1:{port}",
        key,
        secret,
        backend_key,
        backend_secret,
        proc,
        log_path,
        admin,
        admin_secret,
    )
    try:
        _wait_listening(gw, start_timeout)
        yield gw
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_listening(gw: RunningGateway, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gw.process.poll() is not None:
            raise RuntimeError(f"gateway exited with {gw.process.returncode}:\n{gw.log()}")
        try:
            httpx.get(gw.endpoint_url + "/_hapi/health", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"gateway did not start within {timeout}s:\n{gw.log()}")


def wait_for(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` every 0.1 s until it is true; fail naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def control_get(gw: RunningGateway, path: str, **options: object) -> httpx.Response:
    """GET a control-plane path (``/_hapi/...``, ``/metrics``) signed with the gateway's
    test credential, the way boto3 signs (botocore's S3 SigV4 signer)."""
    from botocore.credentials import Credentials as BotoCredentials

    from hapi.sdk import GatewayAuth

    auth = GatewayAuth(BotoCredentials(gw.access_key_id, gw.secret_access_key))
    return httpx.get(gw.endpoint_url + path, auth=auth, **options)  # type: ignore[arg-type]


def credentials(gw: RunningGateway) -> Credentials:
    """The gateway's test client credential."""
    from hapi.protocol import Credentials

    return Credentials(gw.access_key_id, gw.secret_access_key)


def signed_headers(
    gw: RunningGateway,
    method: str,
    path: str,
    *,
    payload: str = "UNSIGNED-PAYLOAD",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    region: str = "us-east-1",
) -> dict[str, str]:
    """SigV4 headers for ``method path`` (path and query, after the gateway's endpoint)
    with the gateway's test client credential. The payload is signed as ``payload``, or
    as the SHA-256 of ``body`` when one is given."""
    from hapi.gateway import sign_request

    return sign_request(
        method=method,
        url=gw.endpoint_url + path,
        headers=dict(headers or {}),
        credentials=credentials(gw),
        region=region,
        payload_sha256=payload if body is None else hashlib.sha256(body).hexdigest(),
    )


def encode_image(array: np.ndarray, fmt: str) -> bytes:
    """``array`` (HWC uint8) as an image file in ``fmt`` (JPEG at quality 90)."""
    from PIL import Image

    buf = io.BytesIO()
    if fmt == "JPEG":
        Image.fromarray(array).save(buf, fmt, quality=90)
    else:
        Image.fromarray(array).save(buf, fmt)
    return buf.getvalue()


def empty_bucket(client: Any, bucket: str) -> None:
    """Delete every object and abort every multipart upload in ``bucket``."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    for upload in uploads:
        client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])


def store_env(store: Any) -> dict[str, str | None]:
    """The environment that points an AWS client (boto3, the CLI) at ``store``, its
    credentials and us-east-1; ``None`` removes a variable that would redirect it."""
    return {
        "AWS_ENDPOINT_URL": store.endpoint_url,
        "AWS_ENDPOINT_URL_S3": None,
        "AWS_ACCESS_KEY_ID": store.credentials.access_key_id,
        "AWS_SECRET_ACCESS_KEY": store.credentials.secret_access_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_PROFILE": None,
    }


def read_until(
    proc: subprocess.Popen[str],
    marker: str,
    *,
    timeout: float,
    kill: Callable[[], None] | None = None,
) -> str:
    """``proc``'s output up to and including the line with ``marker`` (``hapi up``'s
    ``Ctrl-C stops`` ends its banner); when the output ends or ``timeout`` passes first,
    ``proc`` is killed (``kill``, else ``proc.kill()``) and the test fails with what it said."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return "".join(lines)
    (kill or proc.kill)()
    pytest.fail(f"no {marker!r} in the output of {proc.args!r}:\n" + "".join(lines))


def cache_writes_settled(gateway: RunningGateway) -> None:
    """Wait until the gateway has no feature-cache write queued or running (it writes
    once no pushdown request has been served for a moment), so a listing of the cache
    bucket holds every entry requested so far, earlier tests' included."""
    url = f"{gateway.endpoint_url}/metrics"

    def idle() -> bool:
        headers = signed_headers(gateway, "GET", "/metrics", body=b"")
        text = httpx.get(url, headers=headers, timeout=30).text
        found = re.search(r"^hapi_cache_writes_pending (\S+)$", text, re.M)
        assert found, "the gateway exposes no pending-writes gauge"
        return float(found.group(1)) == 0

    wait_for(idle, "the cache writes to finish")


@contextlib.contextmanager
def cut_short_server(answer: bytes) -> Iterator[str]:
    """A server on loopback that reads each request, sends ``answer`` (a head promising
    more body than follows) and closes: a peer that dies mid-body. Yields its URL."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
