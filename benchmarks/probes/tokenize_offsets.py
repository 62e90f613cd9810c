"""Tokenising with and without character offsets, side by side (hf2triton's `Engine.tokenize` uses
`encode_batch_fast`, which skips them): ms per call for 1, 16 and 256 corpus texts, and whether the ids match.

    .venv/bin/python benchmarks/probes/tokenize_offsets.py [MODEL_DIR]      (default: the shipped MiniLM)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.serving.tasks.embedding import EmbeddingEngine  # noqa: E402


def ms_per_call(call, calls: int = 200) -> float:
    call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return 1000 * (time.perf_counter() - started) / calls


def main() -> int:
    if len(sys.argv) > 1:
        model_dir = sys.argv[1]
    else:
        from tests.helpers import minilm_dir

        model_dir = str(minilm_dir())
    fast = EmbeddingEngine(model_dir, num_threads=2).fast_tokenizer
    texts = bench_texts(512, max_words=90)
    for size in (1, 16, 256):
        chunk = texts[:size]
        same = [e.ids for e in fast.encode_batch(chunk)] == [e.ids for e in fast.encode_batch_fast(chunk)]
        with_offsets = ms_per_call(lambda c=chunk: fast.encode_batch(c))
        without = ms_per_call(lambda c=chunk: fast.encode_batch_fast(c))
        print(f"{size:>4} texts: encode_batch {with_offsets:.2f} ms, encode_batch_fast {without:.2f} ms "
              f"({with_offsets / without:.2f}x), same ids: {same}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
