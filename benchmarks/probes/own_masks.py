"""Probe: the torch batcher's own 4-D attention mask (continuous.causal_mask) vs transformers' builder (a vmap over its
mask functions), in-process, side by side in alternating rounds -- what a served step saves.

    .venv/bin/python benchmarks/probes/own_masks.py [--rows 1 8] [--tokens 32] [--rounds 3] [--out FILE.json]
    python benchmarks/probes/own_masks.py --device cuda:0 --dtype float16 --model DIR   # a GPU host

SmolLM2 (the shipped GGUF's weights; or --model, a saved checkpoint) on the ContinuousBatcher: ROWS prompts decoded
together, TOKENS greedy tokens each (end of sequence ignored), then prefills alone (8 prompts joining one by one).
Prints and writes tokens/s, ms per decoding step and per prefill for each, the ratio, and whether both decoded the
same tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf2triton.serving.batching.continuous import ContinuousBatcher  # noqa: E402
from hf2triton.serving.batching.sequences import Sampling, Sequence  # noqa: E402

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "Explain what a KV cache is.", "1, 2, 3, 4,"]


def decode(batcher, prompts: list[list[int]], tokens: int) -> tuple[float, int, list[list[int]]]:
    """(seconds, steps, tokens) of `prompts` decoded together."""
    sequences = [Sequence(ids, Sampling(max_new_tokens=tokens), lambda text, finish: None) for ids in prompts]
    started, steps = time.perf_counter(), batcher.steps
    for sequence in sequences:
        batcher.submit(sequence)
    while not batcher.idle:
        batcher.step()
    return time.perf_counter() - started, batcher.steps - steps, [s.generated for s in sequences]


def prefill_ms(batcher, prompts: list[list[int]]) -> float:
    """Milliseconds per prefill: each prompt alone, one new token (a prefill and nothing else)."""
    started = time.perf_counter()
    for ids in prompts:
        decode(batcher, [ids], 1)
    return 1000 * (time.perf_counter() - started) / len(prompts)


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--model", help="a saved checkpoint (default: SmolLM2 from the shipped GGUF)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.model:
        source, extra = args.model, {}
    else:
        from tests.helpers import smollm2_gguf

        source, extra = str(smollm2_gguf().parent), {"gguf_file": smollm2_gguf().name}
    tokenizer = AutoTokenizer.from_pretrained(source, **extra)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, args.dtype), **extra).to(args.device).eval()
    batcher = ContinuousBatcher(model, tokenizer, args.device, max_sequences=max(args.rows), max_queue=64, context=2048)
    batcher.eos_ids = set()  # every row decodes all its tokens
    assert batcher.own_masks, "this model keeps transformers' masks: nothing to compare"
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    cells = []
    for rows in args.rows:
        prompts = [ids[i % len(ids)] for i in range(rows)]
        found: dict[bool, list[dict]] = {True: [], False: []}
        generated: dict[bool, list] = {}
        for round_ in range(args.rounds):
            for own in (True, False) if round_ % 2 == 0 else (False, True):
                batcher.own_masks = own
                decode(batcher, prompts[:1], 2)  # warm-up
                seconds, steps, generated[own] = decode(batcher, prompts, args.tokens)
                found[own].append(
                    {
                        "tokens_per_s": rows * args.tokens / seconds,
                        "ms_per_step": 1000 * seconds / steps,
                        "ms_per_prefill": prefill_ms(batcher, (ids * 2)[:8]),
                    }
                )
        cell = {"rows": rows, "same_tokens": generated[True] == generated[False]}
        for own, name in ((True, "own"), (False, "transformers")):
            for key in ("tokens_per_s", "ms_per_step", "ms_per_prefill"):
                cell[f"{name}_{key}"] = round(statistics.median(r[key] for r in found[own]), 3)
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(found[True], found[False])]
        cell["own_over_transformers_tokens_per_s"] = [round(r, 3) for r in ratios]
        print(json.dumps(cell), flush=True)
        cells.append(cell)
    if args.out:
        meta = {
            "model": source,
            "device": args.device,
            "dtype": args.dtype,
            "tokens": args.tokens,
            "torch_threads": torch.get_num_threads(),
        }
        Path(args.out).write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
