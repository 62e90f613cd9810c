"""Big requests on CUDA graphs, in-process on the GPU (issue 29's 256-text goal): what cutting a request's length
buckets into graph-sized chunks (`hf2triton.serving.runtimes.graphs.graph_chunks`, the served default since 2026-12-03) gains
over running each big bucket eagerly, for torch float16 and ONNX Runtime's CUDA provider (float16 export), side by
side in one process, rounds interleaved. Also the host floor: the Rust tokeniser alone on the same texts.

    python benchmarks/gpu/big_batch_probe.py MODEL_DIR OUT.json [--seconds 1.5] [--rounds 3] [--batch 64 256] [--device cuda:0]

Each call tokenises different texts (the 512-text corpus the bench uses, in turn), as served requests do.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.pipeline.export import export_onnx_step  # noqa: E402
from hf2triton.serving.tasks.embedding import EmbeddingEngine  # noqa: E402


def texts_per_s(call, requests: list[list[str]], seconds: float) -> float:
    """Texts per second of `call(texts)` over `requests` in turn (after one pass over all of them)."""
    for texts in requests:
        call(texts)
    done, started = 0, time.perf_counter()
    for texts in itertools.cycle(requests):
        call(texts)
        done += len(texts)
        if time.perf_counter() - started >= seconds:
            break
    return done / (time.perf_counter() - started)


def whole_buckets(engine: EmbeddingEngine) -> EmbeddingEngine:
    """The same engine with each length bucket run as one pass (the engine before graph_chunks: big buckets eager)."""
    if engine.graphs is not None:  # None: no GPU (a dry run of this script on the CPU)
        engine.graphs.chunks = lambda bucket, lengths: [bucket]
    return engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--device", default="cuda:0", help="cpu: a dry run of the script (no graphs there)")
    args = parser.parse_args()
    corpus = bench_texts(512, max_words=90)
    onnx_dir = Path(tempfile.mkdtemp(prefix="big-batch-")) / "onnx"
    precision = "float16" if args.device.startswith("cuda") else "float32"
    export_onnx_step(args.model_dir, "feature-extraction", 17, "auto", "O2", "none", str(onnx_dir), precision)

    def engine(backend: str, graphs: bool) -> EmbeddingEngine:
        onnx = {"backend": "onnx", "onnx_dir": str(onnx_dir)} if backend == "onnx" else {}
        return EmbeddingEngine(args.model_dir, device=args.device, num_threads=2, cuda_graphs=graphs, **onnx)

    engines = {
        "torch eager": engine("python", False),
        "torch graphs, whole buckets": whole_buckets(engine("python", True)),
        "torch graphs, graph-sized chunks": engine("python", True),
        "onnxruntime eager": engine("onnx", False),
        "onnxruntime graphs, whole buckets": whole_buckets(engine("onnx", True)),
        "onnxruntime graphs, graph-sized chunks": engine("onnx", True),
    }
    tokenizer = engines["torch eager"]
    report: dict = {"model_dir": args.model_dir, "seconds": args.seconds, "rounds": args.rounds, "texts_per_s": {}, "ratios": {}}
    for batch in args.batch:
        requests = [corpus[i : i + batch] for i in range(0, len(corpus) - batch + 1, batch)]
        runs: dict[str, list[float]] = {label: [] for label in [*engines, "tokenise only"]}
        for _ in range(args.rounds):  # interleaved: each round measures every engine once
            for label, measured in engines.items():
                runs[label].append(texts_per_s(measured.run, requests, args.seconds))
            runs["tokenise only"].append(texts_per_s(tokenizer.tokenize, requests, args.seconds))
        cell = {label: {"median": round(statistics.median(v)), "runs": [round(x) for x in v]} for label, v in runs.items()}
        report["texts_per_s"][batch] = cell
        med = {label: value["median"] for label, value in cell.items()}
        torch_chunks, torch_whole = med["torch graphs, graph-sized chunks"], med["torch graphs, whole buckets"]
        ort_chunks, ort_whole = med["onnxruntime graphs, graph-sized chunks"], med["onnxruntime graphs, whole buckets"]
        report["ratios"][batch] = {
            "torch: chunks / whole buckets": round(torch_chunks / torch_whole, 3),
            "onnxruntime: chunks / whole buckets": round(ort_chunks / ort_whole, 3),
            "onnxruntime / torch, chunks": round(ort_chunks / torch_chunks, 3),
            "onnxruntime / torch, whole buckets": round(ort_whole / torch_whole, 3),
        }
        print(batch, json.dumps(med), json.dumps(report["ratios"][batch]), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
