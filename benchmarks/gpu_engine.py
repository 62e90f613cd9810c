"""In-process GPU measurement of hf2triton's own serving engines (the code every model.py runs), with
random weights built from the real MiniLM and SmolLM2 configs (no hub on the GPU machine; speed does not
depend on weight values). Where does the time go: tokenisation vs forward pass, per batch size.

    python3 benchmarks/gpu_engine.py ASSETS_DIR OUT.json      # ASSETS_DIR: <model>/config.json + tokenizer files
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hf2triton.corpus import bench_texts  # noqa: E402
from hf2triton.serving.model import EmbeddingEngine, GenerationEngine  # noqa: E402


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
        print("minilm", batch, results[f"minilm_batch{batch}"], flush=True)
    generator = GenerationEngine(build(assets, "smollm2", True), device="cuda:0", dtype="float16", num_threads=8)
    prompts = corpus(64, 5, 20, seed=1)
    for batch in (1, 32):
        results[f"smollm2_batch{batch}"] = measure_generation(generator, prompts, batch)
        print("smollm2", batch, results[f"smollm2_batch{batch}"], flush=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
