"""In-process A/B of issue 44's `n` samples sharing their prompt's prefill (the continuous batcher, no Triton): n sampled
sequences of one long prompt joining together (one prefill row, copied to n) against n sequences of prompts of the
same length that differ in their first token (n prefill rows: what every `n` request cost before), alternating
rounds. Reports the time until every sample has its first token (TTFT of the request) and the whole time with
max_new_tokens, medians over rounds, on the shipped SmolLM2-135M (saved as the workflow saves it).

    .venv/bin/python benchmarks/probes/shared_prefill.py [--n 8] [--prompt-words 600] [--max-new-tokens 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))

from continuous_batching import saved_model  # noqa: E402

from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.serving.batching.continuous import ContinuousBatcher  # noqa: E402
from hf2triton.serving.batching.sequences import Sampling, Sequence  # noqa: E402
from hf2triton.serving.tasks.generation import GenerationEngine  # noqa: E402


def run(engine: GenerationEngine, prompts: list[list[int]], max_new_tokens: int) -> tuple[float, float]:
    """(seconds until every sequence has its first token, seconds until all are done) for `prompts` joining together."""
    batcher = ContinuousBatcher(engine.model, engine.tokenizer, "cpu", len(prompts), len(prompts), engine.max_length)
    first: dict[int, float] = {}
    started = time.perf_counter()
    for index, ids in enumerate(prompts):
        sampling = Sampling(max_new_tokens=max_new_tokens, temperature=1.0, seed=index)

        def emit(text, finish, index=index):
            first.setdefault(index, time.perf_counter())

        batcher.submit(Sequence(list(ids), sampling, emit))
    while not batcher.idle:
        batcher.step()
    return max(first.values()) - started, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-words", type=int, default=600)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hf2triton-prefill-") as tmp:
        engine = GenerationEngine(saved_model(Path(tmp)), num_threads=0)
        words = " ".join(bench_texts(64, max_words=90)).split()[: args.prompt_words]
        prompt = engine.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
        shared = [prompt] * args.n
        distinct = [[(prompt[0] + i) % len(engine.tokenizer), *prompt[1:]] for i in range(args.n)]  # same length, n rows
        run(engine, shared[:2], 2)  # warm-up
        cells: dict[str, list[tuple[float, float]]] = {"shared": [], "distinct": []}
        for round_ in range(args.rounds):  # alternate which goes first
            for name in ("shared", "distinct") if round_ % 2 == 0 else ("distinct", "shared"):
                cells[name].append(run(engine, shared if name == "shared" else distinct, args.max_new_tokens))
                print(f"round {round_} {name}: first tokens {cells[name][-1][0]:.2f} s, all done {cells[name][-1][1]:.2f} s", flush=True)
    medians = {name: [round(statistics.median(c[k] for c in runs), 3) for k in (0, 1)] for name, runs in cells.items()}
    result = {
        "n": args.n,
        "prompt_tokens": len(prompt),
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "median_s": {name: {"first_tokens": m[0], "all_done": m[1]} for name, m in medians.items()},
        "ttft_distinct_over_shared": round(medians["distinct"][0] / medians["shared"][0], 2),
        "total_distinct_over_shared": round(medians["distinct"][1] / medians["shared"][1], 2),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
