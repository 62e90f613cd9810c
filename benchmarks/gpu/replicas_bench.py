"""Issue 26: two replicas behind one address against one replica, single-text MiniLM load, side by side in one run.

Runs on the GPU machine after `device.sh serve` (replica one = the pipeline's validated server on the config's ports):
starts replica two = a second tritonserver of its own (own ports and work directory) on the same rendered repository,
joining replica one's CUDA MPS daemon, then measures, per client count and round (rounds alternate the order):

- `direct x1`: perf_analyzer (gRPC, 1 text per request) against replica one;
- `direct x2`: two perf_analyzers at the same time, one per replica, half the clients each (no shared address: the
  two replicas' capacity);
- `gateway x1` / `gateway x2`: the one address users get, the OpenAI gateway (`--workers W` processes), over replica
  one alone / over both (`--grpc a,b`: gRPC's round_robin), loaded by P aiohttp processes with /v1/embeddings
  requests of one text (base64).

Every load generator runs on the same cores as the servers and competes with them (said in the output).
  python benchmarks/gpu/replicas_bench.py --config CONFIG --model minilm --out results/replicas/replicas.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hf2triton.perf import corpus, loadgen
from hf2triton.perf.gateway_cost import GatewayTarget, _gateway_embeddings
from hf2triton.specs import load_project
from hf2triton.triton import client
from hf2triton.triton.process import Settings, mps_plan, start_server, stop_server, terminate

CELLS = ("direct x1", "direct x2", "gateway x1", "gateway x2")
GATEWAY_PORTS = {"x1": 9101, "x2": 9102}
NOTE = "load generators on the same 16 cores as both servers and the gateway: they compete with them"


def start_gateway(grpc: str, port: int, model: str, workers: int, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "HF2TRITON_API_KEY"}  # loopback, no key
    cmd = [sys.executable, "-m", "hf2triton.gateway", "--grpc", grpc, "--port", str(port), "--models", model, "--workers", str(workers)]
    process = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)  # noqa: SIM115, S603
    deadline = time.monotonic() + 120
    while client.http_get(f"http://127.0.0.1:{port}/health", timeout=2)[0] != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"gateway on {port} did not come up: {log.read_text()[-2000:]}")
        time.sleep(0.3)
    return process


def _gateway_worker(args: tuple[str, str, list[str], int, float]) -> tuple[int, int, float]:
    base, model, texts, clients, seconds = args
    latencies, errors, elapsed = asyncio.run(
        _gateway_embeddings(GatewayTarget(base, None, None), model, [[t] for t in texts], clients, seconds)
    )
    return len(latencies), len(errors), elapsed


def gateway_cell(pool, base: str, model: str, texts: list[str], clients: int, processes: int, seconds: float) -> dict:
    shares = [clients // processes + (1 if k < clients % processes else 0) for k in range(processes)]
    jobs = [(base, model, texts[k::processes], share, seconds) for k, share in enumerate(shares) if share]
    pool.map(_gateway_worker, [(b, m, t, c, 2.0) for b, m, t, c, _ in jobs])  # warm-up
    results = pool.map(_gateway_worker, jobs)
    done, errors = sum(r[0] for r in results), sum(r[1] for r in results)
    elapsed = max(r[2] for r in results)
    return {"texts_per_s": round(done / elapsed, 1), "requests": done, "errors": errors, "seconds": round(elapsed, 2)}


def direct_cell(urls: list[dict[str, str]], model: str, texts: list[bytes], clients: int, seconds: float, binary: str | None) -> dict:
    shares = [clients // len(urls) + (1 if k < clients % len(urls) else 0) for k in range(len(urls))]
    loads = [loadgen.Load("grpc", u, model, texts, 1, share, seconds, 10**7) for u, share in zip(urls, shares)]
    with ThreadPoolExecutor(len(loads)) as threads:  # perf_analyzer where it runs (glibc >= 2.38), else tritonclient
        measure = (lambda load: loadgen.measure_perf_analyzer(load, binary)) if binary else loadgen.measure_tritonclient
        cells = list(threads.map(measure, loads))
    return {"texts_per_s": round(sum(c.items_per_s for c in cells), 1), "per_replica": [c.items_per_s for c in cells]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.environ.get("HF2TRITON_CONFIG", "config.yaml"))
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gateway-workers", type=int, default=8)
    parser.add_argument("--load-processes", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("results/replicas/replicas.json"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    project = load_project(args.config)
    one = Settings.of(project.server, project.names, project.work)
    plan = mps_plan(one)
    if plan.wanted:  # replica two's processes join replica one's daemon (one MPS server per GPU)
        os.environ.update(plan.environment)
    ports = {"http_port": 8100, "grpc_port": 8101, "metrics_port": 8102}
    two = Settings.of(
        dataclasses.replace(project.server, cuda_mps="off", **ports), project.names, str(Path(".hf2triton-replica-two").resolve())
    )
    started = time.monotonic()
    start_server(two)
    print(f"replica two up in {time.monotonic() - started:.0f} s ({two.url('grpc_port')}); MPS shared: {plan.wanted}", flush=True)
    urls = [{"http": s.url(), "grpc": s.url("grpc_port")} for s in (one, two)]
    binary = loadgen.perf_analyzer_binary()
    texts = corpus.bench_texts(512)
    backends = {"x1": urls[0]["grpc"], "x2": f"{urls[0]['grpc']},{urls[1]['grpc']}"}
    gateways = [
        start_gateway(grpc, GATEWAY_PORTS[name], args.model, args.gateway_workers, args.out.parent / f"gateway-{name}.log")
        for name, grpc in backends.items()
    ]
    encoded = [t.encode() for t in texts]
    print(f"replica two warmed up: {direct_cell(urls[1:], args.model, encoded, 16, 3.0, binary)}", flush=True)

    def measure(name: str, clients: int) -> dict:
        if name.startswith("direct"):
            return direct_cell(urls[: 1 if name.endswith("x1") else 2], args.model, encoded, clients, args.seconds, binary)
        base = f"http://127.0.0.1:{GATEWAY_PORTS[name[-2:]]}/v1"
        return gateway_cell(pool, base, args.model, texts, clients, args.load_processes, args.seconds)

    rows = []
    try:
        with multiprocessing.get_context("fork").Pool(args.load_processes) as pool:
            for round_index in range(args.rounds):
                for clients in args.clients:
                    order = CELLS if round_index % 2 == 0 else CELLS[::-1]
                    row = {"round": round_index + 1, "clients": clients}
                    for name in order:
                        row[name] = measure(name, clients)
                        print(f"round {round_index + 1} c{clients} {name}: {row[name]}", flush=True)
                    rows.append(row)
    finally:
        for process in gateways:
            terminate(process.pid, None)
        stop_server(two)
    summary = {}
    for clients in args.clients:
        mine = [r for r in rows if r["clients"] == clients]
        summary[clients] = {
            "direct x2 / x1": [round(r["direct x2"]["texts_per_s"] / r["direct x1"]["texts_per_s"], 2) for r in mine],
            "gateway x2 / x1": [round(r["gateway x2"]["texts_per_s"] / r["gateway x1"]["texts_per_s"], 2) for r in mine],
        }
        summary[clients]["median gateway x2 / x1"] = statistics.median(summary[clients]["gateway x2 / x1"])
    result = {"note": NOTE, "model": args.model, "gateway_workers": args.gateway_workers, "load_processes": args.load_processes,
              "seconds": args.seconds, "rows": rows, "ratios": summary}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    header = "| round | clients | direct x1 | direct x2 | x2/x1 | gateway x1 | gateway x2 | x2/x1 |"
    lines = [f"# Two replicas vs one ({args.model}, single texts)", "", f"_{NOTE}._", "", header, "|---" * 8 + "|"]
    for r in rows:
        d1, d2, g1, g2 = (r[k]["texts_per_s"] for k in CELLS)
        lines.append(f"| {r['round']} | {r['clients']} | {d1:,.0f} | {d2:,.0f} | {d2 / d1:.2f} | {g1:,.0f} | {g2:,.0f} | {g2 / g1:.2f} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
