"""`hapi serve` says where it listens and with what, and a busy port is one line and exit 2."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

from tests.support import HAPI, free_port, store_gateway


def _env(backend: str) -> dict[str, str]:
    return {
        **os.environ,
        "HAPI_BACKEND_URL": backend,
        "HAPI_BACKEND_ACCESS_KEY_ID": "BACKENDKEY",
        "HAPI_BACKEND_SECRET_ACCESS_KEY": "backend-secret",
        "HAPI_ACCESS_KEY_ID": "CLIENTKEY",
        "HAPI_SECRET_ACCESS_KEY": "client-secret",
    }


def test_serve_logs_one_startup_block(store, tmp_path):
    with store_gateway(
        store,
        tmp_path,
        extra_args=("--memory-budget", "1GiB", "--device", "cpu"),
    ) as gw:
        log = gw.log()
        gw.process.send_signal(signal.SIGINT)
        assert gw.process.wait(30) == 0  # a clean stop, no "Aborted!"
    lines = log.splitlines()
    assert lines[0] == f"hapi gateway listening on {gw.endpoint_url}"
    assert f"backend:         {store.endpoint_url} (answers, HTTP " in log
    assert "registry bucket: hapi-models" in log
    assert "device:          cpu" in log
    assert "decoder:         auto (pil)" in log  # blocks on the CPU: Pillow
    assert "memory budget:   1.0 GiB" in log
    assert "limits:          objects up to 256.0 MiB for pushdown" in log
    # HAPI_ACCESS_KEY_ID acts as the backend identity: said once, with the key it names.
    backend_lines = [line for line in lines if "as backend:" in line]
    assert len(backend_lines) == 1 and gw.access_key_id in backend_lines[0], log
    assert gw.admin_access_key_id not in backend_lines[0]  # an admin is an operator, not named
    assert "Aborted" not in gw.log()


def test_serve_says_when_the_backend_does_not_answer(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    proc = subprocess.Popen(
        [HAPI, "serve", "--port", str(port)],
        env=_env(dead),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = [proc.stdout.readline() for _ in range(2)]
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert lines[0].strip() == f"hapi gateway listening on http://127.0.0.1:{port}"
    assert lines[1].strip().startswith(f"backend:         {dead} (does not answer: ConnectError")
    assert proc.returncode == 0


def test_serve_on_a_busy_port_is_one_line_and_exit_2(store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [HAPI, "serve", "--port", str(port)],
            env=_env(store.endpoint_url),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"Error: port {port} on 127.0.0.1 is already in use (another hapi?); "
        "stop that process or choose another port with --port"
    ]
