"""The gateway's boundary on a real tritonserver (tiny models) with the gateway started as `python -m
hf2triton.gateway` (the command `make serve` runs): which requests it answers (Host, Origin, Content-Type), how it
bounds work (inputs per request, body size and time), odd input that must be 4xx, and what it does when
Triton dies under it and comes back."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hf2triton import host
from hf2triton.gateway.process import VALIDATION_REPORT, VALIDATION_REPORT_ENV
from hf2triton.serving.interface import KEEPALIVE_S
from hf2triton.triton import client
from hf2triton.triton.process import ensure_server
from tests.browser import fill, text_of, wait_for
from tests.helpers import ROOT, long_context_copy, make_workflow, tiny_model_entries

pytestmark = pytest.mark.integration

ASK = [{"role": "user", "content": "Tell me a story"}]
ALLOWED_HOST = "models.example.test"
ALLOWED_ORIGIN = "http://app.example.test:8080"
KEY = "boundary-test-key"
LONG = {"max_tokens": 3000, "temperature": 1.0, "seed": 1}  # sampled: runs all its tokens (seconds on the tiny model)


@dataclass
class Gateway:
    port: int
    log: Path
    process: subprocess.Popen

    def log_lines(self, words: str) -> list[str]:
        return [line for line in self.log.read_text(errors="replace").splitlines() if words in line]


@contextlib.contextmanager
def gateway_process(workflow, log: Path, *flags: str, env: dict[str, str] | None = None):
    """`python -m hf2triton.gateway` in front of the workflow's Triton, until it answers /health."""
    port = host.free_ports(1)[0]
    command = [sys.executable, "-m", "hf2triton.gateway", "--grpc", workflow.settings().url("grpc_port"), "--port", str(port)]
    with open(log, "wb") as out:
        process = subprocess.Popen(  # noqa: S603
            [*command, "--models", "embed,generate", *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )
    try:
        deadline = time.monotonic() + 60
        while client.http_get(f"http://127.0.0.1:{port}/health")[0] not in (200, 503):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield Gateway(port, log, process)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    """Our own tritonserver (tests here kill it): the tiny embedder (at most 6 texts a request) and a long-context
    generator that runs one sequence at a time."""
    models = {"feature-extraction": tiny_models["feature-extraction"]}
    models["text-generation"] = long_context_copy(tiny_models["text-generation"], tmp_path_factory.mktemp("long"))
    generation = {"max_new_tokens": 8, "max_sequences": 1, "max_queue": 2, "max_new_tokens_limit": 3000}
    entries = tiny_model_entries(models, embed={"max_texts_per_request": 6}, generate={"generation": generation})
    workflow = make_workflow(tmp_path_factory.mktemp("boundary"), entries)
    workflow.run("serve")
    yield workflow
    workflow.stop()


@pytest.fixture(scope="module")
def gateway(served, tmp_path_factory):
    flags = ["--allowed-hosts", ALLOWED_HOST, "--allowed-origins", ALLOWED_ORIGIN, "--request-timeout-s", "2"]
    report = {VALIDATION_REPORT_ENV: str(served.directory / VALIDATION_REPORT)}  # as `make serve` points its gateway at it
    with gateway_process(served, tmp_path_factory.mktemp("gateway") / "gateway.log", *flags, env=report) as running:
        yield running


def call(port: int, method: str, path: str, body=None, headers: dict[str, str] | None = None, timeout: float = 120):
    """(status, lower-cased headers, JSON answer) of one request; a dict body is sent as JSON."""
    sent = {"Content-Type": "application/json"} if isinstance(body, dict) else {}
    sent.update(headers or {})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body, headers=sent)
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    answer = json.loads(raw) if raw.startswith(b"{") else {"raw": raw}
    return response.status, {k.lower(): v for k, v in response.getheaders()}, answer


def chat(port: int, **extra) -> dict:
    return {"model": "generate", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **extra}


def statistics(workflow) -> dict[str, dict[str, int]]:
    return {name: client.model_statistics(workflow.settings().url(), name) for name in ("embed", "generate")}


def raw_socket(port: int, head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head)
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError, socket.timeout):
        while chunk := sock.recv(65536):
            data += chunk
    return data


# ------------------------------------------------------------------ 1. who may ask: Host, Origin, Content-Type


def test_a_foreign_host_is_refused_421_with_one_log_line(gateway):
    for index, (method, path, body) in enumerate(
        [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", chat(0)), ("GET", "/health", None), ("GET", "/nothing", None)]
    ):
        name = f"rebound-{index}.example"
        status, _, answer = call(gateway.port, method, path, body, {"Host": f"{name}:{gateway.port}"})
        assert status == 421 and answer["error"]["code"] == "host_not_allowed", answer
        assert name in answer["error"]["message"] and "openai.allowed_hosts" in answer["error"]["message"]
        time.sleep(0.1)
        assert len(gateway.log_lines(name)) == 1, gateway.log.read_text()
    names = ["localhost", "LOCALHOST.", "127.0.0.1", "[::1]", "10.1.2.3", socket.gethostname(), ALLOWED_HOST]
    for name in names:
        status, _, answer = call(gateway.port, "GET", "/v1/models", headers={"Host": f"{name}:{gateway.port}"})
        assert status == 200 and {m["id"] for m in answer["data"]} == {"embed", "generate"}, (name, answer)


def test_bodies_that_are_not_json_are_415_and_reach_no_model(served, gateway):
    before = statistics(served)
    attack = json.dumps(chat(0))  # a valid request, sent as a web page can without a CORS preflight
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        for content_type, body in [
            ("text/plain", attack),
            ("application/x-www-form-urlencoded", "model=generate&prompt=hi"),
            ("multipart/form-data; boundary=x", f'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n{attack}\r\n--x--\r\n'),
        ]:
            status, _, answer = call(gateway.port, "POST", path, body, {"Content-Type": content_type})
            assert status == 415 and answer["error"]["code"] == "unsupported_media_type", (path, content_type, answer)
    assert statistics(served) == before, "nothing reached Triton"
    status, _, answer = call(gateway.port, "POST", "/v1/chat/completions", attack, {"Content-Type": "application/json; charset=utf-8"})
    assert status == 200 and answer["choices"][0]["message"]["content"] is not None


def test_foreign_origins_are_refused_and_allowed_ones_get_cors(served, gateway):
    port = gateway.port
    before = statistics(served)
    for origin in ("http://evil.example", "null", f"http://localhost:{port + 1}"):
        status, headers, answer = call(port, "POST", "/v1/chat/completions", chat(0), {"Origin": origin})
        assert status == 403 and answer["error"]["code"] == "origin_not_allowed", answer
        assert not [h for h in headers if h.startswith("access-control-")], headers
        preflight = {"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        status, headers, _ = call(port, "OPTIONS", "/v1/chat/completions", headers=preflight)
        assert status == 403 and "access-control-allow-origin" not in headers
    assert statistics(served) == before
    status, headers, answer = call(port, "POST", "/v1/chat/completions", chat(0), {"Origin": ALLOWED_ORIGIN})
    assert status == 200 and answer["choices"], answer
    assert headers["access-control-allow-origin"] == ALLOWED_ORIGIN and headers["vary"] == "Origin"
    preflight = {"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    status, headers, _ = call(port, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 204 and headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert {"authorization", "content-type"} <= {h.strip().lower() for h in headers["access-control-allow-headers"].split(",")}
    status, headers, _ = call(port, "GET", "/v1/models", headers={"Origin": f"http://127.0.0.1:{port}"})  # its own origin
    assert status == 200 and "access-control-allow-origin" not in headers
    assert "*" not in json.dumps(headers)


def test_a_cross_site_form_post_to_the_audio_endpoint_is_403_before_its_body_is_read(gateway):
    """A page on another site can post a form without a preflight: refused on its headers alone (reading the body,
    which never comes here, would end in a 408 after --request-timeout-s 2)."""
    head = b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\n"
    sock = raw_socket(gateway.port, head + b"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 20000000\r\n\r\n")
    started = time.monotonic()
    answer = read_all(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 403") and b"origin_not_allowed" in answer, answer[:300]
    assert time.monotonic() - started < 1.5 and not gateway.log_lines("did not send its request body")


# ------------------------------------------------------------------ 3, 4: bounded work


@pytest.fixture(scope="module")
def keyed_gateway(served, tmp_path_factory):
    flags = ["--max-embedding-inputs", "3", "--api-key-env", "HF2TRITON_BOUNDARY_KEY"]
    log = tmp_path_factory.mktemp("keyed") / "gateway.log"
    with gateway_process(served, log, *flags, env={"HF2TRITON_BOUNDARY_KEY": KEY}) as running:
        yield running


def test_embedding_inputs_per_request_are_bounded_before_triton(served, gateway, keyed_gateway):
    before = statistics(served)["embed"]
    status, _, answer = call(gateway.port, "POST", "/v1/embeddings", {"model": "embed", "input": ["a"] * 2049})
    assert status == 413 and answer["error"]["param"] == "input" and answer["error"]["code"] == "too_large", answer
    assert "at most 2048" in answer["error"]["message"], "OpenAI's limit is the default"
    auth = {"Authorization": f"Bearer {KEY}"}
    status, _, answer = call(keyed_gateway.port, "POST", "/v1/embeddings", {"model": "embed", "input": ["a text"] * 4}, auth)
    assert status == 413 and "at most 3" in answer["error"]["message"], answer
    assert statistics(served)["embed"] == before, "nothing reached Triton"
    status, _, answer = call(gateway.port, "POST", "/v1/embeddings", {"model": "embed", "input": ["a text"] * 6})
    assert status == 200 and len(answer["data"]) == 6
    # more than the model's max_texts_per_request (6): sent to it in requests it takes, as LangChain's 1,000 would be
    status, _, answer = call(gateway.port, "POST", "/v1/embeddings", {"model": "embed", "input": [f"text {i}" for i in range(13)]})
    assert status == 200 and [row["index"] for row in answer["data"]] == list(range(13)), answer
    status, _, answer = call(keyed_gateway.port, "POST", "/v1/embeddings", {"model": "embed", "input": ["a text"] * 3}, auth)
    assert status == 200 and len(answer["data"]) == 3


def test_bearer_is_case_insensitive(keyed_gateway):
    for scheme in ("Bearer", "bearer", "BEARER"):
        assert call(keyed_gateway.port, "GET", "/v1/models", headers={"Authorization": f"{scheme} {KEY}"})[0] == 200
    for header in ({"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {}):
        status, _, answer = call(keyed_gateway.port, "GET", "/v1/models", headers=header)
        assert status == 401 and answer["error"]["code"] == "invalid_api_key"


def test_a_body_is_bounded_in_size_while_it_is_read(gateway):
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    # a declared size over the limit: refused at once, nothing read
    sock = raw_socket(gateway.port, head + b"Content-Length: 400000000\r\n\r\n")
    started = time.monotonic()
    answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 413") and b"too_large" in answer and time.monotonic() - started < 5, answer[:300]
    sock.close()
    # a chunked body that never ends: cut off once past the limit, not read to its end
    sock = raw_socket(gateway.port, head + b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n"
    sent = 0
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, socket.timeout):
        while sent < 256 << 20:
            sock.sendall(chunk)
            sent += 1 << 20
    answer = read_all(sock)
    sock.close()
    assert sent < 64 << 20, f"{sent >> 20} MB were accepted"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 413"), answer[:300]  # the answer may be lost to the reset


def test_a_slow_body_is_408_and_a_client_leaving_mid_body_is_one_log_line(gateway):
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    sock = raw_socket(gateway.port, head)  # --request-timeout-s 2: the other 99 bytes never come
    started = time.monotonic()
    answer = read_all(sock)  # the server answers, then closes (recv returns b"")
    waited = time.monotonic() - started
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"2 s" in answer and 1.5 < waited < 10, (waited, answer[:300])
    assert len(gateway.log_lines("did not send its request body within 2 s")) == 1
    for _ in range(5):
        raw_socket(gateway.port, head).close()
    deadline = time.monotonic() + 10
    while len(gateway.log_lines("left before sending its whole request")) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(gateway.log_lines("left before sending its whole request")) == 5
    assert "Traceback" not in gateway.log.read_text() and "gateway error" not in gateway.log.read_text()


# ------------------------------------------------------------------ 5. a non-streamed request whose client leaves


def stubs(workflow, model: str) -> list[int]:
    """The pids of the model's Python-backend stub processes."""
    marker = f"{workflow.settings().repository}/{model}/"
    commands = {pid: host.process_cmdline(pid) or [] for pid in host.descendants(workflow.state()["pid"])}
    return [pid for pid, cmd in commands.items() if len(cmd) > 1 and "triton_python_backend_stub" in cmd[0] and cmd[1].startswith(marker)]


def cpu_seconds(pids: list[int], window_s: float) -> float:
    """CPU time the processes use over the next `window_s` seconds."""
    before = sum(host.process_cpu_seconds(pid) or 0.0 for pid in pids)
    time.sleep(window_s)
    return sum(host.process_cpu_seconds(pid) or 0.0 for pid in pids) - before


def test_a_non_streamed_request_whose_client_leaves_stops_generating(served, gateway):
    """The generation model's own process does the work: busy while a long non-streamed answer is generated,
    idle within a decoding step of its client leaving (3000 sampled tokens would keep it busy for many seconds)."""
    generating = stubs(served, "generate")
    assert generating and cpu_seconds(generating, 1.0) < 0.2, "idle before"
    body = json.dumps({**chat(0), **LONG}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    sock = raw_socket(gateway.port, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    busy = max(cpu_seconds(generating, 1.0) for _ in range(3))
    assert busy > 0.3, f"the generation runs ({busy:.2f} CPU s in 1 s)"
    sock.close()  # the client leaves without reading an answer
    time.sleep(1.0)  # the cancellation reaches the model's next step
    assert cpu_seconds(generating, 2.0) < 0.2, "the generation stopped"
    assert len(gateway.log_lines("left before its answer: the generation was cancelled")) == 1
    status, _, answer = call(gateway.port, "POST", "/v1/chat/completions", chat(0))  # its place (max_sequences 1) is free
    assert status == 200 and answer["usage"]["completion_tokens"] >= 1


def streamed(port: int, body: dict) -> socket.socket:
    data = json.dumps({**body, "stream": True}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    return raw_socket(port, head + b"Content-Length: %d\r\n\r\n" % len(data) + data)


def test_streamed_clients_that_leave_free_their_places_at_once(served, gateway):
    """max_sequences 1, max_queue 2: a long stream holds the only place and two streamed requests wait for one.
    Those two leave before their first piece: their Triton requests are cancelled then (the gateway watches for the
    disconnect while it waits; it used to notice only when a first piece came, after the long stream), so the queue
    has room at once. The long stream leaves too: the next request gets the place within a step or so (measured on
    2 busy cores: 0.02-0.35 s from the close to a 4-token answer, the same as on an idle server;
    benchmarks/probes/cancel_latency.py)."""

    def cancelled() -> None:
        deadline = time.monotonic() + 30
        while len(gateway.log_lines("left before its first piece: the generation was cancelled")) < 2:
            assert time.monotonic() < deadline, gateway.log.read_text()[-2000:]
            time.sleep(0.05)

    leaving_clients_free_their_places(gateway.port, cancelled)


def leaving_clients_free_their_places(port: int, cancelled: Callable[[], None]) -> None:
    """max_sequences 1, max_queue 2: a long stream holds the only place, two streamed requests wait for it and a third
    is refused (429). The two leave (`cancelled()` returns once their requests are cancelled): the next request waits
    for the place rather than being refused, and gets it within 2 s of the long stream's client leaving."""
    running = streamed(port, {**chat(0), **LONG})
    got = b""
    while b"data:" not in got:
        got += running.recv(65536)
    waiting = [streamed(port, {**chat(0), **LONG}) for _ in range(2)]
    time.sleep(1.0)  # sent before the check: they have reached the model's queue
    status, _, answer = call(port, "POST", "/v1/chat/completions", chat(0))
    assert status == 429 and answer["error"]["code"] == "busy", ("the queue is full", status, answer)
    for sock in waiting:
        sock.close()
    cancelled()
    answers: list = []
    queued = threading.Thread(target=lambda: answers.append(call(port, "POST", "/v1/chat/completions", chat(0))))
    queued.start()  # waits for the place: refused at once (429) if the two that left still held the queue
    time.sleep(0.5)
    assert not answers, ("queued behind the long stream, not refused", answers)
    left = time.monotonic()
    running.close()
    queued.join(timeout=60)
    took = time.monotonic() - left
    assert answers and answers[0][0] == 200 and answers[0][2]["usage"]["completion_tokens"] >= 1, answers
    assert took < 2.0, f"the place was free {took:.2f} s after the stream left"


def sse_answer(port: int, body: dict) -> tuple[str, list[str | None]]:
    """A streamed chat's text (its pieces joined) and its chunks' finish reasons, read to `data: [DONE]`."""
    sock = streamed(port, body)
    data = read_all(sock)
    sock.close()
    events = [json.loads(line[5:]) for line in data.decode().splitlines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    return text, [e["choices"][0].get("finish_reason") for e in events if e.get("choices")]


def test_the_http_upstream_answers_as_grpc_does_and_a_stream_that_leaves_frees_its_place(served, gateway, tmp_path):
    """--http: generation read from Triton's HTTP event stream (issue 46: the gateway at the speed of Triton's own
    SSE) answers exactly as the gRPC upstream -- whole, streamed, from token ids, with log-probabilities -- and
    Triton's refusals keep their status (a full queue is 429). Triton's HTTP front end sees a closed connection only
    when it writes: requests waiting for a place get keep-alive pieces (interface.KEEPALIVE, not passed on), so two
    queued clients that leave free the queue within a second or so, and the long stream's place is free within a
    step of its client leaving."""
    with gateway_process(served, tmp_path / "http.log", "--http", served.settings().url()) as upstream:
        requests = [
            ("/v1/chat/completions", chat(0, max_tokens=6)),
            ("/v1/completions", {"model": "generate", "prompt": [5, 6, 7, 8], "max_tokens": 5}),
            ("/v1/completions", {"model": "generate", "prompt": "Hello", "max_tokens": 4, "logprobs": 2, "echo": True}),
        ]
        for path, body in requests:
            answers = [call(port, "POST", path, body) for port in (gateway.port, upstream.port)]
            assert [a[0] for a in answers] == [200, 200], answers
            assert [(a[2]["choices"], a[2]["usage"]) for a in answers[1:]] == [(answers[0][2]["choices"], answers[0][2]["usage"])]
        grpc_stream, http_stream = (sse_answer(port, chat(0, max_tokens=8)) for port in (gateway.port, upstream.port))
        # the same text and finish (the pieces may be cut differently: the response thread joins what waits)
        assert http_stream[0] == grpc_stream[0] and http_stream[1][-1] == grpc_stream[1][-1] in ("stop", "length")

        # a keep-alive each (every KEEPALIVE_S), and the next poll of the model's loop
        leaving_clients_free_their_places(upstream.port, lambda: time.sleep(3 * KEEPALIVE_S + 0.3))


# ------------------------------------------------------------------ 6, 7: odd input is a 4xx


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(0, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}), "response_format"),
        (chat(0, repetition_penalty=1.2), "repetition_penalty"),
        (chat(0, frequency_penalty=3), "frequency_penalty"),
    ],
)
def test_parameters_not_honoured_are_400_naming_them(gateway, body, param):
    status, _, answer = call(gateway.port, "POST", "/v1/chat/completions", body)
    assert status == 400 and answer["error"]["param"] == param and param in answer["error"]["message"], answer


def test_odd_requests_are_4xx_openai_errors(gateway):
    port = gateway.port
    ok = chat(0, response_format={"type": "text"}, frequency_penalty=0, presence_penalty=0.0)
    assert call(port, "POST", "/v1/chat/completions", ok)[0] == 200
    surrogate = b'{"model": "generate", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    status, _, answer = call(port, "POST", "/v1/chat/completions", surrogate, {"Content-Type": "application/json"})
    assert status == 400 and answer["error"]["param"] == "messages[0].content", answer
    surrogate = b'{"model": "generate", "prompt": "\\ud800"}'
    status, _, answer = call(port, "POST", "/v1/completions", surrogate, {"Content-Type": "application/json"})
    assert status == 400 and answer["error"]["param"] == "prompt", answer
    surrogate = b'{"model": "embed", "input": ["fine", "\\udfff"]}'
    status, _, answer = call(port, "POST", "/v1/embeddings", surrogate, {"Content-Type": "application/json"})
    assert status == 400 and answer["error"]["param"] == "input", answer
    for depth in (100_000, 900):
        deep = (
            b'{"model": "generate", "messages": ' + b"[" * depth + b"]" * depth + b', "max_tokens": ' + b"[" * depth + b"]" * depth + b"}"
        )
        status, _, answer = call(port, "POST", "/v1/chat/completions", deep, {"Content-Type": "application/json"})
        assert status == 400 and set(answer["error"]) == {"message", "type", "param", "code"}, (depth, answer)
    for method, path, status in (
        ("GET", "/nothing", 404),
        ("POST", "/v1/nothing", 404),
        ("GET", "/v1/chat/completions", 405),
        ("POST", "/v1/models", 405),
    ):
        got, headers, answer = call(port, method, path, {} if method == "POST" else None)
        assert got == status and set(answer["error"]) == {"message", "type", "param", "code"}, (method, path, answer)
        assert path in answer["error"]["message"]
    assert "Traceback" not in gateway.log.read_text()


# ------------------------------------------------------------------ 2. Triton down, dead, back


def test_a_dead_stub_is_503(served, gateway):
    settings = served.settings()
    dead = stubs(served, "generate")
    assert dead
    try:
        for pid in dead:
            os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
        status, _, answer = call(gateway.port, "POST", "/v1/chat/completions", chat(0))
        assert status == 503 and answer["error"]["code"] == "unavailable", answer
    finally:
        ensure_server(settings)  # reloads the model whose stub died
    assert call(gateway.port, "POST", "/v1/chat/completions", chat(0))[0] == 200


def test_triton_killed_is_503_and_the_same_gateway_serves_once_it_is_back(served, gateway, tmp_path):
    """Triton killed: the gateways answer 503 -- over gRPC and over Triton's HTTP stream (--http; a refused connection
    is retried for RECONNECT_S first) alike, and a fresh one that knows no model yet -- and the same ones serve again
    once Triton is back."""
    settings = served.settings()
    with gateway_process(served, tmp_path / "http.log", "--http", settings.url()) as over_http:
        assert call(over_http.port, "POST", "/v1/chat/completions", chat(0))[0] == 200  # its connections are up
        os.kill(served.state()["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while client.is_live(settings.url()) and time.monotonic() < deadline:
            time.sleep(0.1)
        status, _, answer = call(gateway.port, "GET", "/v1/models")
        assert status == 503 and answer["error"]["code"] == "unavailable" and "unavailable" in answer["error"]["message"], answer
        for port in (gateway.port, over_http.port):
            status, _, answer = call(port, "POST", "/v1/chat/completions", chat(0))
            assert status == 503 and answer["error"]["code"] == "unavailable", (port, answer)
        with gateway_process(served, tmp_path / "fresh.log") as fresh:  # knows no model yet: still 503, never 404
            status, _, answer = call(fresh.port, "POST", "/v1/chat/completions", chat(0))
            assert status == 503 and answer["error"]["code"] == "unavailable", answer
            assert call(fresh.port, "GET", "/health")[0] == 503
        ensure_server(settings)  # tritonserver back on the same ports
        for port in (gateway.port, over_http.port):
            status, _, answer = call(port, "POST", "/v1/chat/completions", chat(0))
            assert status == 200 and answer["choices"][0]["message"]["content"] is not None, (port, answer)
    status, _, answer = call(gateway.port, "GET", "/v1/models")
    assert status == 200 and {m["id"] for m in answer["data"]} == {"embed", "generate"}


# ------------------------------------------------------------------ the playground page (issue 31)


def test_the_playground_page_loads_only_its_own_files_under_a_strict_policy(gateway):
    import re

    status, headers, _ = call(gateway.port, "GET", "/")
    assert status == 307 and headers["location"] == "/playground/"
    status, headers, answer = call(gateway.port, "GET", "/playground/")
    page = answer["raw"].decode()
    assert status == 200 and headers["content-type"].startswith("text/html"), headers
    policy = headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
    loaded = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert loaded and all(url.startswith("/playground/") for url in loaded), loaded
    assert "media-src blob:;" in policy, "only the user's own audio plays (the audio view's preview)"
    for name, kind in (("app.js", "text/javascript"), ("audio.js", "text/javascript"), ("style.css", "text/css")):
        status, headers, answer = call(gateway.port, "GET", f"/playground/{name}")
        assert status == 200 and headers["content-type"].startswith(kind)
        text = answer["raw"].decode()
        assert not re.search(r"https?://", text.replace("location.origin", "")), f"{name} names another site"
    script = call(gateway.port, "GET", "/playground/app.js")[2]["raw"].decode()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "eval(" not in script
    assert "localStorage" not in script and "sessionStorage" in script, "the key lives in the tab's session storage only"
    for path in ("/playground/../app.py", "/playground/%2e%2e/app.py", "/playground/nothing.js", "/playground/index.html/x"):
        assert call(gateway.port, "GET", path)[0] == 404, path
    assert call(gateway.port, "GET", "/playground/", headers={"Host": f"rebound.example:{gateway.port}"})[0] == 421


def test_status_lists_the_models_backend_device_and_instances_behind_the_key(keyed_gateway):
    assert call(keyed_gateway.port, "GET", "/playground/")[0] == 200, "the page holds no data: it asks for the key"
    status, _, answer = call(keyed_gateway.port, "GET", "/v1/status", headers={"Authorization": "Bearer wrong"})
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    status, _, answer = call(keyed_gateway.port, "GET", "/v1/status", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and answer["triton_ready"] is True, answer
    models = {m["id"]: m for m in answer["models"]}
    assert set(models) == {"embed", "generate"}
    assert models["embed"]["task"] == "feature-extraction" and models["embed"]["device"] == "cpu" and models["embed"]["instances"] >= 1
    assert models["generate"]["streaming"] is True and models["generate"]["backend"] == "python"


@pytest.fixture(scope="module")
def browser():
    from tests.browser import start_chromium

    driver = start_chromium()
    yield driver
    driver.quit()


def test_the_playground_in_headless_chromium_streams_stops_compares_and_embeds(served, gateway, browser, tmp_path):
    """The page against the real gateway and tritonserver: a chat answer streams in (several DOM updates) and equals
    the API's greedy answer; Stop ends the generation on the server; markup in a message stays text; compare shows two
    answers; the similarity table is symmetric with 1.0 on the diagonal; status lists the models; no console errors
    and no request leaves the gateway."""
    from tests.browser import console_errors, foreign, requested_urls, screenshot

    port = gateway.port
    browser.get(f"http://127.0.0.1:{port}/playground/")
    wait_for(browser, lambda: browser.execute_script("return !document.getElementById('tabs').hidden"))
    # chat: greedy, 8 tokens, streamed
    fill(browser, "chat-max-tokens", "8")
    fill(browser, "chat-input", "Tell me a story")
    browser.find_element("id", "chat-send").click()
    wait_for(browser, lambda: "finish:" in (text_of(browser, ".message.assistant .stats") or ""))
    shown = text_of(browser, ".message.assistant .text")
    ask = {"model": "generate", "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 8, "temperature": 0, "top_p": 1}
    status, _, answer = call(port, "POST", "/v1/chat/completions", ask)
    assert status == 200 and shown == answer["choices"][0]["message"]["content"], (shown, answer)
    assert "TTFT" in text_of(browser, ".message.assistant .stats")
    # issue 42 #7: no "Forget key" without a key; max_tokens offers the model's own range; a send the server refuses
    # leaves neither screen nor history, the text goes back in the box; Copy as CLI carries every setting
    assert browser.execute_script("return document.getElementById('logout').hidden")
    assert browser.execute_script("return document.getElementById('chat-max-tokens').max") == "3000"
    fill(browser, "chat-max-tokens", "4000")
    fill(browser, "chat-input", "refused")
    browser.find_element("id", "chat-send").click()
    wait_for(browser, lambda: "out of range (1..3000)" in (text_of(browser, "#error") or ""))
    assert (
        len(browser.find_elements("css selector", ".message")) == 2
        and browser.execute_script("return document.getElementById('chat-input').value") == "refused"
    )
    fill(browser, "chat-input", "")
    fill(browser, "chat-max-tokens", "8")
    fill(browser, "chat-system", "Be brief.")
    fill(browser, "chat-stop", "END")
    browser.find_element("id", "chat-copy").click()
    command = text_of(browser, "#chat-command")
    flags = ("--max-tokens '8'", "--temperature '0'", "--top-p '1'", "--stop 'END'", "--system 'Be brief.'")
    assert all(flag in command for flag in flags), command
    fill(browser, "chat-system", "")
    fill(browser, "chat-stop", "")
    # markup in a message is shown as text, never run
    fill(browser, "chat-input", '<img src=x onerror="window.__ran=1"><script>window.__ran=2</script>')
    browser.find_element("id", "chat-send").click()
    wait_for(browser, lambda: len(browser.find_elements("css selector", ".message.assistant .stats")) == 2
             and "finish:" in browser.find_elements("css selector", ".message.assistant .stats")[1].text)  # fmt: skip
    assert browser.execute_script("return window.__ran") is None
    assert "<script>" in browser.find_elements("css selector", ".message.user .text")[1].text
    assert not browser.find_elements("css selector", "#chat-log img, #chat-log script")
    screenshot(browser, "chat", tmp_path)
    # issue 44 #4: a JSON schema in its box is response_format json_schema: the random model's answer follows it
    browser.find_element("id", "chat-clear").click()
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    fill(browser, "chat-schema", json.dumps(schema))
    fill(browser, "chat-max-tokens", "200")
    fill(browser, "chat-input", "Is it ok?")
    browser.find_element("id", "chat-send").click()
    wait_for(browser, lambda: "finish: stop" in (text_of(browser, ".message.assistant .stats") or ""))
    assert json.loads(browser.execute_script("return document.querySelector('.message.assistant .text').textContent")) in (
        {"ok": True},
        {"ok": False},
    )
    fill(browser, "chat-schema", "")
    # Stop: a long sampled answer, stopped while it streams; the model's process goes idle within a step
    browser.find_element("id", "chat-clear").click()
    fill(browser, "chat-max-tokens", "3000")
    fill(browser, "chat-temperature", "1")
    fill(browser, "chat-input", "Tell me a story")
    generating = stubs(served, "generate")
    browser.find_element("id", "chat-send").click()
    # streamed: the answer is on the page, and keeps growing, while the server still generates (8 greedy tokens can
    # arrive in one read on a busy machine, so the long answer is where the pieces are seen)
    wait_for(browser, lambda: len(text_of(browser, ".message.assistant .text") or "") > 20)
    partial = text_of(browser, ".message.assistant .text")
    assert "finish:" not in (text_of(browser, ".message.assistant .stats") or ""), "shown before the answer ended"
    wait_for(browser, lambda: len(text_of(browser, ".message.assistant .text") or "") > len(partial))
    assert cpu_seconds(generating, 0.5) > 0.1, "generating"
    browser.find_element("id", "chat-stop-button").click()
    wait_for(browser, lambda: text_of(browser, ".message.assistant .stats") == "stopped")
    time.sleep(1.0)  # the cancellation reaches the model's next step
    assert cpu_seconds(generating, 2.0) < 0.2, "the generation stopped on the server"
    # compare: the same prompt to two settings, side by side
    browser.find_element("css selector", "#tabs button[data-view=compare]").click()
    fill(browser, "compare-prompt", "Hello there")
    browser.execute_script("for (const n of document.querySelectorAll('.side-max-tokens')) n.value = '6';")
    browser.find_element("id", "compare-send").click()
    wait_for(browser, lambda: all("finish:" in s.text for s in browser.find_elements("css selector", "#compare .stats")))
    assert all(a.text for a in browser.find_elements("css selector", "#compare .answer"))
    screenshot(browser, "compare", tmp_path)
    # embeddings: the cosine table
    browser.find_element("css selector", "#tabs button[data-view=embeddings]").click()
    browser.find_element("id", "embeddings-send").click()
    wait_for(browser, lambda: len(browser.find_elements("css selector", "#similarity tbody tr")) == 3)
    matrix = browser.execute_script(
        "return [...document.querySelectorAll('#similarity tbody tr')]"
        ".map(r => [...r.querySelectorAll('td')].map(c => Number(c.dataset.value)));"
    )
    for i, row in enumerate(matrix):
        assert abs(row[i] - 1.0) < 1e-4, matrix
        for j, value in enumerate(row):
            assert abs(value - matrix[j][i]) < 1e-6, matrix
    screenshot(browser, "embeddings", tmp_path)
    # status
    browser.find_element("css selector", "#tabs button[data-view=status]").click()
    wait_for(browser, lambda: len(browser.find_elements("css selector", "#status-models tbody tr")) == 2)
    assert "Triton ready" in text_of(browser, "#status-health")
    assert "max_sequences" in text_of(browser, "#status-models thead") and "unrelated" in text_of(browser, "#embeddings-note")
    assert text_of(browser, "#status-validation").startswith("Last validation: PASS (20"), text_of(browser, "#status-validation")
    screenshot(browser, "status", tmp_path)
    assert [e for e in console_errors(browser) if "status of 400" not in e] == []  # the refused send above: Chromium logs it
    urls = requested_urls(browser)
    assert any(url.endswith("/v1/chat/completions") for url in urls) and foreign(urls, port) == [], urls


def test_with_a_key_the_playground_shows_only_the_login_until_the_key_is_right(keyed_gateway, browser, tmp_path):
    from tests.browser import screenshot

    browser.get(f"http://127.0.0.1:{keyed_gateway.port}/playground/")
    wait_for(browser, lambda: browser.execute_script("return !document.getElementById('login').hidden"))
    visible = browser.execute_script("return [...document.querySelectorAll('#tabs, .view')].filter(n => !n.hidden).length")
    assert visible == 0, "nothing but the login prompt"
    fill(browser, "key", "wrong")
    browser.find_element("css selector", "#login-form button").click()
    wait_for(browser, lambda: "wrong API key" in (text_of(browser, "#login-error") or ""))
    assert browser.execute_script("return document.getElementById('tabs').hidden")
    screenshot(browser, "login", tmp_path)
    fill(browser, "key", KEY)
    browser.find_element("css selector", "#login-form button").click()
    wait_for(browser, lambda: browser.execute_script("return !document.getElementById('tabs').hidden"))
    assert browser.execute_script("return sessionStorage.getItem('hf2triton-api-key')") == KEY
    assert KEY not in browser.current_url
