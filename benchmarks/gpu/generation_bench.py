"""Closed-loop streaming generation load, the same for every kind of endpoint (issue 25's side by side): N clients
each send a prompt, read the streamed answer to its end and send the next, for a fixed time per cell.

    python benchmarks/gpu/generation_bench.py --target NAME=KIND,URL,MODEL[,ignore_eos] [--target ...]
        [--clients 1 32 64 128] [--seconds 15] [--warmup-s 3] [--max-tokens 128] [--budget-s 540]
        [--rounds 1] [--reference NAME] --out RESULTS.json [--markdown RESULTS.md] [--label TEXT]

KIND: `openai` = POST URL/v1/chat/completions, stream: true, usage in the last chunk (`vllm serve`, hf2triton's
gateway); `triton` = POST URL/v2/models/MODEL/generate_stream, server-sent events, with the hf2triton-key header
(hf2triton.triton.client.client_key(), $HF2TRITON_KEY_FILE, or ~/.config/hf2triton/triton.key); `grpc` = the same
request as `triton` through Triton's gRPC stream (URL host:port of its gRPC port), read as the gateway reads it
(tritonclient.grpc.aio, one stream per request): Triton's gRPC front end without the gateway's HTTP side; `engine` = vLLM's
engine alone, no server: its AsyncLLM in this process (run with the vLLM venv's Python), URL the saved model's
directory, built with the limits `vllm serve` and backend vllm get in benchmarks/gpu/device.sh (ENGINE_ARGUMENTS:
float16, random weights, 4,096 positions, 256 sequences, 30 % of the GPU), the prompts through the model's chat template
as the servers apply it; the ceiling a server in front of that engine is measured against (issue 46). `ignore_eos` asks an
OpenAI server that knows it (vLLM's) for all max_tokens; hf2triton's model has no such option, so its answers end at
an end-of-sequence token: serve random weights (vllm.load_format: dummy, or a random-weight checkpoint) so that is
rare, and read tokens/request in the table (the completion tokens actually received).

Greedy (temperature 0), the same 8 chat prompts cycled in the same order for every target. Per cell: tokens/s =
completion tokens streamed inside the measured window (after the warm-up) / the window, each request's tokens spread
over its pieces and counted by their arrival (exact when every piece is one token; since 2026-12-07 15:50 -- before,
and still as `finished_tokens_per_s`, the tokens of the requests that finished inside the window, which moves in
whole waves of equal requests: one wave of 128 clients x 128 tokens is 2,731 tokens/s of a 6-s cell);
TTFT = time to the first piece of text; ITL = per request (last piece - first piece) / (tokens - 1), so pieces
that carry several tokens count right; gap = time between pieces. Results are written after every cell (a cut-short
run keeps what it measured); a cell that would end after --budget-s is skipped and says so.

--rounds N measures every cell N times, the targets in turn and in reverse order every other round, so a drift of the
shared machine (one window of one cell was the noise that decided several goals) hits every target alike; the
markdown then adds, per target and clients, the median over rounds and the median of the per-round ratios to the
--reference target (its cell of the same round and clients: `vllm serve`, or Triton SSE for the gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROMPTS = [
    "What is the capital of France?",
    "Write a short story about a robot who learns to paint.",
    "Explain how a transformer language model works, step by step.",
    "List ten ideas for a weekend trip in the mountains.",
    "What are the main differences between Python and C++?",
    "Describe the water cycle to a ten-year-old.",
    "Give me a recipe for a vegetarian lasagna.",
    "Summarize the history of the printing press.",
]


# the engine alone's vLLM engine arguments: those of device.sh's start_anchor (`vllm serve`) and vllm-overlay.yaml
ENGINE_ARGUMENTS = {"dtype": "float16", "max_model_len": 4096, "gpu_memory_utilization": 0.3, "max_num_seqs": 256, "load_format": "dummy"}


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # openai | triton | grpc | engine
    url: str  # http://host:port
    model: str
    ignore_eos: bool = False

    @classmethod
    def parse(cls, text: str) -> Target:
        name, _, rest = text.partition("=")
        parts = rest.split(",")
        kinds = ("openai", "triton", "grpc", "engine")
        if not name or len(parts) not in (3, 4) or parts[0] not in kinds or parts[3:] not in ([], ["ignore_eos"]):
            usage = "NAME=openai|triton,http://HOST:PORT,MODEL[,ignore_eos], NAME=grpc,HOST:PORT,MODEL"
            usage += " or NAME=engine,MODEL_DIR,MODEL[,ignore_eos]"
            raise argparse.ArgumentTypeError(f"--target {text!r}: use {usage}")
        return cls(name, parts[0], parts[1].rstrip("/"), parts[2], parts[3:] == ["ignore_eos"])


@dataclass
class Record:
    start: float
    end: float = 0.0
    first: float | None = None
    last: float | None = None
    pieces: list[float] = field(default_factory=list)
    tokens: int = 0
    finish: str | None = None
    error: str | None = None


def client_key() -> str:
    try:
        from hf2triton.triton.client import client_key as key

        return key(create=False)
    except Exception:  # noqa: BLE001 - not importable here: read the file it would
        path = os.environ.get("HF2TRITON_KEY_FILE") or str(Path.home() / ".config" / "hf2triton" / "triton.key")
        return Path(path).read_text().strip()


def request_of(target: Target, prompt: str, max_tokens: int) -> tuple[str, dict]:
    if target.kind == "triton":
        return f"{target.url}/v2/models/{target.model}/generate_stream", {"text": prompt, "max_new_tokens": max_tokens, "temperature": 0}
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.ignore_eos:
        body["ignore_eos"] = True
    return f"{target.url}/v1/chat/completions", body


def read_event(target: Target, event: dict, record: Record, now: float) -> None:
    """One server-sent event into the record: a piece of text, the finish, the token count, or an error."""
    if "error" in event:
        error = event["error"]
        record.error = error.get("message", str(error)) if isinstance(error, dict) else str(error)
        return
    if target.kind == "triton":
        text = event.get("text_output") or ""
        if event.get("finish_reason") is not None:
            record.finish, record.tokens = str(event["finish_reason"]), int(event.get("completion_tokens", 0))
    else:
        choices = event.get("choices") or []
        delta = (choices[0].get("delta") or {}) if choices else {}
        text = delta.get("content") or ""
        if choices and choices[0].get("finish_reason"):
            record.finish = choices[0]["finish_reason"]
        if event.get("usage"):
            record.tokens = int(event["usage"].get("completion_tokens", 0))
    if text:
        record.first = record.first or now
        record.last = now
        record.pieces.append(now)


async def one_request(session, target: Target, prompt: str, max_tokens: int, headers: dict) -> Record:
    if target.kind in ("engine", "grpc"):
        return await session.request(prompt, max_tokens)
    url, body = request_of(target, prompt, max_tokens)
    record = Record(time.perf_counter())
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
            else:
                async for raw in response.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if line.startswith("data:") and line != "data: [DONE]":
                        read_event(target, json.loads(line[5:]), record, time.perf_counter())
    except Exception as err:  # noqa: BLE001 - counted as an error of this request
        record.error = f"{type(err).__name__}: {err}"
    record.end = time.perf_counter()
    return record


class EngineAlone:
    """vLLM's AsyncLLM on this process's loop (created inside it, as its output handler needs), as one_request's
    `session` for a target of kind `engine`: each request a greedy DELTA stream of the prompt's chat-template ids."""

    def __init__(self, target: Target):
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        arguments = AsyncEngineArgs(model=target.url, disable_log_stats=True, **ENGINE_ARGUMENTS)
        self.engine = AsyncLLM.from_engine_args(arguments, usage_context=UsageContext.OPENAI_API_SERVER)
        tokenizer = AutoTokenizer.from_pretrained(target.url)
        chat = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
        self.prompt_ids = {p: tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for p, m in zip(PROMPTS, chat)}
        self.ignore_eos, self.count = target.ignore_eos, 0

    async def request(self, prompt: str, max_tokens: int) -> Record:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sampling = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=self.ignore_eos, output_kind=RequestOutputKind.DELTA)
        self.count += 1
        record = Record(time.perf_counter())
        try:
            async for output in self.engine.generate({"prompt_token_ids": self.prompt_ids[prompt]}, sampling, f"alone-{self.count}"):
                now, completion = time.perf_counter(), output.outputs[0]
                if completion.token_ids:
                    record.first = record.first or now
                    record.last = now
                    record.pieces.append(now)
                    record.tokens += len(completion.token_ids)
                if output.finished:
                    record.finish = completion.finish_reason
        except Exception as err:  # noqa: BLE001 - counted as an error of this request
            record.error = f"{type(err).__name__}: {err}"
        record.end = time.perf_counter()
        return record

    def close(self) -> None:
        self.engine.shutdown()


class TritonStreams:
    """Triton's gRPC stream as one_request's `session` for a target of kind `grpc`: one tritonclient.grpc.aio client
    (one channel, the key sent), one stream_infer per request with the `triton` kind's inputs, as the gateway asks."""

    def __init__(self, target: Target):
        import tritonclient.grpc as grpcclient
        import tritonclient.grpc.aio as aio

        from hf2triton.triton import client

        self.target, self.grpcclient, self.client = target, grpcclient, client
        self.triton = client.keyed(aio.InferenceServerClient(target.url.removeprefix("grpc://")))

    async def request(self, prompt: str, max_tokens: int) -> Record:
        from hf2triton.serving import interface

        options = {interface.MAX_NEW_TOKENS: max_tokens, interface.TEMPERATURE: 0.0}
        inputs = self.client.build_inputs(self.grpcclient, [prompt], options, one_prompt=True)
        record = Record(time.perf_counter())

        async def requests():
            yield {"model_name": self.target.model, "inputs": inputs}

        try:
            async for result, error in self.triton.stream_infer(requests()):
                now = time.perf_counter()
                if error is not None:
                    record.error = str(error)
                    break
                piece = result.as_numpy(interface.TEXT_OUTPUT)
                if piece is not None and piece.reshape(-1)[0]:
                    record.first = record.first or now
                    record.last = now
                    record.pieces.append(now)
                reason = result.as_numpy(interface.FINISH_REASON)
                if reason is not None:
                    record.finish = reason.reshape(-1)[0].decode()
                    record.tokens = int(result.as_numpy(interface.COMPLETION_TOKENS).reshape(-1)[0])
                    break
        except Exception as err:  # noqa: BLE001 - counted as an error of this request
            record.error = f"{type(err).__name__}: {err}"
        record.end = time.perf_counter()
        return record

    async def close(self) -> None:
        await self.triton.close()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def streamed_tokens(records: list[Record], window: tuple[float, float]) -> float:
    """Completion tokens that arrived inside `window`: each answered request's tokens spread evenly over its pieces,
    the pieces counted by their arrival (requests straddling the window's edges count for their part)."""
    start, end = window
    return sum(r.tokens * sum(start <= t <= end for t in r.pieces) / len(r.pieces) for r in records if r.error is None and r.pieces)


def summarize(records: list[Record], window: tuple[float, float]) -> dict:
    """The cell's figures: tokens/s from the tokens streamed inside `window`, the latencies from the requests that
    finished inside it (steady state of a closed loop)."""
    start, end = window
    done = [r for r in records if start <= r.end <= end]
    ok = [r for r in done if r.error is None]
    ttft = [1000 * (r.first - r.start) for r in ok if r.first is not None]
    itl = [1000 * (r.last - r.first) / (r.tokens - 1) for r in ok if r.first is not None and r.tokens > 1]
    gaps = [1000 * (b - a) for r in ok for a, b in zip(r.pieces, r.pieces[1:])]
    tokens = sum(r.tokens for r in ok)
    seconds = end - start

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 2)

    return {
        "requests": len(ok),
        "errors": len(done) - len(ok),
        "error_sample": next((r.error for r in done if r.error), None),
        "tokens_per_s": round(streamed_tokens(records, window) / seconds, 1),
        "finished_tokens_per_s": round(tokens / seconds, 1),
        "requests_per_s": round(len(ok) / seconds, 2),
        "tokens_per_request": round(tokens / len(ok), 1) if ok else None,
        "pieces_per_request": round(statistics.mean(len(r.pieces) for r in ok), 1) if ok else None,
        "finish_reasons": {reason: sum(r.finish == reason for r in ok) for reason in sorted({str(r.finish) for r in ok})},
        "ttft_ms_p50": ms(percentile(ttft, 0.5)),
        "ttft_ms_p99": ms(percentile(ttft, 0.99)),
        "itl_ms_p50": ms(percentile(itl, 0.5)),
        "itl_ms_p99": ms(percentile(itl, 0.99)),
        "gap_ms_p50": ms(percentile(gaps, 0.5)),
        "window_s": round(seconds, 2),
    }


@contextlib.asynccontextmanager
async def session_for(target: Target, read_timeout_s: float | None = 120):
    """What one_request sends through: an aiohttp session (servers), Triton's gRPC client (kind `grpc`), or the engine
    alone (kind `engine`)."""
    if target.kind == "grpc":
        streams = TritonStreams(target)
        try:
            yield streams
        finally:
            await streams.close()
        return
    if target.kind == "engine":
        engine = EngineAlone(target)
        try:
            yield engine
        finally:
            engine.close()
        return
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_read=read_timeout_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        yield session


async def run_cell(session, target: Target, clients: int, seconds: float, warmup_s: float, max_tokens: int, headers: dict) -> dict:
    records: list[Record] = []
    started = time.perf_counter()
    measure_from, stop_at = started + warmup_s, started + warmup_s + seconds

    async def client(index: int) -> None:
        turn = index
        while time.perf_counter() < stop_at:
            records.append(await one_request(session, target, PROMPTS[turn % len(PROMPTS)], max_tokens, headers))
            turn += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return {"target": target.name, "kind": target.kind, "clients": clients, **summarize(records, (measure_from, stop_at))}


async def wait_ready(session, target: Target, headers: dict, timeout_s: float) -> None:
    """The endpoint answers a short request (a model still loading, a server still starting: wait)."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = await one_request(session, target, PROMPTS[0], 4, headers)
        if record.error is None and record.first is not None:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{target.name}: not answering after {timeout_s:.0f} s: {record.error}")
        await asyncio.sleep(2)


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "–"


def ratios(results: list[dict], reference: str) -> list[str]:
    """Markdown rows: per (target, clients), the medians over rounds of tokens/s, TTFT and ITL p50, and the medians
    of the per-round ratios to `reference`'s cell of the same round and clients (tokens/s; ITL p50)."""
    measured = [c for c in results if "skipped" not in c and c.get("requests")]
    by_key = {(c["target"], c["clients"], c.get("round", 0)): c for c in measured}
    rows = []
    for target, clients in dict.fromkeys((c["target"], c["clients"]) for c in measured):
        cells = [c for c in measured if (c["target"], c["clients"]) == (target, clients)]
        pairs = [(c, by_key.get((reference, clients, c.get("round", 0)))) for c in cells]
        pairs = [(c, r) for c, r in pairs if r is not None and r["tokens_per_s"] and r["itl_ms_p50"]]
        tokens = [c["tokens_per_s"] for c in cells]
        figures = [
            len(cells),
            f"{statistics.median(tokens):,.0f} ({min(tokens):,.0f}–{max(tokens):,.0f})",
            _median([c["ttft_ms_p50"] for c in cells if c["ttft_ms_p50"] is not None]),
            _median([c["itl_ms_p50"] for c in cells if c["itl_ms_p50"] is not None]),
            _median([c["tokens_per_s"] / r["tokens_per_s"] for c, r in pairs]),
            _median([c["itl_ms_p50"] / r["itl_ms_p50"] for c, r in pairs if c["itl_ms_p50"] is not None]),
        ]
        rows.append(f"| {target} | {clients} | " + " | ".join(map(str, figures)) + " |")
    head = [
        "",
        f"Medians over rounds; ratios: the median of each round's ratio to {reference} (same round and clients).",
        "",
        "| target | clients | rounds | tokens/s median (range) | TTFT p50 (ms) | ITL p50 (ms) "
        f"| tokens/s ÷ {reference} | ITL ÷ {reference} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return head + rows


def markdown(results: list[dict], label: str, reference: str | None = None) -> str:
    lines = [
        f"# {label}",
        "",
        "| target | clients | round | tokens/s | requests/s | tokens/request | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) "
        "| ITL p99 (ms) | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in results:
        if "skipped" in cell:
            lines.append(f"| {cell['target']} | {cell['clients']} | {cell.get('round', 0)} | skipped: {cell['skipped']} | | | | | | | |")
            continue
        figures = [cell.get("round", 0), f"{cell['tokens_per_s']:,.0f}", *(cell[k] for k in ("requests_per_s", "tokens_per_request"))]
        figures += [cell["ttft_ms_p50"], cell["ttft_ms_p99"], cell["itl_ms_p50"], cell["itl_ms_p99"], cell["errors"]]
        lines.append(f"| {cell['target']} | {cell['clients']} | " + " | ".join(map(str, figures)) + " |")
    if reference is not None:
        lines += ratios(results, reference)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Target.parse, action="append", required=True)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32, 64, 128])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--budget-s", type=float, default=540.0, help="skip cells that would end after this (from the start)")
    parser.add_argument("--rounds", type=int, default=1, help="every cell this many times, the target order reversed every other round")
    parser.add_argument("--reference", help="a --target NAME: the markdown adds medians and per-round ratios to it")
    parser.add_argument("--out", required=True)
    parser.add_argument("--markdown")
    parser.add_argument("--label", default="generation load")
    args = parser.parse_args(argv)
    if args.reference is not None and args.reference not in {t.name for t in args.target}:
        parser.error(f"--reference {args.reference!r}: not a --target NAME ({', '.join(t.name for t in args.target)})")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    started = time.monotonic()
    out = Path(args.out)
    earlier = json.loads(out.read_text()) if out.is_file() else {}  # appended to: several calls, one file
    results: list[dict] = earlier.get("cells", [])
    targets = earlier.get("targets", []) + [asdict(t) for t in args.target]
    headers = {"hf2triton-key": client_key()} if any(t.kind == "triton" for t in args.target) else {}

    def save() -> None:  # after every cell: a run cut short keeps what it measured
        settings = {k: v for k, v in vars(args).items() if k not in ("target", "out", "markdown")}
        document = {"label": args.label, "settings": settings, "targets": targets, "cells": results}
        out.write_text(json.dumps(document, indent=1))
        if args.markdown:
            Path(args.markdown).write_text(markdown(results, args.label, args.reference))

    async def measure(target: Target, round_: int) -> None:  # one loop per target: the engine alone lives on it
        sent = headers if target.kind == "triton" else {}
        async with session_for(target) as session:
            await wait_ready(session, target, sent, args.ready_timeout_s)
            for clients in args.clients:
                cell_s = args.warmup_s + args.seconds + 10  # + the last answers after the window
                if time.monotonic() - started + cell_s > args.budget_s:
                    cell = {"target": target.name, "kind": target.kind, "clients": clients, "skipped": "time budget"}
                    results.append({**cell, "round": round_})
                else:
                    cell = {**await run_cell(session, target, clients, args.seconds, args.warmup_s, args.max_tokens, sent), "round": round_}
                    results.append(cell)
                    print(
                        f"{target.name} x{clients} (round {round_}): {cell['tokens_per_s']:,.0f} tokens/s, "
                        f"TTFT p50 {cell['ttft_ms_p50']} ms, "
                        f"ITL p50 {cell['itl_ms_p50']} ms, {cell['tokens_per_request']} tokens/request, {cell['errors']} errors"
                        + (f" (first: {cell['error_sample'][:300]})" if cell["errors"] else ""),  # the cause where only the log returns
                        flush=True,
                    )
                save()

    for round_ in range(args.rounds):
        for target in args.target if round_ % 2 == 0 else args.target[::-1]:
            asyncio.run(measure(target, round_))
    return 0


if __name__ == "__main__":
    sys.exit(main())
