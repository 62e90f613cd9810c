"""Single-text load against the served model, for comparing serving settings (queue delay, instances) side by
side in one call on the GPU machine: each variant is served by the workflow itself (`snakemake serve` with the
variant's overlay, only the changed model reloads), then measured with the bench's own load generator
(perf_analyzer where it runs). Triton's statistics give the texts per execution and where the time went.

    python benchmarks/gpu/single_text_probe.py --configfile A.yaml [B.yaml ...] --label NAME --out OUT.json
      [--model minilm] [--concurrency 16 64] [--protocols http grpc] [--seconds 4]
Results of several labels are appended to OUT.json (a list).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton.config import deep_merge, load_project, read_yaml  # noqa: E402
from hf2triton.perf import loadgen  # noqa: E402
from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.triton.settings import Settings  # noqa: E402
from hf2triton.triton.state import read_state  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--configfile", nargs="*", default=[])
    parser.add_argument("--label", required=True)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    overlay: dict = {}
    for path in args.configfile:
        overlay = deep_merge(overlay, read_yaml(Path(path)) or {})
    project = load_project(args.config, overlay)
    model = next(m for m in project.models if m.name == args.model)
    settings = Settings.of(project.server, project.names, project.work)
    urls = settings.urls
    texts = [t.encode() for t in bench_texts(512, max_words=90)]
    binary = loadgen.perf_analyzer_binary()
    cells = []
    for protocol in args.protocols:
        for concurrency in args.concurrency:
            load = loadgen.Load(protocol, urls, args.model, texts, 1, concurrency, args.seconds, 10_000_000)
            cell = loadgen.measure_perf_analyzer(load, binary) if binary else loadgen.measure_tritonclient(load)
            cells.append(cell.to_dict())
            print(f"{args.label}: {protocol} x{concurrency} {cell.items_per_s:.0f} texts/s, server {cell.server}", flush=True)
    entry = {
        "label": args.label,
        "configfiles": args.configfile,
        "instances": model.instances,
        "max_batch_size": model.max_batch_size,
        "max_queue_delay_us": model.max_queue_delay_us,
        "cuda_mps": (read_state(settings) or {}).get("cuda_mps"),
        "tool": "perf_analyzer" if binary else "tritonclient",
        "cells": cells,
    }
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.is_file() else []
    out.write_text(json.dumps([*previous, entry], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
