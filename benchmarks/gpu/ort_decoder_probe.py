"""ONNX Runtime's decoder loop (`hf2triton.serving.runtimes.onnxruntime.OrtDecoder`) in-process on a GPU (issue 29 #4), side by side
in one process, rounds interleaved: the present key/values bound to the device (I/O binding, the served default
since 2026-12-04) vs a plain Run (every output, the whole KV cache included, copied to the host and back each
token: the served path until then). Same session, same prompts (the served load's chat prompts), N rows decoded
together, end-of-sequence ignored so every row decodes --tokens steps. Prints and writes tokens/s, ms per step
and whether both variants produced the same greedy tokens.

    python benchmarks/gpu/ort_decoder_probe.py ONNX_DIR TOKENIZER_DIR OUT.json [--rows 1 32] [--tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from generation_bench import PROMPTS  # the served load's prompts (this directory is on sys.path)
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf2triton.serving.runtimes.onnxruntime import OrtDecoder, cuda_device_id  # noqa: E402


def left_padded(tokenizer, rows: int) -> tuple[np.ndarray, np.ndarray]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(rows)]
    if tokenizer.chat_template:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in prompts
        ]
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="np")
    return batch["input_ids"], batch["attention_mask"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx_dir")
    parser.add_argument("tokenizer_dir")
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    decoder = OrtDecoder(args.onnx_dir, 0, args.device)
    decoder.eos = np.array([], dtype=np.int64)  # every row decodes --tokens steps
    variants = {"device-bound KV (I/O binding)": cuda_device_id(args.device), "plain Run (KV via the host)": None}
    cells = []
    for rows in args.rows:
        ids, mask = left_padded(tokenizer, rows)
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        generated: dict[str, np.ndarray] = {}
        for name, device_id in variants.items():  # warm-up: allocator, cuDNN/cuBLAS choices
            decoder.device_id = device_id
            generated[name] = decoder.generate(ids, mask, args.tokens, tokenizer.pad_token_id)
        for _ in range(args.rounds):
            for name, device_id in variants.items():
                decoder.device_id = device_id
                started = time.perf_counter()
                decoder.generate(ids, mask, args.tokens, tokenizer.pad_token_id)
                seconds[name].append(time.perf_counter() - started)
        reference = next(iter(generated.values()))
        for name, runs in seconds.items():
            median = statistics.median(runs)
            cell = {
                "variant": name,
                "rows": rows,
                "tokens_per_s": round(rows * args.tokens / median, 1),
                "ms_per_step": round(1000 * median / args.tokens, 3),
                "rounds_s": [round(s, 4) for s in runs],
                "same_greedy_tokens": f"{int((generated[name] == reference).all(axis=1).sum())}/{rows}",
            }
            cells.append(cell)
            print(json.dumps(cell), flush=True)
        bound, plain = (statistics.median(seconds[name]) for name in variants)
        print(f"rows {rows}: device-bound / plain = {plain / bound:.2f}x tokens/s", flush=True)
    import onnxruntime as ort

    meta = {"onnx_dir": args.onnx_dir, "tokens": args.tokens, "rounds": args.rounds, "device": args.device, "onnxruntime": ort.__version__}
    Path(args.out).write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))


if __name__ == "__main__":
    main()
