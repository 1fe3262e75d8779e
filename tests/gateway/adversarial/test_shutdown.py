"""Ctrl-C stops the gateway in bounded time, whatever its clients are doing.

uvicorn's graceful shutdown waits for every open request; a client that stalls in the
middle of an upload would hold ``hapi serve`` (and ``hapi up``) forever.
"""

from __future__ import annotations

import signal
import time

from tests.gateway.adversarial._support import connection, encode_request
from tests.support import signed_headers, store_gateway


def test_ctrl_c_stops_the_gateway_while_an_upload_stalls(store, tmp_path, backend_s3) -> None:
    backend_s3.create_bucket(Bucket="stall")
    with store_gateway(store, tmp_path) as gateway:
        path = "/stall/slow.bin"
        headers = signed_headers(
            gateway,
            "PUT",
            path,
            headers={
                "content-length": str(1 << 20),
                "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
            },
        )
        with connection(gateway) as sock:
            sock.sendall(encode_request("PUT", path, headers) + b"x" * 1000)  # then nothing
            time.sleep(1.0)  # the request is in flight
            gateway.process.send_signal(signal.SIGINT)
            started = time.monotonic()
            gateway.process.wait(30)
            stopped_s = time.monotonic() - started
    assert stopped_s < 10, f"the gateway took {stopped_s:.1f} s to stop after Ctrl-C"
    assert "slow.bin" not in [
        o["Key"] for o in backend_s3.list_objects_v2(Bucket="stall").get("Contents", [])
    ]
