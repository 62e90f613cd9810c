"""Load generation against a Triton server on this machine: one measured cell = one protocol, one request
size, one concurrency level, bounded in time and requests.

Two tools produce the same `Cell` record, so reports do not care which one measured:
- `perf_analyzer` (Triton's own C++ load generator) where its binary runs on this host (its wheel needs
  glibc >= 2.38), for encoder models;
- otherwise a closed-loop generator on tritonclient's asyncio APIs (`tritonclient.{http,grpc}.aio`):
  `concurrency` coroutines each keep one request in flight, in one event loop, so the client costs one
  core at most and stays out of the GIL fights a thread pool would have.

Server-side figures (queue / compute input / infer / output per request, average batch size) come from
Triton's statistics API, read before and after each cell.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hf2triton.errors import UserError
from hf2triton.serving import interface
from hf2triton.triton import client
from hf2triton.triton.client import model_statistics
from hf2triton.triton.hidden_args import build_shim, hide_arguments

log = logging.getLogger(__name__)

PERF_ANALYZER_TIMEOUT_S = 600
PERF_ANALYZER_KEY_ENV = "HF2TRITON_ARG_PA_KEY_HEADER"  # carries perf_analyzer's `-H header:key` argument


@dataclass
class Cell:
    """One measured point of a load test."""

    tool: str
    protocol: str
    request_texts: int
    concurrency: int
    requests: int
    errors: int
    seconds: float
    requests_per_s: float
    items_per_s: float  # texts/s (encoders) or generated tokens/s (generation)
    latency_ms: dict[str, float]
    server: dict[str, float] = field(default_factory=dict)
    first_error: str = ""
    # generation cells: time to first token / between tokens (a static model's first token is its whole answer)
    mode: str = ""  # "stream" | "static"
    ttft_ms: dict[str, float] = field(default_factory=dict)
    itl_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentiles(latencies_s: list[float]) -> dict[str, float]:
    if not latencies_s:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0}
    values = np.asarray(latencies_s) * 1000.0
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": round(float(p50), 3), "p90": round(float(p90), 3), "p99": round(float(p99), 3),
            "mean": round(float(values.mean()), 3), "max": round(float(values.max()), 3)}  # fmt: skip


def check_loopback(url: str) -> None:
    """Load tests only ever target this machine."""
    hostname = url.rsplit(":", 1)[0]
    if not client.is_loopback(hostname):
        raise UserError(f"load test target {url} is not on 127.0.0.1", "benchmarks only run against a server on this machine")


# --- Triton's statistics API -------------------------------------------------------------------------


def server_breakdown(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Per-request averages (microseconds) of the phases between two statistics snapshots."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    requests = max(delta.get("success_count", 0), 1)
    out = {f"{phase}_us": round(delta.get(f"{phase}_ns", 0) / requests / 1000.0, 1)
           for phase in ("queue", "compute_input", "compute_infer", "compute_output")}  # fmt: skip
    out["requests"] = delta.get("success_count", 0)
    out["executions"] = delta.get("execution_count", 0)
    out["avg_batch_texts"] = round(delta.get("inference_count", 0) / max(delta.get("execution_count", 0), 1), 2)
    return out


# --- the tritonclient asyncio generator -----------------------------------------------------------------


def _client_modules(protocol: str):
    if protocol == "grpc":
        import tritonclient.grpc as sync_module
        import tritonclient.grpc.aio as aio_module
    else:
        import tritonclient.http as sync_module
        import tritonclient.http.aio as aio_module
    return sync_module, aio_module


def build_requests(
    protocol: str,
    texts: list[bytes],
    request_texts: int,
    options: dict[str, Any] | None = None,
    count: int = 64,
    primary: str = interface.TEXT,
) -> list:
    """`count` distinct input lists of `request_texts` texts (or files, in `primary`) each, built once (client-side
    serialisation is not what we measure)."""
    sync_module, _ = _client_modules(protocol)
    requests = []
    for index in range(count):
        start = (index * request_texts) % max(len(texts) - request_texts, 1)
        requests.append(client.build_inputs(sync_module, texts[start : start + request_texts], options, primary=primary))
    return requests


async def _closed_loop(triton, model: str, requests: list, concurrency: int, seconds: float, max_requests: int, output: str | None):
    latencies: list[float] = []
    outputs: list[bytes] = []
    errors: list[str] = []
    issued = 0
    deadline = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        nonlocal issued
        index = offset
        while time.perf_counter() < deadline and issued < max_requests:
            issued += 1
            inputs = requests[index % len(requests)]
            index += concurrency
            started = time.perf_counter()
            try:
                result = await triton.infer(model, inputs)
            except Exception as err:  # noqa: BLE001 - every failure is counted and the first one reported
                errors.append(str(err)[:300])
                continue
            latencies.append(time.perf_counter() - started)
            if output:
                outputs.extend(bytes(v) for v in result.as_numpy(output).reshape(-1))

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return latencies, errors, outputs, time.perf_counter() - started


async def _run_async(protocol: str, url: str, model: str, requests: list, concurrency: int, seconds: float, max_requests: int, output):
    _, aio_module = _client_modules(protocol)
    kwargs = {"conn_limit": max(concurrency, 1)} if protocol == "http" else {}
    triton = client.keyed(aio_module.InferenceServerClient(url, **kwargs))
    try:
        return await _closed_loop(triton, model, requests, concurrency, seconds, max_requests, output)
    finally:
        await triton.close()


@dataclass
class Load:
    """What one cell sends: `request_texts` corpus texts per request, `concurrency` in flight, over
    `protocol`, for `seconds` or `max_requests` (whichever ends first); `extra` = generation options."""

    protocol: str
    urls: dict[str, str]  # "http" / "grpc" -> host:port
    model: str
    texts: list[bytes]
    request_texts: int
    concurrency: int
    seconds: float
    max_requests: int
    extra: dict[str, Any] | None = None
    primary: str = interface.TEXT  # the tensor the rows go in (IMAGE / AUDIO: encoded files)

    @property
    def url(self) -> str:
        check_loopback(self.urls[self.protocol])
        return self.urls[self.protocol]


def measure_tritonclient(load: Load, warmup_s: float = 1.0, count_tokens=None) -> Cell:
    """One cell with the asyncio client: warm-up, then a bounded measured phase between two statistics reads.
    `count_tokens(list[bytes]) -> int` turns generated texts into the items of a generation cell."""
    protocol, url, model, urls = load.protocol, load.url, load.model, load.urls
    concurrency, seconds, max_requests, request_texts = load.concurrency, load.seconds, load.max_requests, load.request_texts
    requests = build_requests(protocol, load.texts, request_texts, load.extra, primary=load.primary)
    output = interface.TEXT_OUTPUT if count_tokens else None
    if warmup_s > 0:
        asyncio.run(_run_async(protocol, url, model, requests, concurrency, warmup_s, max_requests, None))
    before = model_statistics(urls["http"], model)
    latencies, errors, outputs, elapsed = asyncio.run(
        _run_async(protocol, url, model, requests, concurrency, seconds, max_requests, output)
    )
    breakdown = server_breakdown(before, model_statistics(urls["http"], model))
    done = len(latencies)
    items = count_tokens(outputs) if count_tokens else done * request_texts
    return Cell(
        tool="tritonclient",
        protocol=protocol,
        request_texts=request_texts,
        concurrency=concurrency,
        requests=done,
        errors=len(errors),
        seconds=round(elapsed, 3),
        requests_per_s=round(done / elapsed, 2) if elapsed else 0.0,
        items_per_s=round(items / elapsed, 2) if elapsed else 0.0,
        latency_ms=percentiles(latencies),
        server=breakdown,
        first_error=errors[0] if errors else "",
    )


# --- generation: streamed (TTFT / inter-token latency) or static, the same mixed load -----------------------


def generation_plan(texts: list[bytes], max_new_tokens: tuple[int, ...], count: int, seed: int = 0) -> list[tuple[bytes, int]]:
    """`count` (prompt, max_new_tokens) pairs: corpus prompts in order, lengths mixed in a seeded order, so
    every variant and concurrency level of a run gets the same requests."""
    lengths = [max_new_tokens[i % len(max_new_tokens)] for i in range(count)]
    random.Random(seed).shuffle(lengths)  # noqa: S311 - a reproducible load, not a secret
    return [(texts[i % len(texts)], lengths[i]) for i in range(count)]


@dataclass
class Answer:
    started: float
    piece_times: list[float]  # perf_counter of every response (one for a static model)
    tokens: int
    error: str = ""


async def stream_one(triton, model: str, prompt: bytes, max_new_tokens: int) -> Answer:
    import tritonclient.grpc as grpcclient

    inputs = client.build_inputs(grpcclient, [prompt], {interface.MAX_NEW_TOKENS: max_new_tokens}, one_prompt=True)

    async def request():
        yield {"model_name": model, "inputs": inputs}

    answer = Answer(time.perf_counter(), [], 0)
    async for result, error in triton.stream_infer(request()):
        if error is not None:
            answer.error = str(error)[:300]
            return answer
        answer.piece_times.append(time.perf_counter())
        tokens = result.as_numpy(interface.COMPLETION_TOKENS)
        if tokens is not None:  # the final response
            answer.tokens = int(tokens.reshape(-1)[0])
            return answer
    answer.error = "the stream ended without a final response"
    return answer


async def _static_one(triton, model: str, prompt: bytes, max_new_tokens: int, count_tokens) -> Answer:
    import tritonclient.grpc as grpcclient

    answer = Answer(time.perf_counter(), [], 0)
    try:
        result = await triton.infer(model, client.build_inputs(grpcclient, [prompt], {interface.MAX_NEW_TOKENS: max_new_tokens}))
    except Exception as err:  # noqa: BLE001 - counted and reported
        answer.error = str(err)[:300]
        return answer
    answer.piece_times.append(time.perf_counter())
    answer.tokens = count_tokens([bytes(v) for v in result.as_numpy(interface.TEXT_OUTPUT).reshape(-1)])
    return answer


async def run_plan(one, plan: list[tuple[bytes, int]], concurrency: int) -> tuple[list[Answer], float]:
    """`concurrency` workers take (prompt, max_new_tokens) from `plan` in order, `one(prompt, n)` -> Answer each."""
    answers: list[Answer] = []
    queue = list(plan)

    async def worker() -> None:
        while queue:
            answers.append(await one(*queue.pop(0)))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers, time.perf_counter() - started


async def _generation_loop(url: str, model: str, plan: list[tuple[bytes, int]], concurrency: int, stream: bool, count_tokens):
    import tritonclient.grpc.aio as aio

    triton = client.keyed(aio.InferenceServerClient(url))

    async def one(prompt: bytes, max_new_tokens: int) -> Answer:
        if stream:
            return await stream_one(triton, model, prompt, max_new_tokens)
        return await _static_one(triton, model, prompt, max_new_tokens, count_tokens)

    try:
        return await run_plan(one, plan, concurrency)
    finally:
        await triton.close()


def generation_cell(answers: list[Answer], elapsed: float, concurrency: int, mode: str, protocol: str, server: dict[str, float]) -> Cell:
    """Tokens/s over the whole cell, TTFT per request, inter-token latency per gap between a stream's pieces."""
    done = [a for a in answers if not a.error]
    errors = [a.error for a in answers if a.error]
    tokens = sum(a.tokens for a in done)
    gaps = [later - earlier for a in done for earlier, later in zip(a.piece_times, a.piece_times[1:])]
    return Cell(
        tool="tritonclient" if protocol == "grpc" else "aiohttp",
        protocol=protocol,
        request_texts=1,
        concurrency=concurrency,
        requests=len(done),
        errors=len(errors),
        seconds=round(elapsed, 3),
        requests_per_s=round(len(done) / elapsed, 3) if elapsed else 0.0,
        items_per_s=round(tokens / elapsed, 2) if elapsed else 0.0,
        latency_ms=percentiles([a.piece_times[-1] - a.started for a in done]),
        server=server,
        first_error=errors[0] if errors else "",
        mode=mode,
        ttft_ms=percentiles([a.piece_times[0] - a.started for a in done]),
        itl_ms=percentiles(gaps),
    )


def measure_generation(
    urls: dict[str, str], model: str, plan: list[tuple[bytes, int]], concurrency: int, stream: bool, count_tokens=None
) -> Cell:
    """One generation cell over gRPC: `concurrency` clients work through `plan` (closed loop)."""
    url = urls["grpc"]
    check_loopback(url)
    asyncio.run(_generation_loop(url, model, plan[:concurrency], concurrency, stream, count_tokens))  # warm-up
    before = model_statistics(urls["http"], model)
    answers, elapsed = asyncio.run(_generation_loop(url, model, plan, concurrency, stream, count_tokens))
    breakdown = server_breakdown(before, model_statistics(urls["http"], model))
    return generation_cell(answers, elapsed, concurrency, "stream" if stream else "static", "grpc", breakdown)


# --- perf_analyzer ---------------------------------------------------------------------------------------


def perf_analyzer_binary() -> str | None:
    """perf_analyzer next to this Python or on PATH, if it actually runs here (glibc >= 2.38)."""
    candidates = [os.path.join(os.path.dirname(sys.executable), "perf_analyzer"), shutil.which("perf_analyzer")]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            try:
                probe = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired):
                continue
            broken = "GLIBC_" in probe.stderr or "error while loading shared libraries" in probe.stderr
            if not broken:
                return path
    return None


def perf_analyzer_input(texts: list[bytes], extra: dict[str, Any] | None = None, count: int = 256) -> dict[str, Any]:
    """perf_analyzer's --input-data JSON: one text per entry (it batches entries itself with -b)."""
    data = []
    for text in texts[:count]:
        entry = {}
        for name, _, array in client.input_arrays([text], extra):
            value = array.reshape(-1)[0]
            entry[name] = {"content": [value.decode("utf-8") if isinstance(value, bytes) else value.item()], "shape": [1]}
        data.append(entry)
    return {"data": data}


def parse_perf_analyzer_csv(text: str) -> dict[str, Any]:
    """The first row of perf_analyzer's -f CSV (microseconds) as throughput, latencies and server phases."""
    row = next(csv.DictReader(io.StringIO(text)))

    def us(column: str) -> float:
        return float(row.get(column) or 0)

    return {
        "items_per_s": float(row["Inferences/Second"]),
        "latency_ms": {
            "p50": us("p50 latency") / 1000,
            "p90": us("p90 latency") / 1000,
            "p99": us("p99 latency") / 1000,
            "mean": us("Avg latency") / 1000,
            # perf_analyzer reports no maximum: None, not p99 relabelled
            "max": us("Max latency") / 1000 if row.get("Max latency") else None,
        },  # fmt: skip
        "server": {
            "queue_us": us("Server Queue"),
            "compute_input_us": us("Server Compute Input"),
            "compute_infer_us": us("Server Compute Infer"),
            "compute_output_us": us("Server Compute Output"),
        },  # fmt: skip
    }


def perf_analyzer_key(protocol: str, shim_dir: str) -> tuple[list[str], dict[str, str]]:
    """The argv entries and environment additions that make perf_analyzer send the client key (`-H name:key`;
    gRPC metadata for -i grpc) while its command line, world-readable in /proc/<pid>/cmdline, holds only a
    placeholder (hidden_args, as for tritonserver's own keys). `shim_dir`: a private directory for the shim."""
    header = client.GRPC_KEY_HEADER if protocol == "grpc" else client.KEY_HEADER
    hidden = {PERF_ANALYZER_KEY_ENV: f"{header}:{client.client_key()}"}
    placeholders, env = hide_arguments(hidden, build_shim(shim_dir), os.environ.get("LD_PRELOAD"))
    return ["-H", *placeholders], env


def measure_perf_analyzer(load: Load, binary: str) -> Cell:
    """One cell measured by perf_analyzer (its own warm-up and stability windows), same record."""
    protocol, url, model, urls = load.protocol, load.url, load.model, load.urls
    concurrency, seconds, request_texts = load.concurrency, load.seconds, load.request_texts
    with tempfile.TemporaryDirectory(prefix="hf2triton-pa-") as tmp:
        data_file, csv_file = os.path.join(tmp, "input.json"), os.path.join(tmp, "out.csv")
        with open(data_file, "w", encoding="utf-8") as handle:
            json.dump(perf_analyzer_input(load.texts, load.extra), handle)
        cmd = [
            binary, "-m", model, "-u", url, "-i", protocol, "-b", str(request_texts),
            "--concurrency-range", f"{concurrency}:{concurrency}", "--input-data", data_file,
            "--measurement-interval", str(int(seconds * 1000)), "--max-trials", "3", "--stability-percentage", "50",
            "-f", csv_file, "--verbose-csv",
        ]  # fmt: skip
        key_args, key_env = perf_analyzer_key(protocol, os.path.join(tmp, "shim"))
        before = model_statistics(urls["http"], model)
        started = time.perf_counter()
        result = subprocess.run(  # noqa: S603 - our argv, no shell
            [*cmd, *key_args], capture_output=True, text=True, timeout=PERF_ANALYZER_TIMEOUT_S, check=False, env={**os.environ, **key_env}
        )
        elapsed = time.perf_counter() - started
        if result.returncode != 0 or not os.path.isfile(csv_file):
            raise UserError(
                f"perf_analyzer failed ({result.returncode}): {(result.stderr or result.stdout)[-400:]}", "set bench.tool: tritonclient"
            )
        with open(csv_file, encoding="utf-8") as handle:
            parsed = parse_perf_analyzer_csv(handle.read())
    breakdown = server_breakdown(before, model_statistics(urls["http"], model))
    breakdown.update({k: round(v, 1) for k, v in parsed["server"].items()})
    rps = parsed["items_per_s"] / request_texts
    return Cell(
        tool="perf_analyzer",
        protocol=protocol,
        request_texts=request_texts,
        concurrency=concurrency,
        requests=int(breakdown["requests"]),
        errors=0,
        seconds=round(elapsed, 3),
        requests_per_s=round(rps, 2),
        items_per_s=round(parsed["items_per_s"], 2),
        latency_ms={k: (round(v, 3) if v is not None else None) for k, v in parsed["latency_ms"].items()},
        server=breakdown,
    )
