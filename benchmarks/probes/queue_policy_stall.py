"""A Triton queue policy vs none, one client sending one text at a time (why `queue:` bounds are opt-in).

In Triton 2.51 any `dynamic_batching.default_queue_policy` field turns the batcher's prefetching off; a request
that arrives while the instance is still being released then waits out the batcher's 500 ms idle timeout.
Against the running server (`make serve`), the model is reloaded with the rendered config plus or minus a
policy (Triton's load-with-config override, admin key from the state file), alternating, and a sync gRPC
client measures per-request latency; the rendered config is reloaded at the end.

    make serve && .venv/bin/python benchmarks/probes/queue_policy_stall.py [--model minilm] [--rounds 2] [--seconds 12]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton.config import load_project  # noqa: E402
from hf2triton.triton import client as triton_client  # noqa: E402
from hf2triton.triton.settings import RESTRICTED_KEY_HEADER, Settings  # noqa: E402
from hf2triton.triton.state import read_state  # noqa: E402

POLICY = {"max_queue_size": 128, "default_timeout_microseconds": 60_000_000, "allow_timeout_override": True, "timeout_action": "REJECT"}


def load(http_url: str, key: str, model: str, config: dict) -> None:
    status, text = triton_client.http_post(
        f"{http_url}/v2/repository/models/{model}/load",
        headers={RESTRICTED_KEY_HEADER: key},
        body={"parameters": {"config": json.dumps(config)}},
        timeout=300,
    )
    if status != 200:
        raise SystemExit(f"reloading {model} failed: {status} {text[:300]}")


def latencies_ms(grpc_url: str, model: str, seconds: float) -> dict:
    import tritonclient.grpc as grpcclient

    client = triton_client.grpc_client(grpc_url)
    inputs = triton_client.build_inputs(grpcclient, [b"the model serves text quickly while many clients send requests"])
    client.infer(model, inputs)
    times, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds:
        begin = time.perf_counter()
        client.infer(model, inputs)
        times.append((time.perf_counter() - begin) * 1e3)
    values = np.array(times)
    return {
        "requests": len(values),
        "mean_ms": round(float(values.mean()), 1),
        **{f"p{q}_ms": round(float(np.percentile(values, q)), 1) for q in (50, 90, 99)},
        "max_ms": round(float(values.max()), 1),
        "over_200ms": int((values > 200).sum()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "bench-2cpu" / "queue-policy-stall.json"))
    args = parser.parse_args()
    project = load_project(args.config)
    settings = Settings.of(project.server, project.names, project.work)
    state = read_state(settings)
    if not state:
        raise SystemExit("no server of ours is running: `make serve` first")
    http_url, grpc_url = f"http://{settings.url('http_port')}", settings.url("grpc_port")
    status, text = triton_client.http_get(f"{http_url}/v2/models/{args.model}/config")
    if status != 200:
        raise SystemExit(f"{args.model}: {status} {text[:200]}")
    rendered = json.loads(text)
    without = copy.deepcopy(rendered)
    without.setdefault("dynamic_batching", {}).pop("default_queue_policy", None)
    with_policy = copy.deepcopy(without)
    with_policy["dynamic_batching"]["default_queue_policy"] = POLICY
    results: dict = {"model": args.model, "seconds_per_cell": args.seconds, "policy": POLICY, "cells": []}
    try:
        for round_ in range(args.rounds):
            for label, config in (("queue policy", with_policy), ("no queue policy", without)):
                load(http_url, state["admin_key"], args.model, config)
                cell = {"round": round_ + 1, "variant": label, **latencies_ms(grpc_url, args.model, args.seconds)}
                results["cells"].append(cell)
                print(json.dumps(cell), flush=True)
    finally:
        load(http_url, state["admin_key"], args.model, rendered)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
