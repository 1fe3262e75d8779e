"""Operations and failure modes: health, metrics, unreachable or misbehaving backends."""

from __future__ import annotations

import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import boto3
import httpx
import pytest
from botocore.config import Config

from tests.support import control_get, cut_short_server, free_port, gateway_process


def test_health_reports_backend(gateway):
    reply = httpx.get(gateway.endpoint_url + "/_hapi/health")
    assert reply.status_code == 200
    assert reply.json() == {"status": "ok"}  # up or down, no details


def test_liveness_does_not_need_the_store(gateway):
    assert httpx.get(gateway.endpoint_url + "/_hapi/live").json() == {"status": "alive"}


def test_metrics_count_operations_and_bytes(gateway, s3, bucket):
    s3.put_object(Bucket=bucket, Key="m", Body=b"m" * 1234)
    s3.get_object(Bucket=bucket, Key="m")["Body"].read()
    text = control_get(gateway, "/metrics").text
    assert 'hapi_requests_total{operation="PutObject",status="200"}' in text
    assert 'hapi_requests_total{operation="GetObject",status="200"}' in text
    assert "hapi_request_duration_seconds_bucket" in text
    assert "hapi_requests_in_flight 1.0" in text  # this very request
    assert "hapi_batcher_queued_samples 0.0" in text
    sent = [
        line
        for line in text.splitlines()
        if line.startswith('hapi_sent_bytes_total{operation="GetObject"}')
    ]
    assert sent and float(sent[0].split()[-1]) >= 1234


def test_access_log_line(gateway, s3, bucket):
    reply = s3.put_object(Bucket=bucket, Key="logged", Body=b"abc")
    request_id = reply["ResponseMetadata"]["HTTPHeaders"]["x-hapi-request-id"]
    deadline = time.monotonic() + 5  # the line is written once the response has gone out
    while not (lines := [line for line in gateway.log().splitlines() if request_id in line]):
        assert time.monotonic() < deadline, f"no access-log line for {request_id}"
        time.sleep(0.05)
    assert (
        lines and "PutObject" in lines[0] and "status=200" in lines[0] and "received=3" in lines[0]
    )


def test_a_burst_of_new_connections_is_served_on_each(gateway, s3, bucket):
    """Clients that open their connections at once (a training job starting) send their
    requests before the gateway has accepted them; every one is accepted and answered."""
    s3.put_object(Bucket=bucket, Key="burst", Body=b"b" * 4096)
    url = httpx.URL(
        s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "burst"})
    )
    request = f"GET {url.raw_path.decode()} HTTP/1.1\r\nHost: {url.netloc.decode()}\r\n\r\n"
    clients = [socket.create_connection((url.host, url.port), timeout=30) for _ in range(100)]
    try:
        for client in clients:  # the kernel completed each handshake: all sent at once
            client.sendall(request.encode())
        heads = [_read_response(client) for client in clients]
    finally:
        for client in clients:
            client.close()
    assert [head for head, _ in heads] == [b"HTTP/1.1 200 OK"] * 100
    assert all(body == b"b" * 4096 for _, body in heads)


def _read_response(client: socket.socket) -> tuple[bytes, bytes]:
    """The status line and body of one response with a content-length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += client.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(
        int(v)
        for k, _, v in (line.partition(b":") for line in lines[1:])
        if k.lower() == b"content-length"
    )
    while len(body) < length:
        body += client.recv(65536)
    return lines[0], body


def _client(gw) -> boto3.client:
    return boto3.client(
        "s3",
        endpoint_url=gw.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=gw.access_key_id,
        aws_secret_access_key=gw.secret_access_key,
        config=Config(signature_version="s3v4", retries={"max_attempts": 1}),
    )


def test_unreachable_backend_is_503_with_retry_after(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    with gateway_process(
        backend_url=dead, backend_key="k", backend_secret="s", log_dir=tmp_path
    ) as gw:
        url = _client(gw).generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": "k"})
        reply = httpx.get(url)
        assert reply.status_code == 503
        assert reply.headers["retry-after"] == "1"
        assert ET.fromstring(reply.content).findtext("Code") == "ServiceUnavailable"
        metrics = control_get(gw, "/metrics").text
        assert 'hapi_upstream_errors_total{kind="unreachable"} 1.0' in metrics
        health = httpx.get(gw.endpoint_url + "/_hapi/health")
        assert health.status_code == 503 and health.json() == {"status": "degraded"}


@pytest.fixture
def truncating_backend() -> Iterator[str]:
    """A backend that promises 1 MiB and closes the connection after 1000 bytes."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n"
    with cut_short_server(head + b"z" * 1000) as url:
        yield url


def test_truncated_upstream_body_is_not_a_complete_response(tmp_path, truncating_backend):
    with gateway_process(
        backend_url=truncating_backend, backend_key="k", backend_secret="s", log_dir=tmp_path
    ) as gw:
        url = _client(gw).generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": "k"})
        with pytest.raises(httpx.RemoteProtocolError), httpx.stream("GET", url) as reply:
            assert reply.headers["content-length"] == "1048576"
            reply.read()
