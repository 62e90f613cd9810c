"""The torch generation engine in-process on a GPU (issue 25 #3), side by side in one run: the dynamic KV cache
(ContinuousBatcher, what served the GPU before), the preallocated slots eagerly, and the slots replaying CUDA
graphs -- the same prompts, N sequences decoded together, 128 tokens each (end-of-sequence ignored so every
row decodes the same number of steps), no Triton. Prints and writes tokens/s, ms per step and whether every
variant produced the same greedy tokens as the dynamic cache.

    python benchmarks/gpu/decode_probe.py MODEL_DIR OUT.json [--rows 1 32 64 128] [--tokens 128] [--dtype float16]
    python benchmarks/gpu/decode_probe.py MODEL_DIR OUT.json --guided [--rows 1 32] [--tokens 48]
    python benchmarks/gpu/decode_probe.py MODEL_DIR OUT.json --onnx ONNX_DIR [--rows 1 32 64]

--onnx (issue 46 #3): the same model's ONNX Runtime GenAI builder export (float16, the served backend onnx's) behind
the same batcher too: its preallocated slots eagerly and replaying ONNX Runtime's CUDA graphs per bucket.

--guided (issue 44: served on an H100, 32 JSON-constrained rows decoded at 0.53x the free ITL): the slots with CUDA
graphs, every row free and then every row constrained to benchmarks/structured_output.py's "person" schema, the
median milliseconds of the steps where all rows were running; then the served load's shape in-process (a closed
loop: each answer replaced by a new request as it ends, guided vs free answers of the same length, tokens/s), and
where a guided closed loop's host time goes (cProfile, by own time). A constrained row ends with its JSON; a free one runs all `--tokens`.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from generation_bench import PROMPTS  # the served load's prompts (this directory is on sys.path)
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf2triton.serving.batching.continuous import ContinuousBatcher
from hf2triton.serving.batching.onnx import OnnxSlotBatcher
from hf2triton.serving.batching.sequences import Guided, Sampling, Sequence
from hf2triton.serving.batching.slots import SlotBatcher

VARIANTS = {
    "dynamic cache (before)": lambda *a, **k: ContinuousBatcher(*a, **k),
    "slots, eager": lambda *a, **k: SlotBatcher(*a, cuda_graphs=False, **k),
    "slots, CUDA graphs": lambda *a, **k: SlotBatcher(*a, cuda_graphs=True, **k),
}


def _sync(batcher) -> None:
    """Wait for the GPU's queued work (nothing on the CPU: the tests)."""
    if batcher.device.startswith("cuda"):
        torch.cuda.synchronize()


def run(batcher, prompts: list[list[int]], tokens: int, guided: Guided | None = None, full_steps: list | None = None):
    """(seconds, steps, each row's tokens); `full_steps` collects the milliseconds of the steps that ran every row."""
    batcher.eos_ids = set()  # every free row decodes `tokens` steps (a guided one ends with its grammar)
    sequences = [Sequence(ids, Sampling(max_new_tokens=tokens, guided=guided), lambda text, finish: None) for ids in prompts]
    _sync(batcher)
    started, steps = time.perf_counter(), batcher.steps
    for sequence in sequences:
        batcher.submit(sequence)
    while not batcher.idle:
        before, rows = time.perf_counter(), len(batcher.running)
        batcher.step()
        if full_steps is not None and rows == len(prompts):
            full_steps.append(1000 * (time.perf_counter() - before))
    _sync(batcher)
    return time.perf_counter() - started, batcher.steps - steps, [s.generated for s in sequences]


def closed_loop(batcher, prompts: list[list[int]], total: int, tokens: int | list[int], guided: Guided | None) -> tuple[dict, list[int]]:
    """The served load's shape in-process: len(prompts) sequences in flight, each replaced by the next as it ends (a
    new one joins nearly every step when answers are short), `total` in all -> (tokens/s and ms per step, each
    answer's length)."""
    batcher.eos_ids = set()
    made: list[Sequence] = []

    def new(index: int) -> Sequence:
        limit = tokens[index % len(tokens)] if isinstance(tokens, list) else tokens  # a list: each answer's own length
        sequence = Sequence(prompts[index % len(prompts)], Sampling(max_new_tokens=limit, guided=guided), lambda text, finish: None)
        made.append(sequence)
        return sequence

    _sync(batcher)
    started, steps = time.perf_counter(), batcher.steps
    for index in range(len(prompts)):
        batcher.submit(new(index))
    while not batcher.idle or len(made) < total:
        while len(made) < total and len(batcher.running) + len(batcher.waiting) < len(prompts):
            batcher.submit(new(len(made)))
        batcher.step()
    _sync(batcher)
    seconds, lengths = time.perf_counter() - started, [len(s.generated) for s in made]
    figures = {
        "tokens_per_s": round(sum(lengths) / seconds, 1),
        "ms_per_step": round(1000 * seconds / max(batcher.steps - steps, 1), 3),
        "tokens_per_answer": round(sum(lengths) / len(made), 1),
    }
    return figures, lengths


def guided_cells(model, tokenizer, ids: list[list[int]], rows_list: list[int], tokens: int, device: str = "cuda:0") -> list[dict]:
    """Free vs JSON-constrained rows on the slots with CUDA graphs: the median step with every row running, and the
    top of a constrained run's profile."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from structured_output import SCHEMAS  # benchmarks/: the served bench's schemas

    schema = Guided("json_schema", SCHEMAS["person"])
    cells = []
    for rows in rows_list:
        prompts = [ids[i % len(ids)] for i in range(rows)]
        limits = {"max_sequences": max(rows_list), "max_queue": max(rows_list), "context": 2048}
        batcher = SlotBatcher(model, tokenizer, device, cuda_graphs=True, **limits)
        run(batcher, prompts, tokens)  # warm-up: the buckets' graphs, xgrammar's compiled schema
        run(batcher, prompts, tokens, schema)
        medians = {}
        for name, guided in (("free", None), ("guided", schema)):
            full: list[float] = []
            run(batcher, prompts, tokens, guided, full)
            medians[name] = round(statistics.median(full), 3) if full else None
        # closed loop, 3 answers per row: the guided answers' length is the free ones' (matched, as the served bench)
        churn: dict[str, dict] = {}
        churn["guided"], lengths = closed_loop(batcher, prompts, 3 * rows, tokens, schema)
        # answer by answer, so rows leave when the guided ones did
        churn["free"], _ = closed_loop(batcher, prompts, 3 * rows, [max(1, n) for n in lengths], None)
        profile = cProfile.Profile()
        profile.enable()
        closed_loop(batcher, prompts, 3 * rows, tokens, schema)
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
        cell = {
            "rows": rows,
            "ms_per_full_step_free": medians["free"],
            "ms_per_full_step_guided": medians["guided"],
            "free_over_guided": round(medians["free"] / medians["guided"], 3) if medians["free"] and medians["guided"] else None,
            "closed_loop_free": churn["free"],
            "closed_loop_guided": churn["guided"],
            "closed_loop_guided_over_free_tokens_per_s": round(churn["guided"]["tokens_per_s"] / churn["free"]["tokens_per_s"], 3),
        }
        print(json.dumps(cell), flush=True)
        print(text.getvalue(), flush=True)
        cells.append({**cell, "guided_profile": text.getvalue()})
        del batcher
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32, 64, 128])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--guided", action="store_true", help="free vs JSON-constrained rows (CUDA graphs), profiled")
    parser.add_argument("--onnx", metavar="ONNX_DIR", help="the model's builder export: ONNX Runtime's slots too")
    args = parser.parse_args()
    variants = dict(VARIANTS)
    if args.onnx:
        from hf2triton.serving.runtimes.onnxruntime import OrtDecoder

        decoder = OrtDecoder(args.onnx, 0, "cuda:0", cuda_graphs=True)
        variants["ONNX slots, eager"] = lambda _model, *a, **k: OnnxSlotBatcher(decoder, *a, graphs=False, **k)
        variants["ONNX slots, CUDA graphs"] = lambda _model, *a, **k: OnnxSlotBatcher(decoder, *a, graphs=decoder.graph_capable, **k)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=getattr(torch, args.dtype)).to("cuda:0").eval()
    templated = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in PROMPTS
    ]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in templated]
    results = guided_cells(model, tokenizer, ids, args.rows, args.tokens) if args.guided else []
    for rows in [] if args.guided else args.rows:
        prompts = [ids[i % len(ids)] for i in range(rows)]
        reference = None
        for name, build in variants.items():
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
