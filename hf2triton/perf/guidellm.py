"""guidellm (vLLM's benchmark tool) against the gateway, beside bench's own streaming cells (issue 44): a short sweep
over streamed /v1/completions of synthetic prompts tokenised with the served model's own tokenizer -- one request at
a time, then as many as bench's top concurrency at once, then constant rates between the two -- so the figures
people quote from guidellm (TTFT, ITL, output tokens/s) sit next to ours for the same server.

guidellm is pinned in envs/test.txt (0.3.1: the newest that keeps numpy 1.x); where it is not installed the bench
says so in its report and goes on. The gateway's key reaches it through its environment, never its command line.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from hf2triton.specs import BenchSpec

log = logging.getLogger("hf2triton")

SWEEP_SIZE = 4  # synchronous, throughput, and two constant rates between them (guidellm's sweep profile)
# guidellm derives the constant rates from what its first two benchmarks completed: one that completed no request (a
# 0.5 s benchmark on a loaded 2-core machine) makes a rate of 0, which guidellm refuses (pydantic "greater_than")
MIN_SECONDS = 2.0
PROMPT_TOKENS = 128
NOT_INSTALLED = "guidellm is not installed in this environment (envs/test.txt pins it: make .venv/.installed-test)"


def guidellm_executable() -> Path | None:
    path = Path(sys.executable).parent / "guidellm"
    return path if path.exists() else None


def sweep_command(executable: Path, base_url: str, model: str, processor: str, bench: BenchSpec, report: Path) -> list[str]:
    """guidellm's command line: every benchmark of the sweep bench.seconds long (MIN_SECONDS at least), answers of
    bench's longest length."""
    data = f"prompt_tokens={PROMPT_TOKENS},output_tokens={max(bench.generation_max_new_tokens)}"
    seconds = max(bench.seconds, MIN_SECONDS)
    return [
        str(executable), "benchmark", "run", "--target", base_url, "--model", model, "--processor", processor,
        "--rate-type", "sweep", "--rate", str(SWEEP_SIZE), "--max-seconds", f"{seconds:g}", "--data", data,
        "--random-seed", "1", "--disable-progress", "--output-path", str(report),
    ]  # fmt: skip


def _summary(metric: dict[str, Any]) -> dict[str, float | None]:
    successful = metric["successful"]
    percentiles = successful.get("percentiles") or {}
    return {"mean": successful.get("mean"), "p50": percentiles.get("p50"), "p99": percentiles.get("p99")}


def read_report(report: Path) -> list[dict[str, Any]]:
    """One row per benchmark of guidellm's JSON report: its strategy, requests, output tokens/s, TTFT and ITL."""
    rows = []
    for benchmark in json.loads(report.read_text())["benchmarks"]:
        strategy, metrics, totals = benchmark["args"]["strategy"], benchmark["metrics"], benchmark["request_totals"]
        rows.append({
            "strategy": strategy.get("type_"),
            "rate": strategy.get("rate"),
            "requests": {key: totals.get(key, 0) for key in ("successful", "errored", "incomplete")},
            "requests_per_s": _summary(metrics["requests_per_second"])["mean"],
            "output_tokens_per_s": _summary(metrics["output_tokens_per_second"])["mean"],
            "concurrency": _summary(metrics["request_concurrency"])["mean"],
            "ttft_ms": _summary(metrics["time_to_first_token_ms"]),
            "itl_ms": _summary(metrics["inter_token_latency_ms"]),
        })  # fmt: skip
    return rows


def guidellm_sweep(base_url: str, api_key: str | None, model: str, processor: str, bench: BenchSpec, directory: Path) -> dict[str, Any]:
    """Run the sweep against the gateway at `base_url` (http://host:port, no /v1); its rows, or why there are none."""
    executable = guidellm_executable()
    if executable is None:
        log.info("bench %s: guidellm skipped: %s", model, NOT_INSTALLED)
        return {"skipped": NOT_INSTALLED}
    directory.mkdir(parents=True, exist_ok=True)
    report = directory / f"{model}.json"
    report.unlink(missing_ok=True)
    command = sweep_command(executable, base_url, model, processor, bench, report)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GUIDELLM__MAX_CONCURRENCY": str(max(bench.concurrency))}
    if api_key:
        env["GUIDELLM__OPENAI__API_KEY"] = api_key
    log.info("bench %s: guidellm sweep against the gateway (%d benchmarks of %g s)", model, SWEEP_SIZE, bench.seconds)
    timeout = SWEEP_SIZE * (bench.seconds + 60) + 120  # each benchmark drains its requests; the start loads the tokenizer
    try:
        finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"skipped": f"guidellm did not finish within {timeout:g} s", "command": command}
    (directory / f"{model}.log").write_text(finished.stdout + finished.stderr)
    if finished.returncode != 0 or not report.exists():
        tail = (finished.stderr or finished.stdout).strip().splitlines()[-1:] or [""]
        return {"skipped": f"guidellm exited {finished.returncode}: {tail[0][:300]}", "command": command}
    return {"tool": f"guidellm {metadata.version('guidellm')}", "command": command, "benchmarks": read_report(report)}
