"""Where a served model's time goes under load: py-spy samples the model's Python-backend stub process (the
code model.py runs) while a closed-loop load of single-text (or N-text) requests runs against it; the stacks are
folded into the share of samples per function (self and inclusive). The load generator shares this machine's
cores with the server: its own CPU time is printed next to the stubs' and tritonserver's (frontend, batcher).

    make serve   # then:
    .venv/bin/python benchmarks/probes/profile_served.py [--model minilm] [--texts 1] [--concurrency 16] [--seconds 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton import host  # noqa: E402
from hf2triton.config import load_project  # noqa: E402
from hf2triton.perf import loadgen  # noqa: E402
from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.triton.settings import Settings  # noqa: E402


def stub_pids(model: str) -> list[int]:
    """The Python-backend stub processes serving `model` (one per instance)."""
    found = []
    for pid in host.pids():
        cmdline = host.process_cmdline(pid) or []
        if cmdline and cmdline[0].endswith("triton_python_backend_stub") and any(f"/{model}/1/model.py" in c for c in cmdline):
            found.append(pid)
    return found


ROLES = {"run_forever": "batcher", "Responder._run": "responses", "_send_responses": "responses"}


def _role(frames: list[str]) -> str:
    """A sampled thread's role: the batcher's loop, a response thread, or (any other) Triton's calls into the stub."""
    return next((role for frame in frames for key, role in ROLES.items() if key in frame), "other")


def _where(frames: list[str]) -> str:
    """A sample's place: its innermost Python frame, and (samples taken with `--native`) the innermost named C frame
    under it -- e.g. `OnnxBatcher._run (onnx.py) > pthread_cond_timedwait (libc.so.6)`: a Python call waiting."""
    python = max((index for index, frame in enumerate(frames) if frame.endswith(".py)")), default=len(frames) - 1)
    native = [frame for frame in frames[python + 1 :] if not frame.startswith("0x")]
    return f"{frames[python]} > {native[-1]}" if native else frames[python]


def fold(raw: Path, top: int) -> dict:
    """py-spy's raw (collapsed) stacks -> share of samples per function, self and inclusive; with `--threads`, also per
    role (batcher, responses, other): its share of the samples and its own top places (`_where`, shares of its
    samples), which for samples taken with `--idle` say where that thread's wall time goes, waiting included."""
    own, inclusive, total = collections.Counter(), collections.Counter(), 0
    roles: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].rstrip(")").split(":")[0].rsplit("/", 1)[-1] + ")" for f in stack.split(";")]
        n = int(count)
        total += n
        own[frames[-1]] += n
        roles[_role(frames)][_where(frames)] += n
        for frame in set(frames):
            inclusive[frame] += n
    share = lambda c, of=total: [{"function": f, "share": round(n / max(of, 1), 4)} for f, n in c.most_common(top)]  # noqa: E731
    sizes = {role: sum(c.values()) for role, c in roles.items()}
    threads = {role: {"share": round(sizes[role] / max(total, 1), 4), "self": share(c, sizes[role])[:12]} for role, c in roles.items()}
    return {"samples": total, "self": share(own), "inclusive": share(inclusive), "roles": threads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--texts", type=int, default=1, help="texts per request")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default="")
    parser.add_argument("--no-spy", action="store_true", help="CPU split only: py-spy itself takes a share of the cores")
    args = parser.parse_args()
    project = load_project(args.config)
    settings = Settings.of(project.server, project.names, project.work)
    pids = stub_pids(args.model)
    if not pids:
        raise SystemExit(f"no stub process serves {args.model!r}: run `make serve` first")
    spy = Path(sys.executable).with_name("py-spy")
    texts = [t.encode() for t in bench_texts(512, max_words=90)]
    load = loadgen.Load("grpc", settings.urls, args.model, texts, args.texts, args.concurrency, args.seconds, 10_000_000)
    loadgen.measure_tritonclient(dataclasses.replace(load, seconds=2.0), warmup_s=0.5)  # warm-up, not profiled
    with tempfile.TemporaryDirectory() as scratch:
        raws = [Path(scratch) / f"{pid}.txt" for pid in pids]
        spies = [
            subprocess.Popen(  # noqa: S603 - our own py-spy on our own stub
                [
                    str(spy),
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    "200",
                    "--duration",
                    str(int(args.seconds) + 1),
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            for pid, raw in zip(pids, raws)
            if not args.no_spy
        ]
        time.sleep(1.0)
        server = host.parent_pid(pids[0])  # tritonserver: its gRPC/HTTP frontend and the dynamic batcher
        cpu_before = {pid: host.process_cpu_seconds(pid) or 0.0 for pid in [*pids, os.getpid(), server]}
        cell = loadgen.measure_tritonclient(load, warmup_s=0)
        cpu = {pid: round((host.process_cpu_seconds(pid) or 0.0) - cpu_before[pid], 2) for pid in cpu_before}
        for process in spies:
            process.wait(timeout=120)
        folded = [fold(raw, args.top) for raw in raws if raw.is_file()]
    result = {
        "model": args.model,
        "texts_per_request": args.texts,
        "concurrency": args.concurrency,
        "items_per_s": cell.items_per_s,
        "latency_ms": cell.latency_ms,
        "server": cell.server,
        "cpu_seconds": {
            "stubs": sum(cpu[p] for p in pids),
            "tritonserver": cpu[server],
            "load_generator": cpu[os.getpid()],
            "measured_s": cell.seconds,
        },
        "profile": folded,
        "note": "py-spy samples of the stub (Python frames; time in C/CUDA code counts for the Python line that called it)",
    }
    print(json.dumps({k: result[k] for k in ("items_per_s", "server", "cpu_seconds")}, indent=1))
    for entry in folded[:1]:
        print("self:", *(f"  {e['share']:.1%} {e['function']}" for e in entry["self"][:15]), sep="\n")
        print("inclusive:", *(f"  {e['share']:.1%} {e['function']}" for e in entry["inclusive"][:20]), sep="\n")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
