"""Where one call of the serving engine (the code every model.py runs) spends its time, per stage, at the batch
sizes serving forms -- on the CPU or a GPU, per backend, per tokenizer thread count. Each thread count runs in
its own process (the Rust tokenizer's pool is sized once per process, from RAYON_NUM_THREADS).

    .venv/bin/python benchmarks/probes/engine_stages.py MODEL_DIR OUT.json [--device cpu|cuda:0] [--threads 2]
        [--batch 1 16 32 256] [--backend python|onnx] [--onnx-dir DIR] [--seconds 2] [--min-bucket 8 2 8 2]

Stages, milliseconds per call (median over the calls of `--seconds`, steady state):
tokenize (Rust encode_batch), pad (length buckets + numpy padding), to_device (host arrays -> torch on the
device), forward (the model and pooling; CUDA graphs where the engine uses them; for ONNX the torch->numpy feeds
and the session), to_host (outputs -> numpy), and `engine` (one whole engine.run, as bench's yardstick measures).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _sync(engine) -> None:
    if engine.device.startswith("cuda"):
        engine.torch.cuda.synchronize()


def stages(engine, texts: list[str], batch: int, seconds: float) -> dict:
    from hf2triton.serving.tasks.base import length_buckets

    chunks = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    for chunk in chunks[:8]:
        engine.run(chunk)  # every bucket shape seen once (graphs captured, allocator warm)
    times: dict[str, list[float]] = {k: [] for k in ("tokenize", "pad", "to_device", "forward", "to_host", "engine")}
    started, cpu_started, calls = time.perf_counter(), time.process_time(), 0
    while time.perf_counter() - started < seconds or calls < 5:
        chunk = chunks[calls % len(chunks)]
        t0 = time.perf_counter()
        encodings = engine.fast_tokenizer.encode_batch(chunk)
        t1 = time.perf_counter()
        groups = [engine.pad_arrays([encodings[i] for i in g]) for g in length_buckets([len(e.ids) for e in encodings], engine.min_bucket)]
        t2 = time.perf_counter()
        on_device = [{k: engine.torch.from_numpy(v).to(engine.device) for k, v in arrays.items()} for arrays in groups]
        _sync(engine)
        t3 = time.perf_counter()
        outputs = [engine.tensors(batch_) for batch_ in on_device]
        _sync(engine)
        t4 = time.perf_counter()
        for out in outputs:
            for value in out.values():
                value.cpu().numpy()
        t5 = time.perf_counter()
        engine.run(chunk)
        t6 = time.perf_counter()
        for key, value in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
            times[key].append(value * 1000)
        calls += 1
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    engine_ms = statistics.median(times["engine"])
    return {
        "batch": batch,
        "calls": calls,
        "buckets_per_call": len(groups),
        "ms_per_call": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "engine_texts_per_s": round(batch / engine_ms * 1000, 1),
        # this process's CPU over the loop (each call computes its texts twice: staged, then engine.run)
        "cores_used": round(cpu / wall, 2),
        "texts_per_core_s": round(2 * batch * calls / cpu, 1),
    }


def child(args: argparse.Namespace, threads: int) -> dict:
    from hf2triton.perf.corpus import bench_texts
    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    options = {"cuda_graphs": True} if args.device.startswith("cuda") else {}
    if args.min_bucket:
        options["min_bucket"] = args.min_bucket[0]  # the child gets exactly one
    engine = EmbeddingEngine(
        args.model_dir, device=args.device, num_threads=threads, backend=args.backend, onnx_dir=args.onnx_dir, **options
    )
    texts = bench_texts(512, max_words=90)
    rows = [stages(engine, texts, b, args.seconds) for b in args.batch]
    return {"threads": threads, "min_bucket": engine.min_bucket, "device": args.device, "backend": args.backend, "rows": rows}


def child_argv(argv: list[str]) -> list[str]:
    """The parent's arguments without its --min-bucket list (each child gets one value)."""
    kept, skipping = [], False
    for arg in argv:
        if arg == "--min-bucket":
            skipping = True
        elif skipping and arg.isdigit():
            continue
        else:
            skipping = False
            kept.append(arg)
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 32, 256])
    parser.add_argument("--backend", default="python", choices=("python", "onnx"))
    parser.add_argument("--onnx-dir", default="")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument(
        "--min-bucket", type=int, nargs="+", default=[], help="smallest length bucket(s) to compare; repeat values for alternating rounds"
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args, args.child)))
        return 0
    results = []
    for threads, min_bucket in itertools.product(args.threads, args.min_bucket or [0]):
        env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
        if threads > 0:
            env["RAYON_NUM_THREADS"] = str(threads)
        command = [sys.executable, __file__, *child_argv(sys.argv[1:]), "--child", str(threads)]
        command += ["--min-bucket", str(min_bucket)] if min_bucket else []
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)  # noqa: S603 - this script
        result = json.loads(done.stdout.strip().splitlines()[-1])
        for row in result["rows"]:
            print(json.dumps({"threads": threads, "min_bucket": result["min_bucket"], **row}), flush=True)
        results.append(result)
    Path(args.out).write_text(json.dumps({"model_dir": args.model_dir, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
