"""Issue 42 #4: the gateway closes a connection whose request headers do not arrive in time, and bounds the
connections one client address holds; a real gateway process (no Triton behind it: /health answers 503)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from hf2triton import host
from hf2triton.gateway.connections import HEADER_TIMEOUT_ENV, MAX_PER_CLIENT_ENV
from hf2triton.triton import client
from tests.helpers import ROOT

HEADER_TIMEOUT_S = 2
MAX_PER_CLIENT = 5
PARTIAL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


@pytest.fixture(scope="module")
def gateway():
    port = host.free_ports(1)[0]
    env = {**os.environ, "PYTHONPATH": str(ROOT), HEADER_TIMEOUT_ENV: str(HEADER_TIMEOUT_S), MAX_PER_CLIENT_ENV: str(MAX_PER_CLIENT)}
    command = [sys.executable, "-m", "hf2triton.gateway", "--grpc", "127.0.0.1:1", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while client.http_get(f"http://127.0.0.1:{port}/health")[0] == 0:
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read().decode()[-2000:]
        time.sleep(0.2)
    yield port
    process.terminate()
    process.wait(10)


def partial(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(PARTIAL)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the gateway closed `sock` (None if still open after `seconds`)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        data = sock.recv(65536)
    except socket.timeout:
        return None
    except ConnectionResetError:
        data = b""
    return time.monotonic() - started if data == b"" else None


def test_a_connection_without_complete_headers_is_closed_after_the_deadline(gateway):
    sock = partial(gateway)
    took = closed_within(sock, HEADER_TIMEOUT_S + 10)
    assert took is not None and took >= HEADER_TIMEOUT_S - 0.5, took
    assert client.http_get(f"http://127.0.0.1:{gateway}/health")[0] == 503, "complete requests are answered"


def test_one_address_holds_at_most_its_bound_and_others_get_in_once_they_time_out(gateway):
    held = [partial(gateway) for _ in range(MAX_PER_CLIENT)]
    time.sleep(0.3)
    extra = socket.create_connection(("127.0.0.1", gateway), timeout=5)
    assert closed_within(extra, 2) is not None, "a connection beyond the bound is closed as it opens"
    assert all(closed_within(sock, HEADER_TIMEOUT_S + 10) is not None for sock in held), "the slow ones time out"
    assert client.http_get(f"http://127.0.0.1:{gateway}/health")[0] == 503, "and the address gets in again"
