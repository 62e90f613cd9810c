"""Probe (issue 42 #4): does tritonserver's HTTP port close a connection whose request headers never complete?

    .venv/bin/python -m pytest -q -s -p tests.conftest benchmarks/probes/triton_partial_headers.py

Serves the tests' tiny embedder, opens SOCKETS connections to Triton's HTTP port that each send part of a header,
and prints how many are still open after each WAITS_S mark, and whether a complete request is still answered."""

from __future__ import annotations

import socket
import time

from hf2triton.triton import client
from tests.helpers import make_workflow, tiny_model_entries

SOCKETS = 50
WAITS_S = (5, 30, 65, 125)


def test_partial_headers_on_tritons_http_port(tmp_path_factory, tiny_models):
    entries = tiny_model_entries({"feature-extraction": tiny_models["feature-extraction"]})
    workflow = make_workflow(tmp_path_factory.mktemp("partial"), entries)
    workflow.run("serve")
    try:
        host, port = workflow.settings().url().split(":")
        held = []
        for _ in range(SOCKETS):
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            sock.setblocking(False)
            held.append(sock)
        started = time.monotonic()
        for mark in WAITS_S:
            time.sleep(max(0.0, started + mark - time.monotonic()))
            still_open = 0
            for sock in held:
                try:
                    still_open += sock.recv(1, socket.MSG_PEEK) != b""
                except BlockingIOError:
                    still_open += 1
                except OSError:
                    pass
            ready = client.http_get(f"http://{workflow.settings().url()}/v2/health/ready")[0]
            print(f"after {mark:>4} s: {still_open}/{SOCKETS} partial-header connections open; /v2/health/ready -> {ready}")
    finally:
        workflow.stop()
