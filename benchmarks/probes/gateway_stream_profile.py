"""Probe (issue 46 #2): where the OpenAI gateway's time goes per streamed token, beside Triton's own SSE.

    .venv/bin/python -m pytest -q -s -p tests.conftest benchmarks/probes/gateway_stream_profile.py

Serves the tests' tiny generator (4096-token window, 32 running sequences, one gateway worker) and runs
benchmarks/gpu/generation_bench.py's closed loops of CLIENTS streams of 64 greedy tokens, first straight at
Triton's generate_stream (SSE), then at Triton's gRPC stream (read as the gateway reads it) and then at the
gateway's /v1/chat/completions, each cell's CPU seconds per 1,000 tokens read from /proc for tritonserver (its HTTP
and gRPC front ends), the model's stub and the gateway worker.
During a second gateway cell py-spy samples the gateway worker; the functions with the most samples (self and
inclusive) are printed. On 2 cores the load generator, the server and the gateway share the machine: the CPU per
token is the figure to compare, not the tokens/s."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hf2triton import host
from hf2triton.specs import OpenAISpec
from tests.helpers import ROOT, long_context_copy, make_workflow, tiny_model_entries

CLIENTS = 32
SECONDS = 10
TOKENS = 64
# PROFILED=stub: py-spy samples the model's stub during a second Triton SSE cell instead, only while a thread holds the
# GIL (--gil), per thread: the per-token Python work that serializes the batcher's loop with the response threads
PROFILED = os.environ.get("PROFILED", "gateway")
# the gateway reads generation from Triton's HTTP generate_stream (openai.upstream's default); UPSTREAM=grpc: its gRPC stream
UPSTREAM = os.environ.get("UPSTREAM", OpenAISpec.upstream)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    long_context = long_context_copy(tiny_models["text-generation"], tmp_path_factory.mktemp("long-context"))
    entries = tiny_model_entries({"text-generation": long_context})
    entries[0]["generation"] = {"max_new_tokens": TOKENS, "max_sequences": CLIENTS, "max_queue": CLIENTS}
    workflow = make_workflow(tmp_path_factory.mktemp("gateway-profile"), entries)
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0], "workers": 1, "upstream": UPSTREAM}
    workflow.run("serve")
    yield workflow
    workflow.stop()


def processes() -> dict[str, list[int]]:
    """tritonserver, the model stubs, and the gateway's worker (uvicorn's process serving the requests)."""
    found: dict[str, list[int]] = {"tritonserver": [], "stub": [], "gateway": []}
    for line in subprocess.run(["ps", "-eo", "pid,comm,args"], capture_output=True, text=True, check=True).stdout.splitlines()[1:]:
        pid, command, args = line.split(None, 2)
        if command == "tritonserver":  # its arguments are hidden (hf2triton/triton/hidden_args.py)
            found["tritonserver"].append(int(pid))
        elif command.startswith("triton_python"):
            found["stub"].append(int(pid))
        elif "hf2triton.gateway" in args:
            found["gateway"].append(int(pid))
    return found


def cpu(pids: list[int]) -> float:
    return sum(host.process_cpu_seconds(pid) or 0.0 for pid in pids)


def load(target: str, out: Path) -> dict:
    groups = processes()
    before = {name: cpu(pids) for name, pids in groups.items()}
    arguments = ["--target", target, "--clients", str(CLIENTS), "--seconds", str(SECONDS), "--warmup-s", "2"]
    arguments += ["--max-tokens", str(TOKENS), "--out", str(out)]
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "generation_bench.py"), *arguments], check=True, timeout=300)
    spent = {name: cpu(pids) - before[name] for name, pids in groups.items()}
    cell = json.loads(out.read_text())["cells"][-1]
    tokens = cell["tokens_per_s"] * (SECONDS + 2)  # the whole run's tokens, as the CPU was read around it all
    return {
        **{k: cell[k] for k in ("tokens_per_s", "itl_ms_p50", "ttft_ms_p50", "pieces_per_request", "errors")},
        "cpu_s_per_1k_tokens": {name: round(1000 * s / tokens, 3) for name, s in spent.items()},
    }


def top(folded: str, count: int = 25) -> tuple[list, list]:
    """(self, inclusive) sample shares of the functions in py-spy's folded stacks."""
    own, inclusive, total = collections.Counter(), collections.Counter(), 0
    for line in folded.splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = [frame.split(" (")[0] + " " + frame.rsplit("/", 1)[-1].rstrip(")") for frame in stack.split(";")]
        total += int(samples)
        own[frames[-1]] += int(samples)
        for frame in set(frames):
            inclusive[frame] += int(samples)
    share = lambda counter: [(round(100 * n / total, 1), name) for name, n in counter.most_common(count)]  # noqa: E731
    return share(own), share(inclusive)


def test_profile(served, tmp_path):
    settings = served.settings()
    port = served.config["openai"]["port"]
    triton = f"sse=triton,http://{settings.url()},generate"
    gateway = f"gateway=openai,http://127.0.0.1:{port},generate"
    grpc = f"grpc=grpc,{settings.url('grpc_port')},generate"  # Triton's gRPC stream, read as the gateway reads it
    results = {"sse": load(triton, tmp_path / "sse.json"), "grpc": load(grpc, tmp_path / "grpc.json")}
    results["gateway"] = load(gateway, tmp_path / "gateway.json")
    stub = PROFILED == "stub"
    pid = max(processes()["stub" if stub else "gateway"], key=lambda pid: cpu([pid]))
    with tempfile.NamedTemporaryFile(suffix=".txt") as folded:
        options = ["--gil", "--threads"] if stub else []
        command = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--duration", str(SECONDS)]
        command += ["--rate", "200", "--format", "raw", "--output", folded.name, "--nonblocking", *options]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
        results[f"{'sse' if stub else 'gateway'} (profiled)"] = load(triton if stub else gateway, tmp_path / "profiled.json")
        spy.wait(60)
        own, inclusive = top(Path(folded.name).read_text())
    print(json.dumps({"upstream": UPSTREAM, **results}, indent=1))
    profiled = "model stub (GIL held)" if stub else "gateway worker"
    for title, shares in ((f"{profiled}, self % of samples:", own), (f"{profiled}, inclusive % of samples:", inclusive)):
        print(f"\n{title}")
        for share, function in shares:
            print(f"  {share:5.1f}  {function}")
