"""What the OpenAI-compatible gateway costs, measured side by side in one run against the served default models
(`make serve` first; the gateway on openai.port): streamed chat through the gateway (the official `openai`
async client) vs the same requests as direct gRPC streams (tritonclient asyncio), and 32-text embedding
requests through the gateway vs direct gRPC infer. The load generator shares this machine's cores.

    .venv/bin/python benchmarks/gateway_cost.py [--concurrency 1 4] [--requests-per-client 4] [--seconds 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hf2triton.perf import loadgen  # noqa: E402
from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.specs import load_project  # noqa: E402
from hf2triton.triton.process import Settings  # noqa: E402


async def _gateway_streams(base: str, model: str, plan, clients: int) -> dict:
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
    queue = list(plan)
    ttft, gaps, tokens = [], [], 0

    async def one(prompt: bytes, max_tokens: int) -> None:
        nonlocal tokens
        started = time.perf_counter()
        times = []
        stream = await api.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt.decode()}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for event in stream:
            if event.choices and (event.choices[0].delta.content or event.choices[0].finish_reason):
                times.append(time.perf_counter())
            if event.usage:
                tokens += event.usage.completion_tokens
        ttft.append(times[0] - started)
        gaps.extend(b - a for a, b in zip(times, times[1:]))

    async def worker() -> None:
        while queue:
            await one(*queue.pop(0))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    await api.close()
    return {"tokens_per_s": round(tokens / elapsed, 2), "ttft_ms": loadgen.percentiles(ttft), "itl_ms": loadgen.percentiles(gaps)}


async def _gateway_embeddings(base: str, model: str, texts: list[str], clients: int, seconds: float) -> float:
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        nonlocal done
        index = offset
        while time.perf_counter() < deadline:
            start = (index * 32) % (len(texts) - 32)
            await api.embeddings.create(model=model, input=texts[start : start + 32])
            done += 32
            index += clients

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    elapsed = time.perf_counter() - started
    await api.close()
    return round(done / elapsed, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="per embeddings cell")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    project = load_project(args.config)
    settings = Settings.of(project.server, project.names, project.work)
    urls = settings.urls
    base = f"http://{settings.client_host}:{project.openai.port}/v1"
    generator = next(m.name for m in project.models if m.is_generation)
    encoder = next(m.name for m in project.models if m.task == "feature-extraction")
    prompts = [t.encode() for t in bench_texts(64, max_words=40)]
    result: dict = {"generation": [], "embeddings": {}, "note": "load generator on the same cores as the server"}
    for clients in args.concurrency:
        plan = loadgen.generation_plan(prompts, (16, 32, 64, 128), clients * args.requests_per_client)
        direct = loadgen.measure_generation(urls, generator, plan, clients, True)
        through = asyncio.run(_gateway_streams(base, generator, plan, clients))
        row = {
            "clients": clients,
            "direct": {"tokens_per_s": direct.items_per_s, "ttft_ms": direct.ttft_ms, "itl_ms": direct.itl_ms},
            "gateway": through,
            "tokens_per_s_ratio": round(through["tokens_per_s"] / direct.items_per_s, 3),
            "ttft_p50_added_ms": round(through["ttft_ms"]["p50"] - direct.ttft_ms["p50"], 1),
        }
        print(json.dumps({k: row[k] for k in ("clients", "tokens_per_s_ratio", "ttft_p50_added_ms")}), flush=True)
        result["generation"].append(row)
    texts = bench_texts(512, max_words=90)
    load = loadgen.Load("grpc", urls, encoder, [t.encode() for t in texts], 32, 4, args.seconds, 100000)
    direct_texts = loadgen.measure_tritonclient(load, warmup_s=1.0).items_per_s
    gateway_texts = asyncio.run(_gateway_embeddings(base, encoder, texts, 4, args.seconds))
    result["embeddings"] = {
        "request_texts": 32,
        "clients": 4,
        "direct_grpc_texts_per_s": direct_texts,
        "gateway_texts_per_s": gateway_texts,
        "ratio": round(gateway_texts / direct_texts, 3),
    }
    print(json.dumps(result["embeddings"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
