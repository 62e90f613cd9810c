"""Closed-loop transcription load on OpenAI's `POST /v1/audio/transcriptions` (issue 45's anchor): hf2triton's gateway
and `vllm serve` read by one client, side by side.

    python benchmarks/gpu/transcription_bench.py --target NAME=http://HOST:PORT,MODEL [--target ...]
        [--clients 1 32] [--seconds 20] [--audio-s 5] --out RESULTS.json

Every request is the same synthetic WAV of --audio-s seconds at 16 kHz (hf2triton.pipeline.audio_probes: what
validation sends), as a multipart form (`file`, `model`, `response_format` json, `temperature` 0) as the openai SDK
sends it. Per cell: audios/s and audio seconds per second over the cell's wall time, latency p50/p99, errors (the
first one's text), and the answers' distinct texts (a model gives one answer to one audio). The targets take turns
within each client count. The load generator runs on the same host as the servers."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from generation_bench import percentile  # this script's folder is on sys.path: the same percentile as the generation load


def parse_target(text: str) -> tuple[str, str, str]:
    name, _, rest = text.partition("=")
    url, _, model = rest.rpartition(",")
    if not name or not url.startswith("http") or not model:
        raise argparse.ArgumentTypeError(f"--target {text!r}: use NAME=http://HOST:PORT,MODEL")
    return name, url.rstrip("/"), model


async def cell(url: str, model: str, audio: bytes, audio_s: float, clients: int, seconds: float) -> dict:
    import aiohttp

    latencies: list[float] = []
    errors: list[str] = []
    texts: set[str] = set()
    stop = time.perf_counter() + seconds

    async def client(session) -> None:
        while time.perf_counter() < stop:
            form = aiohttp.FormData()
            form.add_field("file", audio, filename="probe.wav", content_type="audio/wav")
            for key, value in (("model", model), ("response_format", "json"), ("temperature", "0")):
                form.add_field(key, value)
            began = time.perf_counter()
            try:
                async with session.post(f"{url}/v1/audio/transcriptions", data=form) as response:
                    body = await response.text()
                    if response.status != 200:
                        errors.append(f"HTTP {response.status}: {body[:200]}")
                        continue
                    texts.add(json.loads(body)["text"])
            except Exception as err:  # noqa: BLE001 - counted as an error of this request
                errors.append(f"{type(err).__name__}: {err}")
                continue
            latencies.append(time.perf_counter() - began)

    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    wall = time.perf_counter() - started
    return {
        "clients": clients,
        "audios_per_s": round(len(latencies) / wall, 2),
        "audio_seconds_per_s": round(len(latencies) * audio_s / wall, 1),
        "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "latency_p99_s": round(percentile(latencies, 0.99), 3) if latencies else None,
        "answers": len(latencies),
        "errors": len(errors),
        "error_sample": errors[0] if errors else None,
        "distinct_texts": sorted(texts)[:3],
    }


def main(argv: list[str] | None = None) -> int:
    from hf2triton.pipeline.audio_probes import encoded_audio, synthetic_audio

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=parse_target, action="append", required=True)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--audio-s", type=float, default=5.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    audio = encoded_audio(synthetic_audio(args.audio_s, 16000), 16000, "WAV")
    cells: list[dict] = []
    for clients in args.clients:
        for name, url, model in args.target:
            asyncio.run(cell(url, model, audio, args.audio_s, min(clients, 4), 2.0))  # warm-up: first shapes, graphs
            result = {"target": name, **asyncio.run(cell(url, model, audio, args.audio_s, clients, args.seconds))}
            print(json.dumps(result), flush=True)
            cells.append(result)
            settings = {k: v for k, v in vars(args).items() if k != "out"}
            Path(args.out).write_text(json.dumps({"settings": settings, "cells": cells}, indent=1))
    return 0 if all(c["errors"] == 0 and c["answers"] > 0 for c in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
