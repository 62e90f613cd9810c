"""Probe (issue 42 #6): how long after its client leaves does a served generation stop?

    .venv/bin/python -m pytest -q -s -p tests.conftest benchmarks/probes/cancel_latency.py

Serves the tests' tiny generator with a 4096-token window (one sequence at a time, tests/test_gateway_boundary.py's
fixtures) behind a gateway and, ROUNDS times each, starts a long sampled generation, waits until the model's stub is
busy, leaves, and prints how long after leaving the stub's CPU went idle: the end of the last ~25 ms window (5
samples, 5 ms apart, from /proc) with more than 15 ms of CPU. /proc counts CPU in 10 ms ticks, and a thread that
wakes for microseconds (the response thread's 100 ms poll, the stub's own threads) is now and then charged a whole
tick: a one-tick threshold reads those as "busy" seconds later (1-4 s figures on 2 busy cores, 2026-12-04).
Ways of leaving: a non-streamed and a streamed gateway request whose socket closes, and a direct gRPC stream
cancelled by its client (tritonclient's stop_stream(cancel_requests=True)); and the time from a stream leaving to a
4-token answer that needed its place, next to the same answer on an idle server."""

from __future__ import annotations

import json
import statistics
import time

import pytest

from hf2triton import host
from tests.test_gateway_boundary import LONG, call, chat, gateway, raw_socket, served, streamed, stubs  # noqa: F401 - fixtures

ROUNDS = 5
SAMPLE_S = 0.005


def cpu(pids: list[int]) -> float:
    return sum(host.process_cpu_seconds(pid) or 0.0 for pid in pids)


def wait_busy(pids: list[int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu(pids)
        time.sleep(0.2)
        if cpu(pids) - before > 0.1:
            return
    raise AssertionError("the generation never ran")


def idle_after(pids: list[int], left: float, watch_s: float = 4.0) -> float:
    """Seconds from `left` to the end of the last ~25 ms window in which the stubs used > 15 ms of CPU."""
    samples = []
    while time.monotonic() - left < watch_s:
        samples.append((time.monotonic(), cpu(pids)))
        time.sleep(SAMPLE_S)
    last_busy = left
    for (_, before), (at, after) in zip(samples, samples[4:]):
        if after - before > 0.015:  # two ticks
            last_busy = at
    return last_busy - left


def first_event(sock) -> None:
    got = b""
    while b"data:" not in got:
        got += sock.recv(65536)


def report(name: str, figures: list[float]) -> None:
    print(f"{name}: stub idle {', '.join(f'{f:.3f}' for f in figures)} s after leaving (median {statistics.median(figures):.3f})")


def gateway_rounds(served, gateway, stream: bool) -> list[float]:  # noqa: F811
    pids = stubs(served, "generate")
    figures = []
    for _ in range(ROUNDS):
        if stream:
            sock = streamed(gateway.port, {**chat(0), **LONG})
            first_event(sock)
        else:
            body = json.dumps({**chat(0), **LONG}).encode()
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            sock = raw_socket(gateway.port, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        wait_busy(pids)
        left = time.monotonic()
        sock.close()
        figures.append(idle_after(pids, left))
    return figures


@pytest.mark.parametrize("stream", [False, True])
def test_gateway(served, gateway, stream):  # noqa: F811
    report(f"gateway, stream={stream}", gateway_rounds(served, gateway, stream))


def test_slot_free_after_a_streamed_client_leaves(served, gateway):  # noqa: F811
    pids = stubs(served, "generate")
    idle, after = [], []
    for _ in range(ROUNDS):
        started = time.monotonic()
        assert call(gateway.port, "POST", "/v1/chat/completions", chat(0))[0] == 200
        idle.append(time.monotonic() - started)
        sock = streamed(gateway.port, {**chat(0), **LONG})
        first_event(sock)
        wait_busy(pids)
        left = time.monotonic()
        sock.close()
        assert call(gateway.port, "POST", "/v1/chat/completions", chat(0))[0] == 200
        after.append(time.monotonic() - left)
        time.sleep(0.5)
    print(f"4-token chat, idle server: {', '.join(f'{f:.3f}' for f in idle)} s")
    print(f"4-token chat right after a stream left (from the close): {', '.join(f'{f:.3f}' for f in after)} s")


@pytest.mark.parametrize("stream", [True, False])
def test_grpc_direct(served, stream):  # noqa: F811
    import tritonclient.grpc as grpcclient

    from hf2triton.serving import interface
    from hf2triton.triton import client

    pids = stubs(served, "generate")
    figures = []
    options = {"max_new_tokens": 3000, "temperature": 1.0, "seed": 1, interface.STREAM: stream}
    for _ in range(ROUNDS):
        triton = client.grpc_client(served.settings().url("grpc_port"))
        triton.start_stream(callback=lambda result, error: None)
        triton.async_stream_infer("generate", client.build_inputs(grpcclient, ["A story"], options, one_prompt=True))
        wait_busy(pids)
        left = time.monotonic()
        triton.stop_stream(cancel_requests=True)
        figures.append(idle_after(pids, left))
        triton.close()
    report(f"gRPC direct, stream={stream}", figures)
