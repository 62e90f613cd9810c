"""`snakemake bench`: how fast each served model is, next to the same saved model run in-process.

Per model (results/bench/<model>.json):
- raw: the project's own in-process engine (the code model.py runs) on the served device, at batch 1 and
  max_batch_size, for every backend the model has artifacts for -> the yardstick and per-backend speedups;
- served: throughput and latency percentiles over HTTP and gRPC for requests of 1 text and of
  max_batch_size texts at each configured concurrency (hf2triton.perf.loadgen), with Triton's server-side
  breakdown per cell and the metrics endpoint's counters over the whole run;
- ratios: served / raw at max_batch_size, single-text requests at the highest concurrency / raw at
  max_batch_size, backend speedups.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json
from hf2triton.gateway.process import exposure, require_api_key
from hf2triton.perf import gateway_cost, loadgen
from hf2triton.perf.corpus import bench_texts
from hf2triton.perf.gateway_cost import GatewayTarget
from hf2triton.perf.guidellm import guidellm_sweep
from hf2triton.perf.pipelines import (
    PIPELINE_BATCHES,
    PIPELINE_TASKS,
    TaskLoad,
    pipeline_generation,
    pipeline_ratios,
    pipeline_throughput,
    task_load,
)
from hf2triton.perf.scratch import scratch_server
from hf2triton.pipeline.serve import settings_from_params
from hf2triton.serving import interface
from hf2triton.serving.interface import FEATURE_EXTRACTION, GENERATIVE_TASKS, NON_TEXT_TASKS, ModelParameters
from hf2triton.specs import BenchSpec, ModelSpec, OpenAISpec, from_param, with_variant
from hf2triton.triton import client
from hf2triton.triton.modelconfig import model_parameters, read_model_config, uses_gpu
from hf2triton.triton.process import ensure_server

log = logging.getLogger(__name__)

RAW_MIN_SECONDS = 3.0  # an in-process cell runs at least this long ...
RAW_MIN_CALLS = 10  # ... and at least this many calls, so one slow call on a shared machine decides nothing
RAW_WARMUP = (8, 2.0)  # up to this many calls / seconds first: every length-bucket shape seen (CUDA graphs captured)
PLAUSIBLE_SERVED_RATIO = 1.15  # served faster than the engine it runs by more than this: a measurement fault


def available_backends(params: ModelParameters, all_backends: bool) -> list[str]:
    """The served backend first, then the others whose artifacts exist (for per-backend speedups)."""
    served = params.backend
    if not all_backends:
        return [served]
    found = ["python"]
    if params.onnx_dir and any(Path(params.onnx_dir).glob("*.onnx")):
        found.append("onnx")
    if params.trt_engine and Path(params.trt_engine).is_file():
        found.append("tensorrt")
    return [served, *[b for b in found if b != served]]


def token_counter(tokenizer):
    def count(outputs: list[bytes]) -> int:
        return sum(len(ids) for ids in tokenizer([o.decode("utf-8", "replace") for o in outputs], add_special_tokens=False)["input_ids"])

    return count


def raw_throughput(engine, texts: list[str], batch: int, seconds: float, options: dict[str, Any], count_tokens=None) -> dict[str, float]:
    """Closed loop over the corpus in batches of `batch`, in this process: items/s and per-call latency."""
    chunks = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)] or [texts[:batch]]
    warmup_calls, warmup_s = RAW_WARMUP
    warm_started = time.perf_counter()
    for chunk in chunks[:warmup_calls]:  # lazy init, allocator, and on a GPU one graph capture per new shape
        engine.run(chunk, **options)
        if time.perf_counter() - warm_started > warmup_s:
            break
    calls, items, started, latencies = 0, 0, time.perf_counter(), []
    while calls < RAW_MIN_CALLS or time.perf_counter() - started < max(seconds, RAW_MIN_SECONDS):
        chunk = chunks[calls % len(chunks)]
        call_started = time.perf_counter()
        out = engine.run(chunk, **options)
        latencies.append(time.perf_counter() - call_started)
        items += count_tokens(list(out[interface.TEXT_OUTPUT])) if count_tokens else len(chunk)
        calls += 1
    elapsed = time.perf_counter() - started
    return {"batch": batch, "calls": calls, "items_per_s": round(items / elapsed, 2), "latency_ms": loadgen.percentiles(latencies)}


def measure_raw(
    config, texts: list[str], sizes: list[int], seconds: float, backends: list[str], max_new_tokens: int, task_options: dict | None = None
) -> dict:
    from hf2triton.pipeline.references import reference_device
    from hf2triton.serving.tasks import engine_from_parameters

    params = model_parameters(config)
    device = reference_device(config)
    options = {interface.MAX_NEW_TOKENS: max_new_tokens} if params.task in GENERATIVE_TASKS else dict(task_options or {})
    raw: dict[str, Any] = {"device": device}
    for backend in backends:
        started = time.perf_counter()
        engine = engine_from_parameters(dataclasses.replace(params, backend=backend), device)
        counter = token_counter(engine.tokenizer) if params.task in GENERATIVE_TASKS else None
        log.info("in-process %s engine loaded in %.1f s on %s", backend, time.perf_counter() - started, device)
        raw[backend] = {str(b): raw_throughput(engine, texts, b, seconds, options, counter) for b in sizes}
        for b in sizes:
            log.info("in-process %s batch %d: %.1f items/s", backend, b, raw[backend][str(b)]["items_per_s"])
        del engine
    return raw


def choose_tool(requested: str, task: str) -> tuple[str, str | None, str]:
    """(tool, perf_analyzer path, why). perf_analyzer measures encoders where it runs; generation needs
    the generated texts to count tokens, so it always uses the tritonclient generator."""
    binary = loadgen.perf_analyzer_binary() if requested in ("auto", "perf_analyzer") else None
    if requested == "perf_analyzer" and binary is None:
        raise UserError("bench.tool = 'perf_analyzer': no runnable perf_analyzer here (needs glibc >= 2.38)", "use bench.tool: auto")
    if task in GENERATIVE_TASKS:
        return "tritonclient", None, "generation: tokens are counted from the returned texts"
    if task in NON_TEXT_TASKS:
        return "tritonclient", None, "image and speech loads: the tritonclient generator sends their files"
    if binary:
        return "perf_analyzer", binary, f"perf_analyzer runs on this host ({binary})"
    if requested == "tritonclient":
        return "tritonclient", None, "configured (bench.tool)"
    return "tritonclient", None, "perf_analyzer does not run on this host (its wheel needs glibc >= 2.38)"


def measure_served(
    urls: dict[str, str],
    name: str,
    task: str,
    texts: list[bytes],
    sizes: list[int],
    bench: BenchSpec,
    counter,
    task_options: dict | None = None,
    primary: str = interface.TEXT,
) -> tuple[list, str]:
    tool, binary, why = choose_tool(bench.tool, task)
    extra = {interface.MAX_NEW_TOKENS: bench.max_new_tokens} if task in GENERATIVE_TASKS else (task_options or None)
    cells = []
    for protocol in bench.protocols:
        for size in sizes:
            for concurrency in bench.concurrency:
                load = loadgen.Load(protocol, urls, name, texts, size, concurrency, bench.seconds, bench.max_requests, extra, primary)
                cell = None
                if binary:
                    try:
                        cell = loadgen.measure_perf_analyzer(load, binary)
                    except UserError as err:  # e.g. no stable window: measure this cell the other way
                        log.warning("perf_analyzer: %s; measuring this cell with tritonclient", err.message)
                if cell is None:
                    cell = loadgen.measure_tritonclient(load, bench.warmup_s, counter)
                log.info(
                    "%s %s x%d texts, concurrency %d: %.1f items/s, p50 %.1f ms, p99 %.1f ms, errors %d",
                    name, protocol, size, concurrency, cell.items_per_s, cell.latency_ms["p50"], cell.latency_ms["p99"], cell.errors,
                )  # fmt: skip
                cells.append(cell.to_dict())
    return cells, f"{tool}: {why}"


def _cell(cells: list[dict], protocol: str, size: int, concurrency: int) -> dict | None:
    return next((c for c in cells if (c["protocol"], c["request_texts"], c["concurrency"]) == (protocol, size, concurrency)), None)


def ratios(result: dict) -> dict[str, Any]:
    """The figures that matter, side by side from this one run."""
    raw, cells, backend = result["raw"], result["served"], result["backend"]
    big, top = result["max_batch_size"], max(result["bench"]["concurrency"])
    yardstick = raw[backend][str(big)]["items_per_s"]
    out: dict[str, Any] = {"raw_items_per_s_at_max_batch": yardstick}
    for protocol in result["bench"]["protocols"]:
        one = _cell(cells, protocol, big, 1)
        best = max((c for c in cells if c["protocol"] == protocol and c["request_texts"] == big), key=lambda c: c["items_per_s"])
        singles = _cell(cells, protocol, 1, top)
        out[protocol] = {
            f"served_batch{big}_c1_vs_raw": round(one["items_per_s"] / yardstick, 3) if one else None,
            f"served_batch{big}_best_vs_raw": round(best["items_per_s"] / yardstick, 3),
            "best_at_concurrency": best["concurrency"],
            f"single_text_c{top}_vs_raw_batch{big}": round(singles["items_per_s"] / yardstick, 3) if singles else None,
        }
    # A served figure well above the engines it runs (one per instance) means the yardstick was not measured stably.
    ceiling = PLAUSIBLE_SERVED_RATIO * max(result.get("instances", 1), 1)
    out["implausible"] = [
        f"{protocol} {key} = {value}"
        for protocol in result["bench"]["protocols"]
        for key, value in out[protocol].items()
        if key.endswith(("_vs_raw", f"_vs_raw_batch{big}")) and value is not None and value > ceiling
    ]
    python = raw.get("python", {}).get(str(big), {}).get("items_per_s")
    if python:
        engines = [b for b in raw if b not in ("device", "pipeline")]  # the pipeline has ratios of its own
        out["inprocess_speedup_vs_python"] = {b: round(raw[b][str(big)]["items_per_s"] / python, 3) for b in engines}
    return out


def bench_model_step(
    name: str,
    server: dict[str, Any],
    models: list[str],
    work: str,
    repository: str,
    bench: dict[str, Any],
    model: dict[str, Any],
    openai: dict[str, Any],
    output_json: str,
    scratch: str,
) -> dict[str, Any]:
    """Rule bench_model: make sure the server is up and current, as `serve` does, then measure `name`
    (`scratch`: a declared output directory for the streaming model's static baseline server and the bench's own
    gateway). The gateway users talk to is never started, stopped or re-pointed here: with openai.enabled the
    gateway's cost is measured on a private one (gateway_cost.private_gateway)."""
    Path(scratch).mkdir(parents=True, exist_ok=True)
    settings = settings_from_params(server, models, work, repository)
    require_api_key(exposure(from_param(OpenAISpec, openai), settings.host))  # before anything running is touched
    state = ensure_server(settings)
    log.info("server %s (%s)", state["action"], state["reason"])
    spec, gateway_spec = from_param(ModelSpec, model), from_param(OpenAISpec, openai)
    gateway_log = Path(scratch) / "gateway.log"
    gateway = (lambda: gateway_cost.private_gateway(settings, gateway_spec, gateway_log)) if gateway_spec.enabled else None
    bench_spec = from_param(BenchSpec, bench)
    return bench_served_model(name, settings.urls, repository, bench_spec, output_json, spec, settings.server, gateway, scratch)


def openai_cost(
    name: str, urls: dict[str, str], params: ModelParameters, bench: BenchSpec, gateway: GatewayTarget, big: int
) -> dict[str, Any]:
    """The gateway next to direct gRPC, same load (hf2triton.perf.gateway_cost)."""
    generation = params.task in GENERATIVE_TASKS
    probe = b"What is the capital of France?" if generation else b"a short sentence to embed"
    idle = gateway_cost.idle_overhead(urls, gateway, name, probe, generation)
    texts = bench_texts(64, max_words=40) if generation else bench_texts(512, max_words=90)
    rows = []
    for concurrency in bench.openai_concurrency:
        if generation:
            count = min(concurrency * bench.generation_requests, bench.max_requests)
            plan = loadgen.generation_plan([t.encode() for t in texts], bench.generation_max_new_tokens, count)
            rows.append(gateway_cost.generation_cost(urls, gateway, name, plan, concurrency, bench.openai_rounds))
        else:
            rows.append(gateway_cost.embeddings_cost(urls, gateway, name, texts, big, concurrency, bench.seconds, bench.openai_rounds))
    endpoint = "/v1/completions (streamed)" if generation else "/v1/embeddings (base64)"
    return {"endpoint": endpoint, "gateway": gateway.base, "alone": idle, "cells": rows}


def add_openai_cost(result: dict[str, Any], cost: dict[str, Any]) -> None:
    """The gateway's cells and their ratios into a model's bench result."""
    result["openai"] = cost
    result["ratios"]["openai"] = openai_ratios(cost)


def openai_ratios(cost: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"alone_added_p50_ms": cost["alone"]["added_p50_ms"]}
    for row in cost["cells"]:
        key = f"c{row['concurrency']}"
        if "tokens_per_s_ratio" in row:
            out[key] = {"tokens_per_s_ratio": row["tokens_per_s_ratio"], "ttft_p50_added_ms": row["ttft_p50_added_ms"]}
        else:
            out[key] = {"texts_per_s_ratio": row["texts_per_s_ratio"]}
        cpu = [r["gateway"]["gateway_cpu_ms_per_request"] for r in row["rounds"] if r["gateway"]["gateway_cpu_ms_per_request"] is not None]
        out[key]["gateway_cpu_ms_per_request"] = round(sum(cpu) / len(cpu), 3) if cpu else None
        out[key]["errors"] = row["errors"]
    return out


def corpus_facts(load: TaskLoad) -> dict[str, Any]:
    """How many distinct rows the load cycles through, and their words (texts) or bytes (files)."""
    if load.primary != interface.TEXT:
        sizes = [len(row) for row in load.rows]
        return {load.primary: len(sizes), "bytes_min": min(sizes), "bytes_max": max(sizes)}
    words = [len(text.split()) for text in load.rows]
    return {"texts": len(words), "words_min": min(words), "words_max": max(words)}


def host_facts() -> dict[str, Any]:
    return {"name": platform.node(), "cpus": host.cpu_count(), "gpu": host.has_gpu(), "python": platform.python_version()}


def inprocess_generation(config, params: ModelParameters, plan: list[tuple[bytes, int]], counter) -> dict[str, Any]:
    """The yardstick of a lone stream: the same requests, one after another, through the engine's generate()."""
    from hf2triton.pipeline.references import reference_device
    from hf2triton.serving.tasks import engine_from_parameters

    engine = engine_from_parameters(params, reference_device(config))
    engine.run([plan[0][0].decode()], **{interface.MAX_NEW_TOKENS: 4})  # warm-up
    started, tokens = time.perf_counter(), 0
    for prompt, max_new_tokens in plan:
        tokens += counter(list(engine.run([prompt.decode()], **{interface.MAX_NEW_TOKENS: max_new_tokens})[interface.TEXT_OUTPUT]))
    elapsed = time.perf_counter() - started
    del engine
    return {"requests": len(plan), "tokens": tokens, "seconds": round(elapsed, 3), "items_per_s": round(tokens / elapsed, 2)}


def generation_ratios(result: dict[str, Any]) -> dict[str, Any]:
    """Streaming vs the static model of the same run (tokens/s per concurrency), the lone stream vs in-process
    generate(), and TTFT at the highest concurrency."""
    stream = {c["concurrency"]: c for c in result["stream"]}
    static = {c["concurrency"]: c for c in result["static"]}
    low, top = min(stream), max(stream)
    out: dict[str, Any] = {
        "stream_c1_vs_inprocess": round(stream[low]["items_per_s"] / result["inprocess"]["items_per_s"], 3),
        f"ttft_p50_ms_c{top}": stream[top]["ttft_ms"]["p50"],
        "stream_vs_static": {
            str(c): round(stream[c]["items_per_s"] / static[c]["items_per_s"], 3) for c in stream if static.get(c, {}).get("items_per_s")
        },
        "errors": sum(c["errors"] for c in (*result["stream"], *result["static"])),
    }
    return out


def bench_streaming_model(
    name: str, urls: dict[str, str], config, params: ModelParameters, bench: BenchSpec, spec: ModelSpec | None, server, scratch: Path
) -> dict[str, Any]:
    """A streaming generation model: the same mixed load (corpus prompts, max_new_tokens cycled from
    bench.generation_max_new_tokens) at each concurrency, streamed from the served model and, as the
    baseline, answered whole by the same model served static on a scratch server."""
    from transformers import AutoTokenizer

    counter = token_counter(AutoTokenizer.from_pretrained(params.model_dir))
    texts = [t.encode() for t in bench_texts(64, max_words=40)]
    plans = {
        c: loadgen.generation_plan(texts, bench.generation_max_new_tokens, min(c * bench.generation_requests, bench.max_requests))
        for c in bench.concurrency
    }
    lone = plans[min(plans)]
    inprocess = inprocess_generation(config, params, lone, counter)
    log.info("in-process generate(), %d requests one by one: %.1f tokens/s", len(lone), inprocess["items_per_s"])
    pipeline = None
    if params.task in PIPELINE_TASKS:  # text2text: transformers' pipeline over the same prompts, alone and batched
        from hf2triton.pipeline.references import reference_device

        device = reference_device(config)
        pipeline = pipeline_generation(params.task, params.model_dir, device, params.dtype, plans[max(plans)], counter, PIPELINE_BATCHES)

    def measure(variant_urls: dict[str, str], stream: bool) -> list[dict[str, Any]]:
        cells = []
        for concurrency, plan in plans.items():
            cell = loadgen.measure_generation(variant_urls, name, plan, concurrency, stream, counter)
            log.info(
                "%s %s c%d: %.1f tokens/s, TTFT p50 %.0f ms p99 %.0f ms, ITL p50 %.1f ms p99 %.1f ms, errors %d",
                name, cell.mode, concurrency, cell.items_per_s, cell.ttft_ms["p50"], cell.ttft_ms["p99"],
                cell.itl_ms["p50"], cell.itl_ms["p99"], cell.errors,
            )  # fmt: skip
            cells.append(cell.to_dict())
        return cells

    streamed = measure(urls, True)
    static: list[dict[str, Any]] = []
    if bench.static_baseline and spec is not None and server is not None:
        # vLLM's engine only streams: a vllm model's static baseline is the same saved model on torch
        backend = {"backend": "python", "vllm": None} if spec.backend == "vllm" else {}
        baseline = with_variant(spec, generation=dataclasses.replace(spec.generation, streaming=False), **backend)
        paths = {"pretrained": params.model_dir}
        with scratch_server(baseline, scratch / "repository", scratch / "server", server, paths, uses_gpu(config)) as (settings, _):
            static = measure(settings.urls, False)
    result = {
        "model": name,
        "task": params.task,
        "streaming": True,
        "backend": params.backend,
        "items": "generated tokens",
        "max_sequences": params.max_sequences,
        "instances": sum(g.count for g in config.instance_group),
        "instance_kind": [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group],
        "static_max_batch_size": spec.max_batch_size if spec else None,
        "host": host_facts(),
        "corpus": {"prompts": len(texts), "max_new_tokens": list(bench.generation_max_new_tokens)},
        "bench": dataclasses.asdict(bench),
        "tool": "tritonclient: gRPC streams (tritonclient.grpc.aio) for the streaming model, gRPC infer for the static baseline",
        "inprocess": inprocess,
        "stream": streamed,
        "static": static,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    result["ratios"] = generation_ratios(result)
    if pipeline:
        result["raw"] = {"pipeline": pipeline}
        result["ratios"]["pipeline"] = pipeline_ratios(result, "stream")
    return result


def bench_served_model(
    name: str,
    urls: dict[str, str],
    repository: str,
    bench: BenchSpec,
    output_json: str,
    spec: ModelSpec | None = None,
    server=None,
    gateway: Callable[[], AbstractContextManager[GatewayTarget]] | None = None,
    scratch: str = "",
) -> dict[str, Any]:
    """Measure `name` as served at `urls` (http/grpc/metrics host:port) next to its in-process engine (and
    through the OpenAI gateway when `gateway` is given -- it opens one for the gateway stage only -- and the
    model is one it serves). `scratch`: the working directory of a streaming model's static baseline server
    (default: next to `output_json`)."""
    config = read_model_config(Path(repository) / name / "config.pbtxt")
    params = model_parameters(config)
    with_gateway = gateway is not None and bench.openai_concurrency and (params.task == FEATURE_EXTRACTION or params.streaming)
    if params.task in GENERATIVE_TASKS and params.streaming:
        scratch_dir = Path(scratch) if scratch else Path(output_json).parent / "scratch" / name
        result = bench_streaming_model(name, urls, config, params, bench, spec, server, scratch_dir)
        if with_gateway:
            with gateway() as target:
                add_openai_cost(result, openai_cost(name, urls, params, bench, target, 1))
                if bench.guidellm:
                    base_url = target.base.removesuffix("/v1")
                    result["guidellm"] = guidellm_sweep(base_url, target.api_key, name, params.model_dir, bench, scratch_dir / "guidellm")
        atomic_write_json(output_json, result)
        log.info("bench %s: %s", name, result["ratios"])
        return result
    task, big = params.task, max(config.max_batch_size, 1)
    sizes = sorted({1, big})
    generative = task in GENERATIVE_TASKS
    load = task_load(task, bench_texts(64 if generative else 512, max_words=40 if generative else 90), params.model_dir)
    texts = load.rows
    backends = available_backends(params, bench.inprocess_backends)
    raw = measure_raw(config, texts, sizes, bench.seconds, backends, bench.max_new_tokens, load.options)
    if task in PIPELINE_TASKS:
        from hf2triton.pipeline.references import reference_device

        batches = sorted({*PIPELINE_BATCHES, big})
        raw["pipeline"] = pipeline_throughput(task, params.model_dir, reference_device(config), params.dtype, load, batches, bench.seconds)
    counter = None
    if task in GENERATIVE_TASKS:
        from transformers import AutoTokenizer

        counter = token_counter(AutoTokenizer.from_pretrained(params.model_dir))
    metrics_before = client.model_metrics(urls["metrics"], name)
    served, tool = measure_served(urls, name, task, load.encoded, sizes, bench, counter, load.options, load.primary)
    metrics_after = client.model_metrics(urls["metrics"], name)
    result = {
        "model": name,
        "task": task,
        "backend": params.backend,
        "items": "generated tokens" if task in GENERATIVE_TASKS else load.items,
        "max_batch_size": big,
        "instances": sum(g.count for g in config.instance_group),
        "instance_kind": [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group],
        "max_queue_delay_us": config.dynamic_batching.max_queue_delay_microseconds,
        "host": host_facts(),
        "corpus": corpus_facts(load),
        "bench": dataclasses.asdict(bench),
        "tool": tool,
        "raw": raw,
        "served": served,
        "metrics": {
            "counters_delta": {k: round(metrics_after[k] - metrics_before.get(k, 0.0), 1) for k in metrics_after if "gpu" not in k},
            "gpu_after": {k: v for k, v in metrics_after.items() if k.startswith("nv_gpu_")},
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    result["ratios"] = ratios(result)
    if "pipeline" in raw:
        result["ratios"]["pipeline"] = pipeline_ratios(result)
    if with_gateway:
        with gateway() as target:
            add_openai_cost(result, openai_cost(name, urls, params, bench, target, big))
    atomic_write_json(output_json, result)
    log.info("bench %s: %s", name, result["ratios"])
    return result
