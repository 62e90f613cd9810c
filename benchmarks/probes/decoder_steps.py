"""Where a decoded token's time goes (issue 14): SmolLM2 per decode step and per prefill, torch vs the ONNX
exports, in-process on this machine, next to the memory-bandwidth floor of reading the weights once per step.

    .venv/bin/python benchmarks/backends.py          # builds benchmarks/.work/ (torch, onnx, gguf-blocks x 2 graphs)
    .venv/bin/python benchmarks/probes/decoder_steps.py     # -> benchmarks/generation-2cpu/decoder-steps.{json,md}

Per engine: the product's GenerationEngine.run (what a served static request runs) in tokens/s,
the bare forward per decode step (torch with its KV cache; ONNX Runtime feeding `present` back as `past`),
the prefill of a 40- and a 400-token prompt (ONNX sessions with the options model.py gives a decoder), the
weight bytes a step reads, and for the ONNX graphs the share of kernel time per operator type from ONNX
Runtime's profiler.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton import host  # noqa: E402

PROMPT = "Write a short poem about the sea."
ENGINES = {
    "torch": "smollm2_torch",
    "onnx float32": "smollm2_onnx",
    "onnx gguf-blocks": "smollm2_blocks",
    "onnx gguf-blocks, optimum's graph": "smollm2_blocks_optimum",
}


def bandwidth_gb_per_s(threads: int) -> float:
    """Read bandwidth: summing a 512 MB float32 array with torch on `threads` threads (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    data = torch.ones(128 * 1024 * 1024)
    data.sum()
    best = min(_timed(data.sum) for _ in range(5))
    return round(data.numel() * 4 / best / 1e9, 1)


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def engine_tokens_per_s(models: Path, name: str, threads: int) -> dict:
    from hf2triton.serving.tasks.generation import GenerationEngine

    onnx = models / name / "onnx"
    backend = {"backend": "onnx", "onnx_dir": str(onnx)} if onnx.is_dir() else {}
    engine = GenerationEngine(str(models / name / "pretrained"), num_threads=threads, **backend)
    engine.run([PROMPT], max_new_tokens=4)
    rates, text = [], ""
    for _ in range(3):
        started = time.perf_counter()
        text = engine.run([PROMPT], max_new_tokens=64)["text_output"][0].decode()
        tokens = len(engine.tokenizer(text, add_special_tokens=False)["input_ids"])
        rates.append(tokens / (time.perf_counter() - started))
    return {"generate_tokens_per_s": round(statistics.median(rates), 2), "text": text}


def torch_steps(model_dir: Path, threads: int, steps: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    if model.config.tie_word_embeddings:
        weight_bytes += model.get_input_embeddings().weight.nbytes  # read again as the LM head
    with torch.inference_mode():
        prefill = {}
        for length in (40, 400):
            ids = torch.ones((1, length), dtype=torch.long)
            model(input_ids=ids, use_cache=True)
            prefill[length] = min(_timed(lambda ids=ids: model(input_ids=ids, use_cache=True)) for _ in range(3))
        out = model(input_ids=torch.ones((1, 40), dtype=torch.long), use_cache=True)
        cache, times = out.past_key_values, []
        for _ in range(steps):
            started = time.perf_counter()
            out = model(input_ids=torch.ones((1, 1), dtype=torch.long), past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - started)
            cache = out.past_key_values
    return {
        "decode_step_ms": round(statistics.median(times) * 1e3, 2),
        "prefill_ms": {str(k): round(v * 1e3, 1) for k, v in prefill.items()},
        "weight_bytes_per_step": weight_bytes,
    }


def _onnx_feeds(session, length: int, past: dict | None) -> dict:
    total = length + (next(iter(past.values())).shape[2] if past else 0)
    arrays = {
        "input_ids": np.ones((1, length), np.int64),
        "attention_mask": np.ones((1, total), np.int64),
        "position_ids": np.arange(total - length, total)[None],  # optimum's graph; the GenAI builder's has none
    }
    feeds = {}
    for spec in session.get_inputs():
        if spec.name.startswith("past_key_values"):
            feeds[spec.name] = past[spec.name] if past else np.zeros((1, spec.shape[1], 0, spec.shape[3]), np.float32)
        else:
            feeds[spec.name] = arrays[spec.name]
    return feeds


def decode_times(session, steps: int) -> list[float]:
    """Seconds per decode step (batch 1, a 40-token prompt first), `present` fed back as `past`."""
    names = [o.name for o in session.get_outputs()]
    past, times = None, []
    for step in range(steps + 1):
        feeds = _onnx_feeds(session, 40 if past is None else 1, past)
        started = time.perf_counter()
        outputs = session.run(None, feeds)
        if step:
            times.append(time.perf_counter() - started)
        past = {n.replace("present", "past_key_values"): v for n, v in zip(names, outputs) if n.startswith("present")}
    return times


def onnx_steps(onnx_dir: Path, threads: int, steps: int) -> dict:
    import onnx
    import onnxruntime as ort

    from hf2triton.serving.runtimes.onnxruntime import ort_session_options

    path = str(onnx_dir / "model.onnx")
    session = ort.InferenceSession(path, ort_session_options(threads, spin_within_runs=True))
    times = decode_times(session, steps)
    prefill = {}
    for length in (40, 400):
        feeds = _onnx_feeds(session, length, None)
        session.run(None, feeds)
        prefill[str(length)] = round(min(_timed(lambda feeds=feeds: session.run(None, feeds)) for _ in range(3)) * 1e3, 1)
    graph = onnx.load(path, load_external_data=False).graph
    weights = {n.input[1] for n in graph.node if n.op_type in ("MatMul", "MatMulNBits")}
    weights |= {i for n in graph.node if n.op_type == "MatMulNBits" for i in n.input[2:]}
    weights |= {n.input[0] for n in graph.node if n.op_type == "Transpose"}  # a tied LM head, folded at load
    weight_bytes = sum(  # from the shapes: a weight may live in an external data file
        int(np.prod(i.dims)) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(i.data_type)).itemsize
        for i in graph.initializer
        if i.name in weights
    )
    options = ort_session_options(threads, spin_within_runs=True)
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as scratch:
        options.profile_file_prefix = str(Path(scratch) / "ort-profile")
        profiled = ort.InferenceSession(path, options)
        decode_times(profiled, 20)
        events = json.loads(Path(profiled.end_profiling()).read_text())
    kernel_us: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            kernel_us[event["args"]["op_name"]] += event["dur"]
            calls[event["args"]["op_name"]] += 1
    total = sum(kernel_us.values())
    runs = 21
    return {
        "decode_step_ms": round(statistics.median(times) * 1e3, 2),
        "prefill_ms": prefill,
        "weight_bytes_per_step": weight_bytes,
        "kernels_per_step": round(sum(calls.values()) / runs),
        "kernel_time_share": {op: round(us / total, 3) for op, us in kernel_us.most_common(8)},
        "kernel_calls_per_step": {op: round(calls[op] / runs) for op, _ in kernel_us.most_common(8)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(ROOT / "benchmarks" / ".work"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "generation-2cpu" / "decoder-steps"))
    args = parser.parse_args()
    models = Path(args.work) / ".hf2triton" / "models"
    threads = host.cpu_count()
    results: dict = {"cpus": threads, "bandwidth_gb_per_s": bandwidth_gb_per_s(threads), "engines": {}}
    for label, name in ENGINES.items():
        onnx = models / name / "onnx"
        steps = onnx_steps(onnx, threads, args.steps) if onnx.is_dir() else torch_steps(models / name / "pretrained", threads, args.steps)
        steps["bandwidth_floor_ms"] = round(steps["weight_bytes_per_step"] / (results["bandwidth_gb_per_s"] * 1e9) * 1e3, 1)
        steps.update(engine_tokens_per_s(models, name, threads))
        steps["generate_ms_per_token"] = round(1e3 / steps["generate_tokens_per_s"], 1)
        results["engines"][label] = steps
        print(label, json.dumps(steps), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    torch_rate = results["engines"]["torch"]["generate_tokens_per_s"]
    lines = [
        "# SmolLM2-135M per decoded token, in-process (issue 14)",
        "",
        f"`.venv/bin/python benchmarks/probes/decoder_steps.py` on {threads} CPU cores, after `benchmarks/backends.py` built the exports;"
        f" read bandwidth {results['bandwidth_gb_per_s']} GB/s (torch sum of 512 MB on {threads} threads). Nothing else was running.",
        "",
        "| engine | generate tokens/s (÷ torch) | ms per token in generate | bare decode step ms | weight MB read per step "
        "| bandwidth floor ms | prefill 40 / 400 tokens ms | ONNX kernels per step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in results["engines"].items():
        lines.append(
            f"| {label} | {r['generate_tokens_per_s']} ({r['generate_tokens_per_s'] / torch_rate:.2f}×) | {r['generate_ms_per_token']} "
            f"| {r['decode_step_ms']} | {r['weight_bytes_per_step'] / 1e6:.0f} | {r['bandwidth_floor_ms']} "
            f"| {r['prefill_ms']['40']} / {r['prefill_ms']['400']} | {r.get('kernels_per_step', '–')} |"
        )
    lines += ["", "Share of ONNX Runtime kernel time per operator type (profiler, 20 decode steps):", ""]
    for label, r in results["engines"].items():
        if "kernel_time_share" in r:
            shares = ", ".join(f"{op} {share:.0%} ({r['kernel_calls_per_step'][op]}/step)" for op, share in r["kernel_time_share"].items())
            lines.append(f"- {label}: {shares}")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
