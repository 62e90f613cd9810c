"""A bounded soak test: mixed traffic (embeddings, generation, deliberately bad requests) at a fixed
concurrency against a server on this machine, recording per interval the errors, p50/p99 latency and the
resident memory of tritonserver and its Python-backend stubs.

    python -m hf2triton.perf.soak --duration 300 --concurrency 32        # `make soak`
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton import host
from hf2triton.errors import UserError, exit_on_user_error
from hf2triton.fsutil import atomic_write_json, atomic_write_text, human_bytes
from hf2triton.serving import interface
from hf2triton.specs import load_project
from hf2triton.triton import client
from hf2triton.triton.process import Settings, read_state

WORDS = "the model serves text quickly while many clients send requests of different length and kind".split()
BAD_KINDS = ("invalid-utf8", "empty", "oversized", "bad-max-new-tokens")


@dataclass
class Sample:
    at: float
    kind: str
    expected_ok: bool
    ok: bool
    latency_ms: float
    error: str = ""


def _texts(rng: random.Random, count: int) -> list[bytes]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))).encode() for _ in range(count)]


def _request(rng: random.Random, models: dict[str, str], bad_share: float, limits: dict[str, int]):
    """(kind, model, inputs spec, expected_ok) for one request; `limits`: max_input_bytes per model name."""
    if rng.random() < bad_share:
        kind = rng.choice(BAD_KINDS if interface.GENERATION in models else BAD_KINDS[:3])
        model = models[interface.GENERATION] if kind == "bad-max-new-tokens" else next(iter(models.values()))
        oversized = b"x" * (limits.get(model, interface.DEFAULTS.max_input_bytes) + 1)
        text = {"invalid-utf8": b"\xff\xfe bad", "empty": b"  ", "oversized": oversized}.get(kind, b"Hello")
        extra = {interface.MAX_NEW_TOKENS: -1} if kind == "bad-max-new-tokens" else {}
        return kind, model, [text], extra, False
    task = rng.choice(sorted(models))
    if task == interface.GENERATION:
        return "generate", models[task], _texts(rng, 1), {interface.MAX_NEW_TOKENS: 8}, True
    return "embed" if task == interface.FEATURE_EXTRACTION else "classify", models[task], _texts(rng, rng.randint(1, 4)), {}, True


@dataclass(frozen=True)
class Mix:
    """The traffic: the gRPC address, task -> model, model -> max_input_bytes, share of bad requests."""

    url: str
    models: dict[str, str]
    limits: dict[str, int]
    bad_share: float


def _worker(mix: Mix, deadline: float, seed: int, out: list[Sample], lock: threading.Lock) -> None:
    import tritonclient.grpc as grpcclient

    triton = grpcclient.InferenceServerClient(mix.url)
    rng = random.Random(seed)  # noqa: S311 - load generation, not cryptography
    while time.monotonic() < deadline:
        kind, model, texts, extra, expected_ok = _request(rng, mix.models, mix.bad_share, mix.limits)
        inputs = client.build_inputs(grpcclient, texts, extra)
        started = time.monotonic()
        try:
            triton.infer(model, inputs, client_timeout=120)
            ok, error = True, ""
        except Exception as err:  # noqa: BLE001 - every outcome is recorded
            ok, error = False, str(err)[:200]
        sample = Sample(started, kind, expected_ok, ok, (time.monotonic() - started) * 1000, error)
        with lock:
            out.append(sample)
    triton.close()


def _memory(server_pid: int) -> dict[str, int]:
    pids = [server_pid, *host.descendants(server_pid)]
    return {str(pid): host.process_rss_bytes(pid) or 0 for pid in pids}


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def summarise(
    samples: list[Sample], memory: list[dict[str, Any]], start: float, interval_s: float, warmup_intervals: int = 1
) -> dict[str, Any]:
    """Per-interval figures and the verdict (0 unexpected errors, RSS growth < 10% after warm-up)."""
    intervals = []
    count = max(1, int(np.ceil((max((s.at for s in samples), default=start) - start + 1e-9) / interval_s)))
    for index in range(count):
        lo, hi = start + index * interval_s, start + (index + 1) * interval_s
        chunk = [s for s in samples if lo <= s.at < hi]
        good = [s.latency_ms for s in chunk if s.expected_ok and s.ok]
        mem = next((m for m in memory if lo <= m["at"] < hi), memory[-1] if memory else {"total": 0})
        intervals.append(
            {
                "interval": index,
                "requests": len(chunk),
                "good_ok": sum(s.expected_ok and s.ok for s in chunk),
                "bad_rejected": sum((not s.expected_ok) and (not s.ok) for s in chunk),
                "unexpected": sum(s.expected_ok != s.ok for s in chunk),
                "p50_ms": round(_percentile(good, 50), 1),
                "p99_ms": round(_percentile(good, 99), 1),
                "rss_bytes": mem["total"],
            }
        )
    steady = intervals[warmup_intervals:] or intervals
    rss_growth = (steady[-1]["rss_bytes"] - steady[0]["rss_bytes"]) / max(1, steady[0]["rss_bytes"])
    p99s = [i["p99_ms"] for i in steady if i["p99_ms"]]
    unexpected = [s for s in samples if s.expected_ok != s.ok]
    return {
        "requests": len(samples),
        "unexpected_errors": len(unexpected),
        "unexpected_examples": [f"{s.kind}: {s.error or 'succeeded but should have failed'}" for s in unexpected[:5]],
        "rss_growth_after_warmup": round(rss_growth, 4),
        "p99_spread": round(max(p99s) / statistics.median(p99s), 2) if p99s else None,
        "ok": not unexpected and rss_growth < 0.10,
        "intervals": intervals,
    }


def render_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# hf2triton soak test",
        "",
        f"**{'PASS' if result['ok'] else 'FAIL'}** — {result['requests']} requests in {result['duration_s']} s at concurrency "
        f"{result['concurrency']} ({result['bad_share']:.0%} deliberately bad); unexpected errors: {result['unexpected_errors']}; "
        f"RSS growth after warm-up: {result['rss_growth_after_warmup']:.1%}; p99 max/median: {result['p99_spread']}",
        "",
        "| interval | requests | good ok | bad rejected | unexpected | p50 ms | p99 ms | RSS server+stubs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i in result["intervals"]:
        cells = [
            i["interval"],
            i["requests"],
            i["good_ok"],
            i["bad_rejected"],
            i["unexpected"],
            i["p50_ms"],
            i["p99_ms"],
            human_bytes(i["rss_bytes"]),
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def run_soak(
    grpc_url: str,
    models: dict[str, str],
    server_pid: int,
    duration_s: float,
    concurrency: int,
    interval_s: float,
    bad_share: float = 0.2,
    limits: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Drive the traffic and sample memory; `models` maps task -> model name, `limits` model -> max_input_bytes."""
    mix = Mix(grpc_url, models, limits or {}, bad_share)
    samples: list[Sample] = []
    memory: list[dict[str, Any]] = []
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + duration_s
    workers = [threading.Thread(target=_worker, args=(mix, deadline, seed, samples, lock), daemon=True) for seed in range(concurrency)]
    for worker in workers:
        worker.start()
    next_report = start
    while any(w.is_alive() for w in workers):
        now = time.monotonic()
        if now >= next_report:
            per_process = _memory(server_pid)
            memory.append({"at": now, "total": sum(per_process.values()), "processes": per_process})
            with lock:
                done = len(samples)
            print(f"soak: {now - start:5.0f} s, {done} requests, server+stubs RSS {human_bytes(memory[-1]['total'])}", flush=True)
            next_report += interval_s
        time.sleep(0.2)
    result = summarise(samples, memory, start, interval_s)
    result.update(duration_s=duration_s, concurrency=concurrency, bad_share=bad_share, models=models, interval_s=interval_s)
    return result


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds (bounded: at most 3600)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds per reported interval")
    parser.add_argument("--bad-share", type=float, default=0.2)
    parser.add_argument("--output", default="results/soak/soak.json")
    args = parser.parse_args(argv)
    if not 1 <= args.duration <= 3600 or not 1 <= args.concurrency <= 256:
        raise UserError("--duration must be 1..3600 s and --concurrency 1..256")
    project = load_project(args.config)
    settings = Settings.of(project.server, project.names, project.work)
    state = read_state(settings)
    if not state or host.process_cmdline(int(state["pid"])) != state.get("cmdline"):
        raise UserError("no hf2triton server is running for this config", "start it with `make serve`")
    if not client.is_loopback(settings.client_host):
        raise UserError(f"the soak test only targets this machine's loopback, not {settings.host}")
    models: dict[str, str] = {}
    for model in project.models:
        models.setdefault(model.task, model.name)
    limits = {model.name: model.max_input_bytes for model in project.models}
    result = run_soak(
        settings.url("grpc_port"), models, int(state["pid"]), args.duration, args.concurrency, args.interval, args.bad_share, limits
    )
    atomic_write_json(args.output, result)
    atomic_write_text(Path(args.output).with_suffix(".md"), render_markdown(result))
    print(render_markdown(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
