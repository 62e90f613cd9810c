"""CUDA graphs vs eager, side by side in one run, in-process on the GPU: the engine every model.py runs, on a
saved encoder (the workflow's own MiniLM on the H200), at the batch sizes single-text traffic forms.

    python benchmarks/gpu/graphs_ab.py MODEL_DIR OUT.json [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.serving.tasks.embedding import EmbeddingEngine  # noqa: E402


def measure(engine: EmbeddingEngine, texts: list[str], batch: int, seconds: float) -> dict:
    chunks = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    for chunk in chunks[:3]:
        engine.run(chunk)  # warm-up (and the graphs' capture)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        engine.run(chunks[calls % len(chunks)])
        calls += 1
    elapsed = time.perf_counter() - started
    per_call_ms = round(1000 * elapsed / calls, 3)
    return {"batch": batch, "calls": calls, "texts_per_s": round(calls * batch / elapsed, 1), "ms_per_call": per_call_ms}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    texts = bench_texts(512, max_words=90)
    engines = {name: EmbeddingEngine(args.model_dir, device="cuda:0", cuda_graphs=name == "graphs") for name in ("eager", "graphs")}
    rows = []
    for batch in (1, 4, 16, 32, 64, 256):
        row = {"batch": batch}
        for rounds in range(2):  # alternate which goes first
            for name in ("eager", "graphs") if rounds == 0 else ("graphs", "eager"):
                row.setdefault(name, []).append(measure(engines[name], texts, batch, args.seconds))
        best = {name: max(r["texts_per_s"] for r in row[name]) for name in ("eager", "graphs")}
        row["graphs_vs_eager"] = round(best["graphs"] / best["eager"], 3)
        print(json.dumps({"batch": batch, **best, "ratio": row["graphs_vs_eager"]}), flush=True)
        rows.append(row)
    graphs = engines["graphs"].graphs
    result = {"model_dir": args.model_dir, "rows": rows, "graphs": sorted(map(list, graphs.graphs)), "capture_failed": graphs.failed}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
