"""What the OpenAI-compatible gateway costs against the served default models (`make serve` first, gateway on
openai.port), side by side with direct gRPC in one run — the same measurement `make bench` makes per model
(hf2triton.perf.gateway_cost), standalone so the cost can be re-measured without the rest of the bench.
The load generator shares this machine's cores with the server and the gateway.

    .venv/bin/python benchmarks/gateway_cost.py [--concurrency 1 4] [--rounds 2] [--requests-per-client 4] [--seconds 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hf2triton.config import load_project  # noqa: E402
from hf2triton.gateway.process import gateway_status  # noqa: E402
from hf2triton.perf import gateway_cost, loadgen  # noqa: E402
from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.triton.settings import Settings  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0, help="per embeddings cell")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    project = load_project(args.config)
    settings = Settings.of(project.server, project.names, project.work)
    status = gateway_status(settings, project.openai)
    if not status["healthy"]:
        raise SystemExit(f"no healthy gateway at {status['url']}: run `make serve` with openai.enabled first")
    key = os.environ.get(project.openai.api_key_env)
    target, urls = gateway_cost.GatewayTarget(status["url"], key, status["pid"]), settings.urls
    generator = next(m.name for m in project.models if m.is_generation)
    encoder = next(m.name for m in project.models if m.task == "feature-extraction")
    prompts = [t.encode() for t in bench_texts(64, max_words=40)]
    result: dict = {"generation": [], "embeddings": [], "note": "load generator on the same cores as the server and the gateway"}
    result["alone"] = {
        "generation": gateway_cost.idle_overhead(urls, target, generator, prompts[0], True),
        "embeddings": gateway_cost.idle_overhead(urls, target, encoder, b"a short sentence to embed", False),
    }
    print(json.dumps({k: v["added_p50_ms"] for k, v in result["alone"].items()}), flush=True)
    for clients in args.concurrency:
        plan = loadgen.generation_plan(prompts, (16, 32, 64, 128), clients * args.requests_per_client)
        row = gateway_cost.generation_cost(urls, target, generator, plan, clients, args.rounds)
        print(json.dumps({k: row[k] for k in ("concurrency", "tokens_per_s_ratio", "ttft_p50_added_ms")}), flush=True)
        result["generation"].append(row)
    texts = bench_texts(512, max_words=90)
    row = gateway_cost.embeddings_cost(urls, target, encoder, texts, 32, 4, args.seconds, args.rounds)
    print(json.dumps({k: row[k] for k in ("concurrency", "request_texts", "texts_per_s_ratio")}), flush=True)
    result["embeddings"].append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
