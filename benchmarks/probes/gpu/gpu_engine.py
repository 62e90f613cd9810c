"""In-process GPU measurement of hf2triton's own serving engines (the code every model.py runs), with
random weights built from the real MiniLM and SmolLM2 configs (no hub on the GPU machine; speed does not
depend on weight values). Where does the time go: tokenisation vs forward pass, per batch size.

    python3 benchmarks/probes/gpu/gpu_engine.py ASSETS_DIR OUT.json      # ASSETS_DIR: <model>/config.json + tokenizer files
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from hf2triton.perf.corpus import bench_texts  # noqa: E402
from hf2triton.serving.tasks.embedding import EmbeddingEngine  # noqa: E402
from hf2triton.serving.tasks.generation import GenerationEngine  # noqa: E402


def corpus(count: int, low: int = 20, high: int = 90, seed: int = 0) -> list[str]:
    return bench_texts(count, low, high, seed)


def build(assets: Path, name: str, causal: bool) -> str:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    target = Path("/tmp/hf2triton-gpu") / name  # noqa: S108 - scratch space on the GPU machine
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(assets / name, target)
    config = AutoConfig.from_pretrained(target)
    torch.manual_seed(0)
    model = (AutoModelForCausalLM if causal else AutoModel).from_config(config)
    model.save_pretrained(target)
    return str(target)


def timed(fn, seconds: float = 3.0) -> tuple[int, float]:
    fn()
    torch.cuda.synchronize()
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        count += fn()
        torch.cuda.synchronize()
    return count, time.perf_counter() - started


def measure_embeddings(engine: EmbeddingEngine, texts: list[str], batch: int) -> dict[str, int]:
    """Sentences/s for the whole engine, for tokenisation alone and for the forward pass alone."""
    chunks = itertools.cycle([texts[i : i + batch] for i in range(0, 2048, batch)])
    encoded = itertools.cycle([engine.encode(next(chunks)) for _ in range(8)])

    def run_engine() -> int:
        chunk = next(chunks)
        engine.run(chunk)
        return len(chunk)

    def tokenize_only() -> int:
        chunk = next(chunks)
        engine.encode(chunk)
        return len(chunk)

    def tokenize_hf_call() -> int:  # what the engine did before: the tokenizer's __call__
        chunk = next(chunks)
        engine.tokenizer(chunk, padding=True, truncation=True, max_length=engine.max_length, return_tensors="pt")
        return len(chunk)

    def forward_only() -> int:
        inputs = next(encoded)
        with torch.inference_mode():
            engine.model(**inputs)
        return int(inputs["input_ids"].shape[0])

    figures = {}
    for label, fn in (
        ("engine", run_engine),
        ("tokenize_only", tokenize_only),
        ("tokenize_hf_call", tokenize_hf_call),
        ("forward_only", forward_only),
    ):
        count, seconds = timed(fn)
        figures[f"{label}_sentences_per_s"] = round(count / seconds)
    return figures


def stage_profile(engine: EmbeddingEngine, texts: list[str], batch: int, seconds: float = 3.0) -> dict[str, float]:
    """Where one engine.run goes, per text (µs), after every shape was seen once (steady state):
    Rust tokenisation, numpy padding, host->device copy, model forward, pooling + device->host copy."""
    chunks = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)][:64]
    for chunk in chunks:  # warm every shape
        engine.run(chunk)
    torch.cuda.synchronize()
    totals = dict.fromkeys(("tokenize", "pad", "to_device", "forward", "pool_and_copy"), 0.0)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for chunk in chunks:
            t0 = time.perf_counter()
            encodings = engine.fast_tokenizer.encode_batch(chunk)
            t1 = time.perf_counter()
            arrays = engine.pad_arrays(encodings)
            t2 = time.perf_counter()
            batch_on_device = {k: torch.from_numpy(v).to(engine.device) for k, v in arrays.items()}
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            with torch.inference_mode():
                engine.model(**batch_on_device)
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            engine.forward(batch_on_device)
            t5 = time.perf_counter()
            for key, value in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, (t5 - t4) - (t4 - t3))):
                totals[key] += value
            count += len(chunk)
    out = {f"{k}_us_per_text": round(v / count * 1e6, 1) for k, v in totals.items()}
    warm_started, warm_count = time.perf_counter(), 0
    while time.perf_counter() - warm_started < seconds:
        for chunk in chunks:
            engine.run(chunk)
            warm_count += len(chunk)
    out["engine_warm_sentences_per_s"] = round(warm_count / (time.perf_counter() - warm_started))
    return out


def measure_generation(generator: GenerationEngine, prompts: list[str], batch: int) -> dict[str, float]:
    def generate() -> int:
        result = generator.run(prompts[:batch], max_new_tokens=64)["text_output"]
        return sum(len(generator.tokenizer(x.decode(), add_special_tokens=False)["input_ids"]) for x in result)

    tokens, seconds = timed(generate, 6.0)
    return {"new_tokens_per_s": round(tokens / seconds, 1)}


def main() -> None:
    assets, out = Path(sys.argv[1]), Path(sys.argv[2])
    results: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "weights": "random, from the real configs"}
    texts = corpus(4096)
    engine = EmbeddingEngine(build(assets, "minilm", False), device="cuda:0", dtype="float16", num_threads=8)
    for batch in (1, 32, 256):
        results[f"minilm_batch{batch}"] = measure_embeddings(engine, texts, batch)
        results[f"minilm_batch{batch}"]["stages"] = stage_profile(engine, texts, batch)
        print("minilm", batch, results[f"minilm_batch{batch}"], flush=True)
    generator = GenerationEngine(build(assets, "smollm2", True), device="cuda:0", dtype="float16", num_threads=8)
    prompts = corpus(64, 5, 20, seed=1)
    for batch in (1, 32):
        results[f"smollm2_batch{batch}"] = measure_generation(generator, prompts, batch)
        print("smollm2", batch, results[f"smollm2_batch{batch}"], flush=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
