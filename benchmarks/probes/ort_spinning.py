"""ONNX Runtime pool threads: sleeping vs spinning inside a Run (session.force_spinning_stop), in-process,
alternating rounds (issue 14). What model.py ships: encoders sleep, decoders spin inside a Run.

    .venv/bin/python benchmarks/backends.py        # builds benchmarks/.work/ (the exports measured here)
    .venv/bin/python benchmarks/probes/ort_spinning.py    # -> benchmarks/bench-2cpu/ort-spinning.json

SmolLM2 (gguf-blocks, the GenAI builder's graph): the bare decode step at batch 1 (median of 32 steps after a
40-token prompt, decoder_steps.py's loop). MiniLM ONNX int8 and fp32: the product's EmbeddingEngine at batch 32 and 4, texts/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from backends import corpus  # noqa: E402
from decoder_steps import decode_times  # noqa: E402

from hf2triton import host  # noqa: E402
from hf2triton.serving.runtimes import onnxruntime as served  # noqa: E402
from hf2triton.serving.tasks.embedding import EmbeddingEngine  # noqa: E402

VARIANTS = {"sleep": False, "spin inside a Run": True}


def decode_step_ms(onnx_dir: Path, spin: bool) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_dir / "model.onnx"), served.ort_session_options(host.cpu_count(), spin))
    return round(statistics.median(decode_times(session, 32)) * 1e3, 2)


def embedding_texts_per_s(models: Path, name: str, spin: bool, batch: int, texts: list[str], seconds: float) -> float:
    original = served.ort_session_options
    served.ort_session_options = lambda threads, spin_within_runs=False: original(threads, spin)
    try:
        engine = EmbeddingEngine(
            str(models / name / "pretrained"), num_threads=host.cpu_count(), backend="onnx", onnx_dir=str(models / name / "onnx")
        )
    finally:
        served.ort_session_options = original
    chunks = [texts[i : i + batch] for i in range(0, len(texts) - batch, batch)]
    for chunk in chunks[:3]:
        engine.run(chunk)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        engine.run(chunks[done // batch % len(chunks)])
        done += batch
    return round(done / (time.perf_counter() - started), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(ROOT / "benchmarks" / ".work"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "bench-2cpu" / "ort-spinning.json"))
    args = parser.parse_args()
    models = Path(args.work) / ".hf2triton" / "models"
    texts = [t.decode() for t in corpus(2048)]
    results: dict = {"cpus": host.cpu_count(), "rounds": args.rounds, "cells": {}}
    cells = [("smollm2_blocks decode step ms", lambda spin: decode_step_ms(models / "smollm2_blocks" / "onnx", spin))]
    for name in ("minilm_int8", "minilm_onnx"):
        for batch in (32, 4):
            cells.append(
                (
                    f"{name} batch {batch} texts/s",
                    lambda spin, name=name, batch=batch: embedding_texts_per_s(models, name, spin, batch, texts, args.seconds),
                )
            )
    for label, measure in cells:
        rounds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        for _ in range(args.rounds):
            for variant, spin in VARIANTS.items():
                rounds[variant].append(measure(spin))
        results["cells"][label] = rounds
        print(label, json.dumps(rounds), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
