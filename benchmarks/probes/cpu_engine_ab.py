"""Where the in-process time goes on this CPU, and what the engine changes bought (A/B in one run):
tokenizer __call__ vs the Rust encode_batch path, and length bucketing on/off, MiniLM, batch 32, the
project's 20-90-word corpus.

    .venv/bin/python benchmarks/probes/cpu_engine_ab.py [SAVED_MODEL_DIR]     # default .hf2triton/models/minilm/pretrained
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.serving.tasks.embedding import EmbeddingEngine  # noqa: E402


def rate(fn, texts: list[str], batch: int, rounds: int = 3) -> float:
    chunks = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    fn(chunks[0])
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for chunk in chunks:
            fn(chunk)
        best = max(best, len(chunks) * batch / (time.perf_counter() - started))
    return round(best, 1)


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / ".hf2triton" / "models" / "minilm" / "pretrained")
    texts = bench_texts(256)
    unbucketed = EmbeddingEngine(model, num_threads=2, min_bucket=10**6)
    bucketed = EmbeddingEngine(model, num_threads=2)
    tok = unbucketed.tokenizer
    results = {
        "tokenize_call_texts_per_s": rate(
            lambda c: tok(c, padding=True, truncation=True, max_length=unbucketed.max_length, return_tensors="pt"), texts, 32
        ),
        "tokenize_encode_batch_texts_per_s": rate(unbucketed.encode, texts, 32),
        "engine_unbucketed_texts_per_s": rate(unbucketed.run, texts, 32, rounds=2),
        "engine_bucketed_texts_per_s": rate(bucketed.run, texts, 32, rounds=2),
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
