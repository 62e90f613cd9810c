"""A bounded soak test: mixed traffic (embeddings, generation, deliberately bad requests) at a fixed
concurrency against a server on this machine, recording per interval the errors, p50/p99 latency and the
resident memory of tritonserver and its Python-backend stubs.

A deliberately bad request counts as rejected only when the server answered it with the error the model
gives for it (400-class status and its message); a request the server never answered (connection refused,
server gone) is an unexpected error, counted apart as "server unreachable". Memory follows the server's
current pid (a restart mid-soak is followed; an interval without a server says so, never "0 B").

    python -m hf2triton.perf.soak --duration 300 --concurrency 32        # `make soak`
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hf2triton import host
from hf2triton.config import load_project
from hf2triton.errors import UserError, exit_on_user_error
from hf2triton.fsutil import atomic_write_json, atomic_write_text, human_bytes
from hf2triton.serving import interface
from hf2triton.triton import client
from hf2triton.triton.settings import Settings
from hf2triton.triton.state import read_state

WORDS = "the model serves text quickly while many clients send requests of different length and kind".split()
BAD_KINDS = ("invalid-utf8", "empty", "oversized", "bad-max-new-tokens")
# The answer the model gives each bad kind (model.py's RequestError text), with a 400-class status.
EXPECTED_REJECTIONS = {
    "invalid-utf8": "text is not valid UTF-8",
    "empty": "text is empty",
    "oversized": "exceeds max_input_bytes",
    "bad-max-new-tokens": f"{interface.MAX_NEW_TOKENS}=-1",
}
# A gRPC stream's error response carries the message but no status code: that the server sent one is its answer.
STREAM_ERROR = "error response in the stream"
BAD_REQUEST_STATUSES = ("StatusCode.INVALID_ARGUMENT", "400", STREAM_ERROR)  # gRPC, HTTP, gRPC stream
# The server did not answer at all (gRPC UNAVAILABLE: refused, reset, socket closed; HTTP: no connection).
UNREACHABLE = re.compile(r"UNAVAILABLE|failed to connect|connection refused|connection reset|socket closed|broken pipe", re.I)


@dataclass
class Sample:
    at: float
    kind: str
    expected_ok: bool
    ok: bool
    latency_ms: float
    error: str = ""
    status: str = ""  # the error's status (tritonclient's InferenceServerException.status()), if any


def outcome(sample: Sample) -> str:
    """good_ok | bad_rejected | unreachable | unexpected. A bad request is "rejected" only when the server
    answered it with the model's error for its kind; an unanswered request (any kind) is "unreachable"."""
    if sample.ok:
        return "good_ok" if sample.expected_ok else "unexpected"
    if UNREACHABLE.search(f"{sample.status} {sample.error}"):
        return "unreachable"
    if sample.expected_ok:
        return "unexpected"
    expected = EXPECTED_REJECTIONS.get(sample.kind)
    answered = sample.status in BAD_REQUEST_STATUSES or any(f"[{code}]" in sample.error for code in BAD_REQUEST_STATUSES)
    return "bad_rejected" if answered and expected is not None and expected in sample.error else "unexpected"


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
    """The traffic: the gRPC address, task -> model, model -> max_input_bytes, share of bad requests, and the
    streaming (decoupled) models, which answer over gRPC streams."""

    url: str
    models: dict[str, str]
    limits: dict[str, int]
    bad_share: float
    streaming: frozenset[str] = frozenset()


def _send(triton, mix: Mix, model: str, texts: list[bytes], extra: dict[str, Any]) -> None:
    if model not in mix.streaming:
        triton.infer(model, client.build_inputs(_grpc(), texts, extra), client_timeout=120)
        return
    try:
        client.stream_generate(mix.url, model, texts[0], extra, timeout_s=120)
    except Exception as err:  # noqa: BLE001 - the server's answer, unless it never answered
        if UNREACHABLE.search(str(err)):
            raise
        raise StreamError(str(err)) from None


class StreamError(Exception):
    def status(self) -> str:
        return STREAM_ERROR


def _grpc():
    import tritonclient.grpc as grpcclient

    return grpcclient


def streaming_models(grpc_url: str, names: list[str]) -> frozenset[str]:
    """The decoupled (streaming) models among `names`, from the server's model configs."""
    triton = client.grpc_client(grpc_url)
    try:
        return frozenset(n for n in names if triton.get_model_config(n).config.model_transaction_policy.decoupled)
    finally:
        triton.close()


def _worker(mix: Mix, deadline: float, seed: int, out: list[Sample], lock: threading.Lock) -> None:
    triton = client.grpc_client(mix.url)
    rng = random.Random(seed)  # noqa: S311 - load generation, not cryptography
    while time.monotonic() < deadline:
        kind, model, texts, extra, expected_ok = _request(rng, mix.models, mix.bad_share, mix.limits)
        started = time.monotonic()
        try:
            _send(triton, mix, model, texts, extra)
            ok, error, status = True, "", ""
        except Exception as err:  # noqa: BLE001 - every outcome is recorded
            status = err.status() if callable(getattr(err, "status", None)) else ""
            ok, error, status = False, str(err)[:200], str(status or "")
        sample = Sample(started, kind, expected_ok, ok, (time.monotonic() - started) * 1000, error, status)
        with lock:
            out.append(sample)
    triton.close()


def find_server_pid(settings: Settings) -> int | None:
    """The pid of the tritonserver serving `settings.repository` now (None: no server). The state file is
    re-read every time (a restart by `make serve` writes the new pid there); while a restart has not written
    it yet, a tritonserver process whose command line names the repository is found in /proc."""
    state = read_state(settings)
    if state and state.get("pid"):
        pid = int(state["pid"])
        if host.process_cmdline(pid) == state.get("cmdline"):
            return pid
    marker = f"--model-repository={settings.repository}"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            cmd = host.process_cmdline(int(entry.name)) or []
            if cmd and Path(cmd[0]).name == "tritonserver" and marker in cmd:
                return int(entry.name)
    return None


def _memory(server_pid: int | None) -> dict[str, int] | None:
    """RSS per process of the server and its stubs; None when the server is gone."""
    rss = host.process_rss_bytes(server_pid) if server_pid is not None else None
    if rss is None:
        return None
    pids = host.descendants(server_pid)
    return {str(server_pid): rss, **{str(pid): host.process_rss_bytes(pid) or 0 for pid in pids}}


def memory_sample(at: float, server_pid: int | None) -> dict[str, Any]:
    """One memory reading: {"at", "pid", "total", "processes"}; pid and total are None when no server runs."""
    per_process = _memory(server_pid)
    if per_process is None:
        return {"at": at, "pid": None, "total": None, "processes": {}}
    return {"at": at, "pid": server_pid, "total": sum(per_process.values()), "processes": per_process}


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def summarise(
    samples: list[Sample], memory: list[dict[str, Any]], start: float, interval_s: float, warmup_intervals: int = 1
) -> dict[str, Any]:
    """Per-interval figures and the verdict: 0 unexpected errors (unreachable ones included), the server up
    at every memory reading, and RSS growth < 10% after warm-up (within one server process: a restart
    starts afresh, so growth is measured from the first reading of the last pid)."""
    intervals = []
    outcomes = [outcome(s) for s in samples]
    count = max(1, int(np.ceil((max((s.at for s in samples), default=start) - start + 1e-9) / interval_s)))
    for index in range(count):
        lo, hi = start + index * interval_s, start + (index + 1) * interval_s
        chunk = [(s, o) for s, o in zip(samples, outcomes) if lo <= s.at < hi]
        good = [s.latency_ms for s, o in chunk if o == "good_ok"]
        readings = [m for m in memory if lo <= m["at"] < hi] or memory[-1:]
        gone = any(m["total"] is None for m in readings)
        last = next((m for m in reversed(readings) if m["total"] is not None), None)
        intervals.append(
            {
                "interval": index,
                "requests": len(chunk),
                "good_ok": sum(o == "good_ok" for _, o in chunk),
                "bad_rejected": sum(o == "bad_rejected" for _, o in chunk),
                "unexpected": sum(o in ("unexpected", "unreachable") for _, o in chunk),
                "unreachable": sum(o == "unreachable" for _, o in chunk),
                "p50_ms": round(_percentile(good, 50), 1),
                "p99_ms": round(_percentile(good, 99), 1),
                "rss_bytes": last["total"] if last else None,  # None: no reading of a running server
                "server_pid": last["pid"] if last else None,
                "server_gone": gone,
            }
        )
    steady = [i for i in (intervals[warmup_intervals:] or intervals) if i["rss_bytes"] is not None]
    same_server = [i for i in steady if steady and i["server_pid"] == steady[-1]["server_pid"]]
    rss_growth = (same_server[-1]["rss_bytes"] - same_server[0]["rss_bytes"]) / max(1, same_server[0]["rss_bytes"]) if same_server else 0.0
    p99s = [i["p99_ms"] for i in intervals[warmup_intervals:] or intervals if i["p99_ms"]]
    unexpected = [(s, o) for s, o in zip(samples, outcomes) if o in ("unexpected", "unreachable")]
    unreachable = [s for s, o in unexpected if o == "unreachable"]
    answered_wrongly = [s for s, o in unexpected if o == "unexpected"]
    gone_intervals = [i["interval"] for i in intervals if i["server_gone"]]
    pids = [m["pid"] for m in memory if m["pid"] is not None]
    return {
        "requests": len(samples),
        "unexpected_errors": len(unexpected),
        "unexpected_examples": [f"{s.kind}: {s.error or 'succeeded but should have failed'}" for s in answered_wrongly[:5]],
        "server_unreachable": len(unreachable),
        "unreachable_examples": [f"{s.kind}: {s.error}" for s in unreachable[:5]],
        "server_gone_intervals": gone_intervals,
        "server_pids": list(dict.fromkeys(pids)),  # more than one: the server restarted during the soak
        "rss_growth_after_warmup": round(rss_growth, 4),
        "p99_spread": round(max(p99s) / statistics.median(p99s), 2) if p99s else None,
        "ok": not unexpected and not gone_intervals and bool(pids) and rss_growth < 0.10,
        "intervals": intervals,
    }


def render_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# hf2triton soak test",
        "",
        f"**{'PASS' if result['ok'] else 'FAIL'}** — {result['requests']} requests in {result['duration_s']} s at concurrency "
        f"{result['concurrency']} ({result['bad_share']:.0%} deliberately bad); unexpected errors: {result['unexpected_errors']} "
        f"(server unreachable: {result['server_unreachable']}); "
        f"RSS growth after warm-up: {result['rss_growth_after_warmup']:.1%}; p99 max/median: {result['p99_spread']}",
    ]
    if result["server_gone_intervals"]:
        lines.append(f"\nThe server was gone in interval(s) {', '.join(map(str, result['server_gone_intervals']))}.")
    if len(result["server_pids"]) > 1:
        lines.append(f"\nThe server restarted during the soak (pids {', '.join(map(str, result['server_pids']))}).")
    examples = result["unexpected_examples"] + [f"server unreachable: {e}" for e in result["unreachable_examples"]]
    if examples:
        lines += ["", *[f"- {example}" for example in examples]]
    lines += [
        "",
        "| interval | requests | good ok | bad rejected | unexpected | server unreachable | p50 ms | p99 ms | RSS server+stubs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i in result["intervals"]:
        rss = human_bytes(i["rss_bytes"]) if i["rss_bytes"] is not None else ("server gone" if i["server_gone"] else "no reading")
        if i["rss_bytes"] is not None and i["server_gone"]:
            rss += " (server gone at a reading)"
        cells = [
            i["interval"],
            i["requests"],
            i["good_ok"],
            i["bad_rejected"],
            i["unexpected"],
            i["unreachable"],
            i["p50_ms"],
            i["p99_ms"],
            rss,
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def run_soak(
    grpc_url: str,
    models: dict[str, str],
    server_pid: Callable[[], int | None] | int,
    duration_s: float,
    concurrency: int,
    interval_s: float,
    bad_share: float = 0.2,
    limits: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Drive the traffic and sample memory; `models` maps task -> model name, `limits` model -> max_input_bytes.
    `server_pid` finds the server's pid at each reading (e.g. find_server_pid: follows a restart); a plain pid
    is read while that process lives."""
    locate = server_pid if callable(server_pid) else (lambda: server_pid)
    mix = Mix(grpc_url, models, limits or {}, bad_share, streaming_models(grpc_url, list(models.values())))
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
            memory.append(memory_sample(now, locate()))
            with lock:
                done = len(samples)
            total = memory[-1]["total"]
            rss = f"server+stubs RSS {human_bytes(total)}" if total is not None else "SERVER GONE (no tritonserver for this repository)"
            print(f"soak: {now - start:5.0f} s, {done} requests, {rss}", flush=True)
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
        if model.task not in interface.NON_TEXT_TASKS:  # the soak's traffic is texts
            models.setdefault(model.task, model.name)
    limits = {model.name: model.max_input_bytes for model in project.models}
    result = run_soak(
        settings.url("grpc_port"),
        models,
        lambda: find_server_pid(settings),
        args.duration,
        args.concurrency,
        args.interval,
        args.bad_share,
        limits,
    )
    atomic_write_json(args.output, result)
    atomic_write_text(Path(args.output).with_suffix(".md"), render_markdown(result))
    print(render_markdown(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
