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
import contextlib
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

from hf2triton.config import load_project
from hf2triton.errors import UserError
from hf2triton.gateway.backend import CHANNEL_ARGS, grpc_target
from hf2triton.perf import corpus, loadgen
from hf2triton.perf.gateway_cost import GatewayTarget, _gateway_embeddings
from hf2triton.triton import client
from hf2triton.triton.cleanup import terminate
from hf2triton.triton.process import mps_plan, start_server
from hf2triton.triton.settings import Settings

CELLS = ("direct x1", "direct x2", "grpc x1", "grpc x2", "gateway x1", "gateway x2")
KINDS = ("direct", "grpc", "gateway")
GATEWAY_PORTS = {"x1": 9101, "x2": 9102}
NOTE = "load generators on the same 16 cores as both servers and the gateway: they compete with them"


def cores(text: str) -> set[int]:
    """`0-11,24` -> {0, ..., 11, 24}."""
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


@contextlib.contextmanager
def pinned(wanted: set[int]):
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, wanted)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def visible_gpus(devices: str):
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def ratio(row: dict, kind: str) -> float:
    return round(row[f"{kind} x2"]["texts_per_s"] / row[f"{kind} x1"]["texts_per_s"], 2)


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


def split(clients: int, parts: int) -> list[int]:
    """`clients` spread over `parts` load generators, as evenly as whole clients go."""
    return [clients // parts + (1 if k < clients % parts else 0) for k in range(parts)]


def _grpc_worker(args: tuple[str, str, list[str], int, float]) -> tuple[int, int, float]:
    """tritonclient's asyncio gRPC client on the one channel the gateway would use (its target and round_robin)."""
    import tritonclient.grpc.aio as aio

    grpc, model, texts, clients, seconds = args
    target, extra = grpc_target(grpc)

    async def run():
        triton = client.keyed(aio.InferenceServerClient(target, channel_args=CHANNEL_ARGS + extra))
        try:
            requests = loadgen.build_requests("grpc", [t.encode() for t in texts], 1)
            return await loadgen._closed_loop(triton, model, requests, clients, seconds, 10**9, None)
        finally:
            await triton.close()

    latencies, errors, _, elapsed = asyncio.run(run())
    return len(latencies), len(errors), elapsed


def pooled_cell(pool, worker, address: str, model: str, texts: list[str], clients: int, processes: int, seconds: float) -> dict:
    """`processes` load processes (their clients summed to `clients`), 2 s warm-up, then `seconds` measured."""
    shares = split(clients, processes)
    jobs = [(address, model, texts[k::processes], share, seconds) for k, share in enumerate(shares) if share]
    pool.map(worker, [(b, m, t, c, 2.0) for b, m, t, c, _ in jobs])  # warm-up
    results = pool.map(worker, jobs)
    done, errors = sum(r[0] for r in results), sum(r[1] for r in results)
    elapsed = max(r[2] for r in results)
    return {"texts_per_s": round(done / elapsed, 1), "requests": done, "errors": errors, "seconds": round(elapsed, 2)}


def steady(load: loadgen.Load, binary: str) -> loadgen.Cell:
    """perf_analyzer's cell; when it finds no stable window (pinned cores, two at once) the asyncio client's."""
    try:
        return loadgen.measure_perf_analyzer(load, binary)
    except UserError as err:
        print(f"perf_analyzer: {str(err)[:120]}; this cell by tritonclient", flush=True)
        return loadgen.measure_tritonclient(load)


def direct_cell(urls: list[dict[str, str]], model: str, texts: list[bytes], clients: int, seconds: float, binary: str | None) -> dict:
    loads = [loadgen.Load("grpc", u, model, texts, 1, share, seconds, 10**7) for u, share in zip(urls, split(clients, len(urls)))]
    with ThreadPoolExecutor(len(loads)) as threads:  # perf_analyzer where it runs (glibc >= 2.38), else tritonclient
        measure = (lambda load: steady(load, binary)) if binary else loadgen.measure_tritonclient
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
    parser.add_argument("--two-gpu", default="", help="CUDA_VISIBLE_DEVICES of replica two (another GPU: another machine's)")
    parser.add_argument("--two-cpus", default="", help="cores of replica two, e.g. 12-23 (replica one: taskset at serve)")
    parser.add_argument("--client-cpus", default="", help="cores of the load generators and gateways, e.g. 24-31")
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
    started, everywhere = time.monotonic(), os.sched_getaffinity(0)
    with pinned(cores(args.two_cpus) or everywhere), visible_gpus(args.two_gpu):  # its processes inherit both
        state = start_server(two)
    os.sched_setaffinity(0, cores(args.client_cpus) or everywhere)  # the load generators and gateways
    print(f"replica two up in {time.monotonic() - started:.0f} s ({two.url('grpc_port')}); MPS shared: {plan.wanted}", flush=True)
    urls = [{"http": s.url(), "grpc": s.url("grpc_port")} for s in (one, two)]
    binary = loadgen.perf_analyzer_binary()
    texts = corpus.bench_texts(512)
    encoded = [t.encode() for t in texts]

    def measure(name: str, clients: int) -> dict:
        if name.startswith("direct"):
            return direct_cell(urls[: 1 if name.endswith("x1") else 2], args.model, encoded, clients, args.seconds, binary)
        if name.startswith("grpc"):
            return pooled_cell(pool, _grpc_worker, backends[name[-2:]], args.model, texts, clients, args.load_processes, args.seconds)
        base = f"http://127.0.0.1:{GATEWAY_PORTS[name[-2:]]}/v1"
        return pooled_cell(pool, _gateway_worker, base, args.model, texts, clients, args.load_processes, args.seconds)

    rows = []
    backends = {"x1": urls[0]["grpc"], "x2": f"{urls[0]['grpc']},{urls[1]['grpc']}"}
    gateways: list[subprocess.Popen] = []
    try:
        for name, grpc in backends.items():
            gateways.append(
                start_gateway(grpc, GATEWAY_PORTS[name], args.model, args.gateway_workers, args.out.parent / f"gateway-{name}.log")
            )
        print(f"replica two warmed up: {direct_cell(urls[1:], args.model, encoded, 16, 3.0, binary)}", flush=True)
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
        terminate(state["pid"], state.get("cmdline"))  # stop_server would stop replica one too (same repository)
    summary = {}
    for clients in args.clients:
        mine = [r for r in rows if r["clients"] == clients]
        summary[clients] = {f"{kind} x2 / x1": [ratio(r, kind) for r in mine] for kind in KINDS}
        summary[clients].update({f"median {kind}": statistics.median(summary[clients][f"{kind} x2 / x1"]) for kind in KINDS})
    settings = ("two_gpu", "two_cpus", "client_cpus", "gateway_workers", "load_processes", "seconds")
    note = NOTE
    if args.client_cpus:
        note = (
            f"replica one on the cores serve was started with (taskset), replica two on cores {args.two_cpus or 'all'}, the load "
            f"generators and gateways on cores {args.client_cpus}: the generators compete with the gateways, not the replicas"
        )
    result = {"note": note, "model": args.model, **{k: getattr(args, k) for k in settings}, "rows": rows, "ratios": summary}
    args.out.write_text(json.dumps(result, indent=1))
    header = "| round | clients | " + " | ".join(f"{kind} x1 | {kind} x2 | x2/x1" for kind in KINDS) + " |"
    lines = [f"# Two replicas vs one ({args.model}, single texts)", "", f"_{note}._", "", header, "|---" * (2 + 3 * len(KINDS)) + "|"]
    for r in rows:
        cells = [f"{r[f'{kind} x1']['texts_per_s']:,.0f} | {r[f'{kind} x2']['texts_per_s']:,.0f} | {ratio(r, kind)}" for kind in KINDS]
        lines.append(f"| {r['round']} | {r['clients']} | " + " | ".join(cells) + " |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
