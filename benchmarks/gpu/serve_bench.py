"""Served GPU measurement on the H200 with hf2triton's own code: random-weight MiniLM / SmolLM2 models built
from the real configs (no hub there; speed does not depend on weight values), rendered by hf2triton.pipeline.render,
served by the nvidia-pytriton tritonserver (KIND_GPU, float16), measured by hf2triton.perf.bench (in-process
yardstick + served cells) and hf2triton.perf.tune (instances x queue delay), reported by hf2triton.perf.report.
Snakemake is not installed there, so the rule functions are called directly.

    bash benchmarks/gpu/device.sh setup && /tmp/v/bin/python benchmarks/gpu/serve_bench.py ASSETS_DIR $OUT   (see benchmarks/h200/README.md)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hf2triton import host  # noqa: E402
from hf2triton.logs import setup_logging  # noqa: E402
from hf2triton.perf.bench import bench_served_model  # noqa: E402
from hf2triton.perf.report import bench_step  # noqa: E402
from hf2triton.perf.tune import tune_models  # noqa: E402
from hf2triton.pipeline.render import render_model  # noqa: E402
from hf2triton.specs import BenchSpec, GenerationSpec, ModelSpec, ServerSpec, TuneSpec, serving_values  # noqa: E402
from hf2triton.triton.process import ensure_server, stop_server  # noqa: E402
from hf2triton.triton.settings import Settings  # noqa: E402


class _SkipBench(Exception):
    pass


WORK = Path("/tmp/hf2triton-gpu-work")  # noqa: S108 - scratch space on the GPU machine


def build(assets: Path, name: str, causal: bool) -> str:
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    target = WORK / "models" / name / "pretrained"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(assets / name, target)
    torch.manual_seed(0)
    model = (AutoModelForCausalLM if causal else AutoModel).from_config(AutoConfig.from_pretrained(target))
    model.save_pretrained(target)
    return str(target)


def model_spec(name: str, task: str, max_batch_size: int, instances: int, delay_us: int, gpu: bool = True) -> ModelSpec:
    generation = GenerationSpec(max_new_tokens=64) if task == "text-generation" else None
    return ModelSpec(
        name=name, source="-", task=task, device="gpu" if gpu else "cpu", dtype="float16" if gpu else "float32",
        max_batch_size=max_batch_size, instances=instances, max_queue_delay_us=delay_us, generation=generation,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("assets", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--minilm-instances", type=int, default=4)
    parser.add_argument("--runs", nargs="*", help="model:tool pairs to measure (default minilm:auto smollm2:auto)")
    parser.add_argument("--both-tools", action="store_true", help="measure MiniLM with perf_analyzer and with tritonclient")
    parser.add_argument("--skip-tune", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="smoke-test the script on a CPU machine (tiny settings)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    setup_logging(str(args.out / "serve_bench.log"))
    started = time.perf_counter()
    pretrained = {"minilm": build(args.assets, "minilm", False), "smollm2": build(args.assets, "smollm2", True)}
    models = [
        model_spec("minilm", "feature-extraction", 256, args.minilm_instances, 1000, gpu=not args.cpu),
        model_spec("smollm2", "text-generation", 32, 1, 2000, gpu=not args.cpu),
    ]
    repository = WORK / "model_repository"
    for model in models:
        render_model(str(repository / model.name), serving_values(model, not args.cpu, host.cpu_count()), pretrained[model.name])
    ports = host.free_ports(3)
    server = ServerSpec(http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2], startup_timeout_s=600,
                        shm_default_byte_size=64 * 1024 * 1024)  # fmt: skip
    names = [m.name for m in models]
    settings = Settings.of(server, names, str(WORK), str(repository))
    levels = (1, 2) if args.cpu else (1, 4, 16, 64)
    bench = BenchSpec(concurrency=levels, protocols=("grpc",), seconds=args.seconds, warmup_s=1.0, max_requests=1_000_000,
                      max_new_tokens=32, tool="auto", inprocess_backends=False)  # fmt: skip
    results = []
    try:
        if args.skip_bench:
            raise _SkipBench
        ensure_server(settings)
        runs = [("minilm", "auto", levels), ("smollm2", "auto", levels[:3])]
        if args.both_tools:
            runs.insert(1, ("minilm", "tritonclient", levels))
        if args.runs:
            runs = [(s.split(":")[0], s.split(":")[1], levels) for s in args.runs]
        for name, tool, concurrency in runs:
            stem = name if tool == "auto" else f"{name}-{tool}"
            output = args.out / f"{stem}.json"
            bench_served_model(name, settings.urls, str(repository), replace(bench, tool=tool, concurrency=concurrency), str(output))
            results.append(str(output))
            print(f"{stem} done after {time.perf_counter() - started:.0f} s", flush=True)
    except _SkipBench:
        pass
    finally:
        stop_server(settings)
    if results:
        bench_step(results, str(args.out / "report.md"), str(args.out / "ratios.json"), str(args.out / "plots"))
    if not args.skip_tune:
        instances = (1, 2) if args.cpu else (1, 2, 4)
        tune = TuneSpec(models=("minilm",), max_batch_size=(256,), instances=instances, max_queue_delay_us=(0, 1000),
                        concurrency=16, request_texts=1, latency_budget_ms=50, seconds=args.seconds, max_requests=1_000_000)  # fmt: skip
        tune_models(
            [models[0]], {"minilm": {"pretrained": pretrained["minilm"]}}, server, tune, not args.cpu,
            str(args.out / "tune" / "overlay.yaml"), str(args.out / "tune" / "results.json"), str(args.out / "tune" / "report.md"),
            str(args.out / "tune" / "plots"),
        )  # fmt: skip
    (args.out / "environment.json").write_text(json.dumps(environment(), indent=2) + "\n")
    print(f"all done after {time.perf_counter() - started:.0f} s", flush=True)
    return 0


def environment() -> dict:
    import numpy
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    weights = "random, built from the real MiniLM / SmolLM2 configs"
    return {"gpu": gpu, "torch": torch.__version__, "transformers": transformers.__version__, "numpy": numpy.__version__,
            "cpus": host.cpu_count(), "weights": weights}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
