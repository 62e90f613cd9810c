"""What the OpenAI-compatible gateway costs, measured side by side with direct gRPC in one run (rule
bench_model, when openai.enabled and the gateway serves the model).

- generation: the same plan (corpus prompts, mixed max_new_tokens) streamed from `/v1/completions` (the same
  prompt path as Triton's `text` input, so both sides generate the same tokens) and as direct gRPC streams;
- embeddings: requests of `max_batch_size` texts to `/v1/embeddings` and as direct gRPC infer.

Rounds alternate the order (direct first, then gateway first) so a drift of the shared machine hits both sides;
the ratios are medians over rounds. The gateway process's own CPU time per request and per token is read from
/proc around each gateway cell: unlike the ratios it does not depend on what else runs on the machine.
The gateway client is aiohttp (already a tritonclient dependency), one event loop: the lightest generator that
speaks HTTP streaming; the direct client is tritonclient's asyncio gRPC.

The gateway measured is the bench's own (`private_gateway`): the same code and settings as `make serve`'s, in front
of the Triton being measured, on a free loopback port with a one-off API key, stopped afterwards. `make bench` used
to go through ensure_gateway, i.e. the gateway users talk to: any difference between the bench's view and the
running gateway (another config or overlay sharing paths.work, another $HF2TRITON_API_KEY in the shell, another
interpreter, a /health slower than 2 s on a loaded machine) restarted or re-pointed it, and the measurement then
depended on what that gateway was pointed at and had cached ("model 'smollm2' is served static", issue 24 #15).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.perf import loadgen
from hf2triton.perf.loadgen import Answer, Cell
from hf2triton.specs import OpenAISpec
from hf2triton.triton import client
from hf2triton.triton.cleanup import terminate
from hf2triton.triton.ports import listening_ports
from hf2triton.triton.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewayTarget:
    """Where the gateway answers (http://host:port/v1), its key (sent, never written) and its pid (for its CPU time)."""

    base: str
    api_key: str | None
    pid: int | None


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


BENCH_KEY_ENV = "HF2TRITON_BENCH_GATEWAY_KEY"  # the private gateway's one-off API key (its environment only)
PRIVATE_READY_S = 60


def private_gateway_command(settings: Settings, openai: OpenAISpec, port: int) -> tuple[list[str], str]:
    """(command, host:port): the gateway `make serve` runs (gateway.process.command: the same limits and host
    allowlist), bound to loopback on `port`, checking BENCH_KEY_ENV's key, in front of `settings`' Triton."""
    from hf2triton.gateway import process as gateway_process

    loopback = settings.client_host  # where this machine reaches the Triton being measured
    local = Settings.of(dataclasses.replace(settings.server, host=loopback), settings.models, settings.work, settings.repository)
    spec = dataclasses.replace(openai, host=loopback, port=port, api_key_env=BENCH_KEY_ENV)
    return gateway_process.command(local, spec), gateway_process.url(local, spec)


@contextmanager
def private_gateway(settings: Settings, openai: OpenAISpec, log_path: Path) -> Iterator[GatewayTarget]:
    """A gateway of the bench's own for the duration of the `with` block (see the module docstring): it never
    starts, stops or re-points the gateway users talk to, and what that one points at or remembers cannot change
    what bench measures. Refused if its port is answered by another process (a free port can be taken between
    choosing and binding it)."""
    port = host.free_port()
    cmd, address = private_gateway_command(settings, openai, port)
    key = secrets.token_urlsafe(24)
    env = {**os.environ, BENCH_KEY_ENV: key}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as handle:
        process = subprocess.Popen(  # noqa: S603 - our own module, no shell
            cmd, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )
    try:
        deadline = time.monotonic() + PRIVATE_READY_S
        while client.http_get(f"http://{address}/health", timeout=2)[0] != 200:  # 200: it answers and sees Triton ready
            if process.poll() is not None:
                tail = " | ".join(log_path.read_text(errors="replace").splitlines()[-6:])
                raise UserError(f"the bench's gateway exited ({process.returncode}): {tail}", f"read {log_path}")
            if time.monotonic() > deadline:
                raise UserError(f"the bench's gateway did not see a ready Triton within {PRIVATE_READY_S} s", f"read {log_path}")
            time.sleep(0.2)
        if port not in listening_ports(process.pid):
            raise UserError(f"port {port}, chosen for the bench's gateway, is answered by another program", "run the bench again")
        log.info("the bench's own gateway: %s (pid %d) in front of Triton at %s", address, process.pid, settings.url("grpc_port"))
        yield GatewayTarget(f"http://{address}/v1", key, process.pid)
    finally:
        terminate(process.pid, None)


async def _stream_one(session, base: str, model: str, prompt: bytes, max_new_tokens: int) -> Answer:
    body = {
        "model": model,
        "prompt": prompt.decode(),
        "max_tokens": max_new_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    answer = Answer(time.perf_counter(), [], 0)
    async with session.post(f"{base}/completions", json=body) as response:
        if response.status != 200:
            answer.error = f"HTTP {response.status}: {(await response.text())[:300]}"
            return answer
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                answer.error = str(event["error"].get("message"))[:300]
                return answer
            if event.get("usage"):
                answer.tokens = event["usage"]["completion_tokens"]
            elif event["choices"][0]["text"] or event["choices"][0]["finish_reason"]:
                answer.piece_times.append(time.perf_counter())
    if not answer.piece_times and not answer.error:
        answer.error = "the stream ended without a piece"
    return answer


async def _gateway_generation(target: GatewayTarget, model: str, plan: list[tuple[bytes, int]], concurrency: int):
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, headers=_headers(target.api_key), timeout=timeout) as session:
        return await loadgen.run_plan(lambda prompt, n: _stream_one(session, target.base, model, prompt, n), plan, concurrency)


async def _gateway_embeddings(target: GatewayTarget, model: str, batches: list[list[str]], concurrency: int, seconds: float):
    import aiohttp

    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=_headers(target.api_key)) as session:

        async def worker(offset: int) -> None:
            index = offset
            while time.perf_counter() < deadline:
                body = {"model": model, "input": batches[index % len(batches)], "encoding_format": "base64"}
                index += concurrency
                started = time.perf_counter()
                async with session.post(f"{target.base}/embeddings", json=body) as response:
                    payload = await response.read()
                if response.status != 200:
                    errors.append(f"HTTP {response.status}: {payload[:300]!r}")
                    continue
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return latencies, errors, time.perf_counter() - started


class _GatewayCpu:
    """CPU seconds the gateway process used inside a `with` block (None when its pid is unknown)."""

    def __init__(self, pid: int | None):
        self.pid, self.seconds = pid, None

    def __enter__(self):
        self.start = host.process_cpu_seconds(self.pid) if self.pid else None
        return self

    def __exit__(self, *_):
        end = host.process_cpu_seconds(self.pid) if self.pid else None
        self.seconds = end - self.start if end is not None and self.start is not None else None


def _per(seconds: float | None, count: int) -> float | None:
    return round(seconds * 1000.0 / count, 3) if seconds is not None and count else None


def _check_loopback(target: GatewayTarget) -> None:
    loadgen.check_loopback(target.base.split("//", 1)[-1].split("/", 1)[0])


async def _idle_pairs(model: str, urls: dict[str, str], target: GatewayTarget, prompt: bytes, pairs: int, generation: bool):
    """Alternating single requests on an otherwise idle server: what the gateway adds to one request's latency
    (generation: the time to the first token of a one-token answer; embeddings: a one-text request)."""
    import aiohttp
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aio

    triton = client.keyed(aio.InferenceServerClient(urls["grpc"]))
    inputs = client.build_inputs(grpcclient, [prompt])
    direct: list[float] = []
    through: list[float] = []
    async with aiohttp.ClientSession(headers=_headers(target.api_key)) as session:

        async def gateway_once() -> float:
            if generation:
                answer = await _stream_one(session, target.base, model, prompt, 1)
                if answer.error:
                    raise RuntimeError(answer.error)
                return answer.piece_times[0] - answer.started
            started = time.perf_counter()
            async with session.post(f"{target.base}/embeddings", json={"model": model, "input": prompt.decode()}) as response:
                await response.read()
            return time.perf_counter() - started

        async def direct_once() -> float:
            if generation:
                answer = await loadgen.stream_one(triton, model, prompt, 1)
                return answer.piece_times[0] - answer.started
            started = time.perf_counter()
            await triton.infer(model, inputs)
            return time.perf_counter() - started

        try:
            for index in range(pairs + 2):  # the first two pairs warm both paths up
                first, second = (direct_once, gateway_once) if index % 2 == 0 else (gateway_once, direct_once)
                a, b = await first(), await second()
                if index >= 2:
                    (direct if first is direct_once else through).append(a)
                    (through if first is direct_once else direct).append(b)
        finally:
            await triton.close()
    return direct, through


def idle_overhead(
    urls: dict[str, str], target: GatewayTarget, model: str, prompt: bytes, generation: bool, pairs: int = 20
) -> dict[str, Any]:
    """The gateway's added latency per request, measured alone (no load competing for the cores)."""
    _check_loopback(target)
    direct, through = asyncio.run(_idle_pairs(model, urls, target, prompt, pairs, generation))
    d, g = statistics.median(direct) * 1000.0, statistics.median(through) * 1000.0
    kind = "time to first token of a one-token answer" if generation else "latency of a one-text request"
    log.info("gateway alone, %s: p50 %.1f ms direct, %.1f ms through the gateway (%+.1f ms)", kind, d, g, g - d)
    return {"measures": kind, "pairs": pairs, "direct_p50_ms": round(d, 2), "gateway_p50_ms": round(g, 2), "added_p50_ms": round(g - d, 2)}


def _alternating(rounds: int, direct, gateway) -> list[dict[str, Any]]:
    """`rounds` pairs of cells {"direct": direct(), "gateway": gateway()}, the order alternating per round so a
    drift of the shared machine hits both sides."""
    pairs = []
    for index in range(rounds):
        order = ("direct", "gateway") if index % 2 == 0 else ("gateway", "direct")
        pair: dict[str, Any] = {"round": index + 1, "order": list(order)}
        for side in order:
            pair[side] = direct() if side == "direct" else gateway()
        pairs.append(pair)
    return pairs


def generation_cost(
    urls: dict[str, str], target: GatewayTarget, model: str, plan: list[tuple[bytes, int]], concurrency: int, rounds: int
) -> dict[str, Any]:
    """Streamed generation through the gateway vs direct gRPC streams, `rounds` times in alternating order."""
    _check_loopback(target)
    asyncio.run(_gateway_generation(target, model, plan[:concurrency], concurrency))  # warm-up

    def through_gateway() -> dict[str, Any]:
        before = loadgen.model_statistics(urls["http"], model)
        with _GatewayCpu(target.pid) as cpu:
            answers, elapsed = asyncio.run(_gateway_generation(target, model, plan, concurrency))
        breakdown = loadgen.server_breakdown(before, loadgen.model_statistics(urls["http"], model))
        cell: Cell = loadgen.generation_cell(answers, elapsed, concurrency, "stream", "openai", breakdown)
        tokens = sum(a.tokens for a in answers if not a.error)
        return {**cell.to_dict(), "gateway_cpu_ms_per_request": _per(cpu.seconds, cell.requests),
                "gateway_cpu_us_per_token": _per(cpu.seconds and cpu.seconds * 1000.0, tokens)}  # fmt: skip

    cells = _alternating(rounds, lambda: loadgen.measure_generation(urls, model, plan, concurrency, True).to_dict(), through_gateway)
    for pair in cells:
        pair["tokens_per_s_ratio"] = round(pair["gateway"]["items_per_s"] / max(pair["direct"]["items_per_s"], 1e-9), 3)
        pair["ttft_p50_added_ms"] = round(pair["gateway"]["ttft_ms"]["p50"] - pair["direct"]["ttft_ms"]["p50"], 1)
        log.info(
            "gateway vs gRPC, c%d round %d: tokens/s %.1f vs %.1f (%.3fx), TTFT p50 %+.1f ms, gateway CPU %s ms/request",
            concurrency, pair["round"], pair["gateway"]["items_per_s"], pair["direct"]["items_per_s"],
            pair["tokens_per_s_ratio"], pair["ttft_p50_added_ms"], pair["gateway"]["gateway_cpu_ms_per_request"],
        )  # fmt: skip
    return {
        "concurrency": concurrency,
        "rounds": cells,
        "tokens_per_s_ratio": round(statistics.median(c["tokens_per_s_ratio"] for c in cells), 3),
        "ttft_p50_added_ms": round(statistics.median(c["ttft_p50_added_ms"] for c in cells), 1),
        "errors": sum(c["gateway"]["errors"] + c["direct"]["errors"] for c in cells),
    }


def embeddings_cost(
    urls: dict[str, str],
    target: GatewayTarget,
    model: str,
    texts: list[str],
    request_texts: int,
    concurrency: int,
    seconds: float,
    rounds: int,
) -> dict[str, Any]:
    """Requests of `request_texts` texts through /v1/embeddings vs direct gRPC infer, alternating per round."""
    batches = [texts[i : i + request_texts] for i in range(0, len(texts) - request_texts + 1, request_texts)]
    load = loadgen.Load("grpc", urls, model, [t.encode() for t in texts], request_texts, concurrency, seconds, 1_000_000)
    _check_loopback(target)
    asyncio.run(_gateway_embeddings(target, model, batches, concurrency, 1.0))  # warm-up

    def through_gateway() -> dict[str, Any]:
        with _GatewayCpu(target.pid) as cpu:
            latencies, errors, elapsed = asyncio.run(_gateway_embeddings(target, model, batches, concurrency, seconds))
        done = len(latencies)
        return {
            "protocol": "openai",
            "request_texts": request_texts,
            "concurrency": concurrency,
            "requests": done,
            "errors": len(errors),
            "first_error": errors[0] if errors else "",
            "seconds": round(elapsed, 3),
            "items_per_s": round(done * request_texts / elapsed, 2) if elapsed else 0.0,
            "latency_ms": loadgen.percentiles(latencies),
            "gateway_cpu_ms_per_request": _per(cpu.seconds, done),
        }

    cells = _alternating(rounds, lambda: loadgen.measure_tritonclient(load, warmup_s=0.5).to_dict(), through_gateway)
    for pair in cells:
        pair["texts_per_s_ratio"] = round(pair["gateway"]["items_per_s"] / max(pair["direct"]["items_per_s"], 1e-9), 3)
        log.info(
            "gateway vs gRPC embeddings x%d, c%d round %d: %.1f vs %.1f texts/s (%.3fx), gateway CPU %s ms/request",
            request_texts, concurrency, pair["round"], pair["gateway"]["items_per_s"], pair["direct"]["items_per_s"],
            pair["texts_per_s_ratio"], pair["gateway"]["gateway_cpu_ms_per_request"],
        )  # fmt: skip
    return {
        "concurrency": concurrency,
        "request_texts": request_texts,
        "rounds": cells,
        "texts_per_s_ratio": round(statistics.median(c["texts_per_s_ratio"] for c in cells), 3),
        "errors": sum(c["gateway"]["errors"] + c["direct"]["errors"] for c in cells),
    }
