"""Do several processes sharing one GPU lose time to context switching, and does a private CUDA MPS daemon
give it back? (issue 13: single-text requests, where 4-8 Triton GPU instances = 4-8 processes.)

Each worker process replays a CUDA graph shaped like a small MiniLM batch (6 layers, 8 rows x 128 tokens,
hidden 384, fp16) and synchronises after every replay, with `--host-ms` of CPU work in between (a served
execution's tokenisation and IPC), like a Triton instance. Printed: replays/s summed over the processes, for
1..N processes, without and with MPS (when `nvidia-cuda-mps-control` exists; its pipe and log directories are
private, so only these workers use it).

    python3 benchmarks/probes/gpu/mps_check.py OUT.json [--processes 1 4 8] [--seconds 4] [--host-ms 0.5]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time


def worker(seconds: float, host_ms: float, start_at: float, queue) -> None:
    import torch

    torch.cuda.init()
    layers = [
        (
            torch.randn(384, 1536, device="cuda", dtype=torch.float16) * 0.02,
            torch.randn(1536, 384, device="cuda", dtype=torch.float16) * 0.02,
        )
        for _ in range(6)
    ]
    x = torch.randn(8 * 128, 384, device="cuda", dtype=torch.float16)

    def forward():
        h = x
        for up, down in layers:
            h = h + torch.nn.functional.gelu(h @ up) @ down
        return h.float().sum()

    for _ in range(3):
        forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward()
    while time.time() < start_at:
        time.sleep(0.001)
    done = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        spin_until = time.perf_counter() + host_ms / 1000
        while time.perf_counter() < spin_until:
            pass
        graph.replay()
        out.item()  # a host sync per execution, as a served batch copies its outputs out
        done += 1
    queue.put(done)


def measure(processes: int, seconds: float, host_ms: float) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 8 + processes  # all workers initialised before anyone counts
    workers = [ctx.Process(target=worker, args=(seconds, host_ms, start_at, queue)) for _ in range(processes)]
    for w in workers:
        w.start()
    total = sum(queue.get(timeout=120) for _ in workers)
    for w in workers:
        w.join()
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--host-ms", type=float, default=0.5)
    args = parser.parse_args()
    result: dict = {"host_ms": args.host_ms, "seconds": args.seconds, "cells": []}
    control = shutil.which("nvidia-cuda-mps-control")
    result["mps_control"] = control or ""
    modes = ["plain"] + (["mps"] if control else [])
    for mode in modes:
        env_backup = dict(os.environ)
        if mode == "mps":
            pipe = tempfile.mkdtemp(prefix="mps-pipe-")
            log = tempfile.mkdtemp(prefix="mps-log-")
            os.environ.update(CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=log)
            started = subprocess.run([control, "-d"], capture_output=True, text=True)
            result["mps_start"] = {"rc": started.returncode, "stderr": started.stderr[-500:]}
        try:
            for n in args.processes:
                rate = measure(n, args.seconds, args.host_ms)
                cell = {"mode": mode, "processes": n, "replays_per_s": round(rate, 1)}
                result["cells"].append(cell)
                print(json.dumps(cell), flush=True)
        finally:
            if mode == "mps":
                servers = subprocess.run([control], input="get_server_list\n", capture_output=True, text=True)
                result["mps_servers"] = servers.stdout.strip()
                subprocess.run([control], input="quit\n", capture_output=True, text=True)
                log_file = os.path.join(os.environ["CUDA_MPS_LOG_DIRECTORY"], "control.log")
                if os.path.exists(log_file):
                    result["mps_control_log"] = open(log_file).read()[-1500:]
                os.environ.clear()
                os.environ.update(env_backup)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps(result, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
