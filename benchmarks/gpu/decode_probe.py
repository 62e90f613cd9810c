"""The torch generation engine in-process on a GPU (issue 25 #3), side by side in one run: the dynamic KV cache
(ContinuousBatcher, what served the GPU before), the preallocated slots eagerly, and the slots replaying CUDA
graphs -- the same prompts, N sequences decoded together, 128 tokens each (end-of-sequence ignored so every
row decodes the same number of steps), no Triton. Prints and writes tokens/s, ms per step and whether every
variant produced the same greedy tokens as the dynamic cache.

    python benchmarks/gpu/decode_probe.py MODEL_DIR OUT.json [--rows 1 32 64 128] [--tokens 128] [--dtype float16]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from generation_bench import PROMPTS  # the served load's prompts (this directory is on sys.path)
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf2triton.serving.batching.continuous import ContinuousBatcher
from hf2triton.serving.batching.sequences import Sampling, Sequence
from hf2triton.serving.batching.slots import SlotBatcher

VARIANTS = {
    "dynamic cache (before)": lambda *a, **k: ContinuousBatcher(*a, **k),
    "slots, eager": lambda *a, **k: SlotBatcher(*a, cuda_graphs=False, **k),
    "slots, CUDA graphs": lambda *a, **k: SlotBatcher(*a, cuda_graphs=True, **k),
}


def run(batcher, prompts: list[list[int]], tokens: int) -> tuple[float, int, list[list[int]]]:
    batcher.eos_ids = set()  # every row decodes `tokens` steps
    sequences = [Sequence(ids, Sampling(max_new_tokens=tokens), lambda text, finish: None) for ids in prompts]
    torch.cuda.synchronize()
    started, steps = time.perf_counter(), batcher.steps
    for sequence in sequences:
        batcher.submit(sequence)
    while not batcher.idle:
        batcher.step()
    torch.cuda.synchronize()
    return time.perf_counter() - started, batcher.steps - steps, [s.generated for s in sequences]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32, 64, 128])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=getattr(torch, args.dtype)).to("cuda:0").eval()
    templated = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in PROMPTS
    ]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in templated]
    results = []
    for rows in args.rows:
        prompts = [ids[i % len(ids)] for i in range(rows)]
        reference = None
        for name, build in VARIANTS.items():
            batcher = build(model, tokenizer, "cuda:0", max_sequences=max(args.rows), max_queue=max(args.rows), context=2048)
            run(batcher, prompts[:2], 8)  # warm-up (and the graphs of the small buckets)
            run(batcher, prompts, args.tokens)  # the buckets this load visits get captured
            seconds, steps, generated = run(batcher, prompts, args.tokens)
            reference = reference or generated
            same = sum(a == b for a, b in zip(generated, reference))
            cell = {
                "variant": name,
                "rows": rows,
                "tokens_per_s": round(rows * args.tokens / seconds, 1),
                "ms_per_step": round(1000 * seconds / steps, 3),
                "same_greedy_tokens_as_dynamic": f"{same}/{rows}",
            }
            results.append(cell)
            print(json.dumps(cell), flush=True)
            del batcher
            torch.cuda.empty_cache()
    meta = {
        "model_dir": args.model_dir,
        "dtype": args.dtype,
        "tokens": args.tokens,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    with open(args.out, "w") as handle:
        json.dump({"meta": meta, "cells": results}, handle, indent=1)


if __name__ == "__main__":
    main()
