"""Step `validate`: prove the running server serves what was built.

Per model: ready; the served config equals the rendered one; one HTTP and one gRPC inference with
identical outputs; outputs equal to the saved model run in-process (same engine code, no Triton); the
latency of each call; the metrics endpoint counting the requests. Writes report.json and report.md.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json, atomic_write_text
from hf2triton.gateway.process import require_api_key
from hf2triton.pipeline import references
from hf2triton.pipeline.image_checks import embeddings_check
from hf2triton.pipeline.image_probes import validation_options
from hf2triton.pipeline.pipeline_answers import (
    JSON_ANSWERS,
    compare_embeddings,
    compare_entities,
    compare_scores,
    entity_lists,
    parity_texts,
    pipeline_candidates,
    pipeline_entities,
    probe_texts,
    sentence_embeddings,
)
from hf2triton.pipeline.references import VALIDATION_MAX_NEW_TOKENS, VALIDATION_OPTIONS, reference_device, reference_outputs
from hf2triton.pipeline.render import VERSION, prune_repository
from hf2triton.pipeline.serve import FAILED_REPORT, settings_from_params
from hf2triton.pipeline.text2text_checks import pipeline_check, stream_check
from hf2triton.pipeline.text_probes import PARITY_GENERATION_PROMPTS, PARITY_PROBES, PROBES, RANKING_QUERY
from hf2triton.pipeline.validation_report import render_markdown
from hf2triton.serving import interface, pooling
from hf2triton.serving.interface import GENERATION, GENERATIVE_TASKS
from hf2triton.specs import OnnxSpec, onnx_precision
from hf2triton.triton import client
from hf2triton.triton.modelconfig import located_config, model_parameters, read_model_config, uses_gpu
from hf2triton.triton.pitfalls import explain
from hf2triton.triton.process import ensure_server
from hf2triton.triton.settings import Settings
from hf2triton.triton.state import public_state

log = logging.getLogger(__name__)

COSINE_FLOOR = 0.999
VLLM_AGREEMENT_CHARS = 40  # backend vllm vs the torch reference: greedy answers agree at least this far
SUCCESS_METRIC = "nv_inference_request_success"
METRICS_WAIT_S = 5.0  # how long the success counter may lag the answers it counts (metrics_check)


def check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def rendered_config(repository: str, name: str) -> mc.ModelConfig:
    return read_model_config(Path(repository) / name / "config.pbtxt")


def config_differences(rendered: Any, served: Any, path: str = "") -> list[str]:
    """Fields set in the rendered config whose served value differs (the server adds defaults; those are fine)."""
    if isinstance(rendered, dict):
        if not isinstance(served, dict):
            return [f"{path or '.'}: {served!r}"]
        return [d for key, value in rendered.items() for d in config_differences(value, served.get(key), f"{path}.{key}")]
    if isinstance(rendered, list):
        if not isinstance(served, list) or len(served) != len(rendered):
            return [f"{path}: served {served!r}, rendered {rendered!r}"]
        return [d for i, (r, s) in enumerate(zip(rendered, served)) for d in config_differences(r, s, f"{path}[{i}]")]
    return [] if rendered == served else [f"{path}: served {served!r}, rendered {rendered!r}"]


def _as_dict(config: mc.ModelConfig) -> dict[str, Any]:
    return json_format.MessageToDict(config, preserving_proto_field_name=True)


# Triton's refusals under the model's queue policy (config `queue`: max_size, timeout_s): on a busy host a short
# timeout_s refuses a validation request that waited behind a slow scheduler wake-up (CI, 2 loaded cores: 50 ms). That
# is the policy the user asked for, not a wrong answer: validation asks again, a few times, before it fails.
QUEUE_REFUSALS = ("Request timeout expired", "Exceeds maximum queue size")
QUEUE_ATTEMPTS = 5


def infer(
    triton, client_module, name: str, task: str, texts: list[str], outputs: tuple[str, ...], options: dict[str, Any] | None = None
) -> tuple[dict[str, np.ndarray], float]:
    """One request's outputs and its time; asked again when the model's queue policy refused it (QUEUE_REFUSALS)."""
    if options is None:
        ranking = {interface.QUERY: RANKING_QUERY} if task == interface.TEXT_RANKING else validation_options(task)
        options = VALIDATION_OPTIONS if task in GENERATIVE_TASKS else ranking
    inputs = client.build_inputs(client_module, texts, options, primary=interface.primary_input(task))
    for attempt in range(1, QUEUE_ATTEMPTS + 1):
        started = time.perf_counter()
        try:
            result = triton.infer(name, inputs)
            break
        except Exception as err:
            if attempt == QUEUE_ATTEMPTS or not any(words in str(err) for words in QUEUE_REFUSALS):
                raise
            time.sleep(0.2 * attempt)
    elapsed_ms = (time.perf_counter() - started) * 1000
    found = {o: result.as_numpy(o) for o in outputs}  # a zero-shot image model answers labels, not its embedding outputs
    return {o: value for o, value in found.items() if value is not None}, elapsed_ms


def _texts(values: np.ndarray) -> list[str]:
    return [x.decode() for x in values.reshape(-1)]


def compare(task: str, served: dict[str, np.ndarray], reference: dict[str, np.ndarray], floor: float = COSINE_FLOOR) -> dict[str, Any]:
    """Served vs a reference: embeddings by cosine (>= floor) and length, labels exactly with close scores, generated
    text exactly. {"ok": ..., figures...}"""
    if task == interface.FEATURE_EXTRACTION:
        return compare_embeddings(served, reference, floor)
    if task == interface.CLASSIFICATION:
        labels_s, labels_r = _texts(served[interface.LABEL]), _texts(reference[interface.LABEL])
        diff = float(np.abs(served[interface.SCORE].reshape(-1) - reference[interface.SCORE].reshape(-1)).max())
        same = sum(x == y for x, y in zip(labels_s, labels_r))
        figures = {"texts": len(labels_r), "labels_identical": same, "max_score_diff": round(diff, 6)}
        return {"ok": same == len(labels_r) and diff < 1e-3, **figures, "served": labels_s, "reference": labels_r}
    if task == interface.TEXT_RANKING:
        return compare_scores(served, reference)
    if task in JSON_ANSWERS:  # the pipeline's JSON per text
        output = JSON_ANSWERS[task][0]
        ranked = task in (interface.FILL_MASK, *interface.IMAGE_TASKS)  # lists sorted by score: ties in either order
        return compare_entities(entity_lists(served[output]), entity_lists(reference[output]), ranked=ranked)
    text_s, text_r = _texts(served[interface.TEXT_OUTPUT]), _texts(reference[interface.TEXT_OUTPUT])
    same = sum(x == y for x, y in zip(text_s, text_r))
    return {"ok": same == len(text_r), "prompts": len(text_r), "greedy_identical": same, "served": text_s, "reference": text_r}


def sampling_check(http_client, name: str, texts: list[str], temperature: float) -> dict[str, Any]:
    """A request with the configured sampling (no temperature sent) answers with text; sampled text is not
    compared with anything (it differs run to run)."""
    import tritonclient.http as httpclient

    try:
        result = http_client.infer(name, client.build_inputs(httpclient, texts, {interface.MAX_NEW_TOKENS: VALIDATION_MAX_NEW_TOKENS}))
        sampled = _texts(result.as_numpy(interface.TEXT_OUTPUT))
    except Exception as err:  # noqa: BLE001 - reported as a failed check
        return check(f"configured sampling (temperature {temperature})", False, f"{type(err).__name__}: {err}")
    return check(f"configured sampling (temperature {temperature})", all(sampled), f"answered {sampled[0][:60]!r}")


def seeded_sampling_check(http_url: str, name: str, prompt: str, temperature: float) -> dict[str, Any]:
    """The configured sampling (no temperature sent) answers, and the same seed gives the same text."""
    body = {interface.TEXT: prompt, interface.MAX_NEW_TOKENS: VALIDATION_MAX_NEW_TOKENS, interface.SEED: 1234, interface.STREAM: False}
    title = f"configured sampling (temperature {temperature})"
    answers = [client.http_generate(http_url, name, body) for _ in range(2)]
    if any(status != 200 for status, _ in answers):
        return check(title, False, "; ".join(f"HTTP {status}: {str(answer)[:120]}" for status, answer in answers))
    first, second = (answer.get(interface.TEXT_OUTPUT) for _, answer in answers)
    return check(title, bool(first) and first == second, f"seed 1234 twice: {first[:60]!r} / {second[:60]!r}")


def compare_outputs(task: str, served: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> tuple[bool, str]:
    """Served vs in-process, with a one-line detail for the report."""
    result = compare(task, served, reference, COSINE_FLOOR)
    if task == interface.FEATURE_EXTRACTION:
        return result["ok"], f"min cosine {result['cosine_min']:.6f} (floor {COSINE_FLOOR}), lengths within {result['norm_diff_max']:.1e}"
    if task == interface.CLASSIFICATION:
        return result["ok"], f"labels {result['served']} vs {result['reference']}; max score diff {result['max_score_diff']:.2e}"
    if task == interface.TEXT_RANKING:
        detail = f"{result['texts']} documents' relevance as the cross-encoder in-process (sigmoid of the logit)"
        detail += f"; max score diff {result['max_score_diff']:.2e}; same ranking {result['same_ranking']}"
        detail += f", same tokens {result['same_tokens']}"
        return result["ok"], detail
    if task in JSON_ANSWERS:
        differing = f"; texts differing: {result['texts_differing']}" if result["texts_differing"] else ""
        rows = "images" if task in interface.IMAGE_TASKS else "texts"
        detail = f"{result['entities']} {JSON_ANSWERS[task][1]} of {result['texts']} {rows} as transformers' pipeline"
        detail += f"; max score diff {result['max_score_diff']:.2e}"
        return result["ok"], detail + differing
    return result["ok"], f"served {result['served']!r} vs in-process {result['reference']!r}"


def outputs_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[bool, str]:
    diffs = []
    for name in a:
        if a[name].dtype == np.object_:
            if a[name].reshape(-1).tolist() != b[name].reshape(-1).tolist():
                return False, f"{name} differs"
        else:
            diffs.append(float(np.abs(a[name] - b[name]).max()))
    worst = max(diffs, default=0.0)
    return worst <= 1e-5, f"max abs difference {worst:.2e}"


def strategies_check(rendered: mc.ModelConfig, name: str, http_client, texts: list[str]) -> dict[str, Any]:
    """A tagger: every aggregation strategy served equals the pipeline's with that strategy (the default one is checked
    by "served equals in-process"); with a configured stride, also a text several windows long, windowed with it, for
    every strategy the pipeline allows with a stride (none: sent with stride -1, truncated)."""
    params = model_parameters(rendered)
    windowed = params.stride != interface.NO_STRIDE
    cases = [(strategy, texts) for strategy in interface.AGGREGATION_STRATEGIES if strategy != interface.DEFAULT_AGGREGATION_STRATEGY]
    if windowed:
        cases += [(strategy, [long_probe(texts)]) for strategy in interface.AGGREGATION_STRATEGIES if strategy != "none"]
    details, ok = [], True
    for strategy, probes in cases:
        stride = interface.NO_STRIDE if strategy == "none" else params.stride
        result = served_entities_check(rendered, name, http_client, probes, strategy, stride)
        if "error" in result:
            return check("aggregation strategies equal the pipeline", False, f"{strategy}: {result['error']}")
        ok = ok and result["ok"]
        window = f" (a {len(probes[0])}-character text, stride {stride})" if len(probes) == 1 and windowed else ""
        details.append(
            f"{strategy}{window}: {result['entities']} entities, max score diff {result['max_score_diff']:.2e}"
            + ("" if result["ok"] else " FAIL")
        )
    return check("aggregation strategies equal the pipeline", ok, "; ".join(details))


def long_probe(texts: list[str], characters: int = 4000) -> str:
    """The probes joined and repeated to `characters`: several windows of any tagger's context."""
    joined = " ".join(texts)
    return " ".join([joined] * (characters // len(joined) + 1))


def served_entities_check(rendered: mc.ModelConfig, name: str, http_client, texts: list[str], strategy: str, stride: int) -> dict[str, Any]:
    """The served entities with this strategy and stride vs the pipeline's with the same (or {"error": ...})."""
    import tritonclient.http as httpclient

    params = model_parameters(rendered)
    inputs = client.build_inputs(httpclient, texts, {interface.AGGREGATION_STRATEGY: strategy, interface.STRIDE: stride})
    try:
        served = entity_lists(http_client.infer(name, inputs).as_numpy(interface.ENTITIES))
    except Exception as err:  # noqa: BLE001 - reported as a failed check
        return {"error": f"{type(err).__name__}: {err}"}
    device = reference_device(rendered)
    reference = references.remembered_call(
        pipeline_entities, device, model_dir=params.model_dir, texts=texts, strategy=strategy, dtype=params.dtype, stride=stride
    )
    return compare_entities(served, entity_lists(reference))


def prompts_check(rendered: mc.ModelConfig, name: str, http_client, texts: list[str]) -> dict[str, Any] | None:
    """An embedder with prompts: each prompt named in the request (`prompt_name`) served equals sentence-transformers'
    encode with that prompt (None: the model has no prompt text; its default is checked by "served equals in-process")."""
    import tritonclient.http as httpclient

    params = model_parameters(rendered)
    named = [prompt for prompt, text in pooling.read(params.model_dir).prompts.items() if text]
    device = reference_device(rendered)
    details, ok = [], True
    for prompt in named:
        try:
            served = infer(http_client, httpclient, name, params.task, texts, (interface.EMBEDDING,), {interface.PROMPT_NAME: prompt})[0]
        except Exception as err:  # noqa: BLE001 - reported as a failed check
            return check("prompts equal sentence-transformers'", False, f"{prompt}: {type(err).__name__}: {err}")
        reference = references.remembered_call(
            sentence_embeddings, device, model_dir=params.model_dir, texts=texts, dtype=params.dtype, prompt_name=prompt
        )
        result = compare_embeddings(served, reference, COSINE_FLOOR)
        ok = ok and result["ok"]
        figures = f"min cosine {result['cosine_min']:.6f}, lengths within {result['norm_diff_max']:.1e}"
        details.append(f"{prompt}: {figures}" + ("" if result["ok"] else " FAIL"))
    return check("prompts equal sentence-transformers'", ok, "; ".join(details)) if named else None


def top_k_check(rendered: mc.ModelConfig, name: str, http_client, texts: list[str]) -> dict[str, Any]:
    """fill-mask: the smallest and largest top_k served equal the pipeline's with that top_k (the default 5 is checked
    by "served equals in-process")."""
    import tritonclient.http as httpclient

    params = model_parameters(rendered)
    device = reference_device(rendered)
    details, ok = [], True
    for top_k in interface.FILL_MASK_TOP_K_RANGE:
        try:
            served = http_client.infer(name, client.build_inputs(httpclient, texts, {interface.TOP_K: top_k}))
        except Exception as err:  # noqa: BLE001 - reported as a failed check
            return check("top_k equals the pipeline", False, f"top_k {top_k}: {type(err).__name__}: {err}")
        reference = references.remembered_call(
            pipeline_candidates, device, model_dir=params.model_dir, texts=texts, top_k=top_k, dtype=params.dtype
        )
        result = compare_entities(entity_lists(served.as_numpy(interface.CANDIDATES)), entity_lists(reference), ranked=True)
        ok = ok and result["ok"]
        figures = f"top_k {top_k}: {result['entities']} candidates, max score diff {result['max_score_diff']:.2e}"
        details.append(figures + ("" if result["ok"] else " FAIL"))
    return check("top_k equals the pipeline", ok, "; ".join(details))


def half_precision_check(rendered: mc.ModelConfig, served: dict[str, np.ndarray], texts: list[str]) -> dict[str, Any] | None:
    """A model served in half precision on a GPU against the same saved model in float32 on the CPU: the
    precision the user chose costs no more than COSINE_FLOOR (embeddings; greedy text and classifier scores may
    rightly differ by more than their exact-match tolerances)."""
    params = model_parameters(rendered)
    half = params.dtype != "float32" and reference_device(rendered) != "cpu"
    if params.task != interface.FEATURE_EXTRACTION or params.backend != "python" or not half:
        return None
    ok, detail = compare_outputs(params.task, served, reference_outputs(rendered, texts, float32_cpu=True))
    return check("half precision on GPU vs float32 on CPU", ok, detail)


def infer_in_chunks(
    triton, client_module, name: str, task: str, texts: list[str], outputs: tuple[str, ...], size: int
) -> dict[str, np.ndarray]:
    parts = [infer(triton, client_module, name, task, texts[i : i + size], outputs)[0] for i in range(0, len(texts), size)]
    return {o: np.concatenate([p[o] for p in parts]) for o in parts[0]}  # those answered (zero-shot: labels, no embedding)


def export_precision(rendered: mc.ModelConfig) -> str:
    """The float precision the model's ONNX export was built in: its manifest's (a decoder the builder does not
    know is exported by optimum in float32), else the export rule's own choice."""
    params = model_parameters(rendered)
    manifest = Path(params.onnx_dir) / "export.json"
    if params.onnx_dir and manifest.is_file():
        return json.loads(manifest.read_text()).get("precision", "float32")
    kind = "KIND_GPU" if uses_gpu(rendered) else "KIND_CPU"
    return onnx_precision(params.backend, kind, params.dtype, params.task, params.quantize)


def parity_check(rendered: mc.ModelConfig, name: str, http_client, floor: float, grpc_url: str = "") -> dict[str, Any]:
    """Served non-torch backend vs the torch reference on the fixed probe set, with the figures. A streaming model's
    (`grpc_url`) answers are streamed together, as many at once as its queue holds (none may have joined the running
    batch when the last is sent: more would be "busy" on a small generation.max_queue): rows of different lengths join
    and leave one batch."""
    from concurrent.futures import ThreadPoolExecutor

    import tritonclient.http as httpclient

    params = model_parameters(rendered)
    texts = PARITY_GENERATION_PROMPTS if params.task == GENERATION else parity_texts(params.task, params.model_dir, PARITY_PROBES)
    outputs = tuple(o.name for o in rendered.output)
    if grpc_url:
        with ThreadPoolExecutor(max(1, min(len(texts), params.max_queue))) as pool:
            streamed = pool.map(lambda text: client.stream_generate(grpc_url, name, text, VALIDATION_OPTIONS)["text"].strip(), texts)
            served = {interface.TEXT_OUTPUT: np.array([text.encode() for text in streamed], dtype=np.object_)}
    else:
        served = infer_in_chunks(http_client, httpclient, name, params.task, texts, outputs, rendered.max_batch_size or len(texts))
    # a float16 export (ONNX Runtime on a GPU) answers to the full-precision model: torch float32 on the CPU
    torch_ref = reference_outputs(rendered, texts, backend="python", float32_cpu=export_precision(rendered) == "float16")
    lossy = params.quantize == "dynamic-int8"  # gguf-blocks is lossless: held to the float32 floor
    result = compare(params.task, served, torch_ref, floor if lossy else COSINE_FLOOR)
    return {k: v for k, v in result.items() if k not in ("served", "reference")}


def validate_model(settings: Settings, name: str, http_client, grpc_client, parity_floor: float = OnnxSpec.parity_floor) -> dict[str, Any]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    checks = []
    ready = http_client.is_model_ready(name)
    checks.append(check("ready", ready, "model is READY" if ready else "model is not ready"))
    if not ready:
        return {"ok": False, "checks": checks}
    rendered = rendered_config(settings.repository, name)
    served = json_format.ParseDict(grpc_client.get_model_config(name, as_json=True)["config"], mc.ModelConfig(), ignore_unknown_fields=True)
    diffs = config_differences(_as_dict(rendered), _as_dict(served))
    checks.append(
        check("served config equals rendered", not diffs, "identical in every rendered field" if not diffs else "; ".join(diffs[:5]))
    )
    rendered = located_config(rendered, Path(settings.repository) / name / VERSION)  # the in-process references load its files
    params = model_parameters(rendered)
    task = params.task
    if rendered.model_transaction_policy.decoupled:
        return validate_streaming(settings, name, rendered, checks, parity_floor)
    texts = probe_texts(task, params.model_dir, PROBES.get(task, []))[: rendered.max_batch_size or None]  # one request fits
    outputs = tuple(o.name for o in rendered.output)
    before = client.model_metrics(settings.url("metrics_port"), name).get(SUCCESS_METRIC, 0.0)
    try:
        http_out, http_ms = infer(http_client, httpclient, name, task, texts, outputs)
        grpc_out, grpc_ms = infer(grpc_client, grpcclient, name, task, texts, outputs)
    except Exception as err:  # noqa: BLE001 - reported as a failed check with its hint
        hints = "; ".join(p.fix for p in explain(str(err)))
        checks.append(check("inference", False, f"{type(err).__name__}: {err}" + (f" -- fix: {hints}" if hints else "")))
        return {"ok": False, "checks": checks}
    unit = {interface.SPEECH_RECOGNITION: "audios", **{t: "images" for t in interface.IMAGE_TASKS}}.get(task, "texts")
    checks.append(check("http inference", True, f"{len(texts)} {unit} in {http_ms:.1f} ms"))
    checks.append(check("grpc inference", True, f"{len(texts)} {unit} in {grpc_ms:.1f} ms"))
    same, detail = outputs_equal(http_out, grpc_out)
    checks.append(check("http equals grpc", same, detail))
    started, remembered = time.perf_counter(), len(references.REMEMBERED)
    reference = reference_outputs(rendered, texts)
    ok, detail = compare_outputs(task, http_out, reference)
    if len(references.REMEMBERED) > remembered:
        detail += "; in-process answer remembered from an earlier run (the same files, probes and code)"
    else:
        detail += f"; in-process run {1000 * (time.perf_counter() - started):.0f} ms incl. load"
    checks.append(check("served equals in-process", ok, detail))
    precision = half_precision_check(rendered, http_out, texts)
    if precision:
        checks.append(precision)
    if task == interface.TOKEN_CLASSIFICATION:
        checks.append(strategies_check(rendered, name, http_client, texts))
    if task == interface.FILL_MASK:
        checks.append(top_k_check(rendered, name, http_client, texts))
    if task == interface.FEATURE_EXTRACTION:
        checks += [c for c in [prompts_check(rendered, name, http_client, texts)] if c]
    if task == interface.ZERO_SHOT_IMAGE_CLASSIFICATION:  # its embedding requests (images, texts)
        dtype = "float32" if params.backend == "onnx" else params.dtype  # the export's precision (media_export.py)
        checks.append(embeddings_check(http_client, name, params.model_dir, reference_device(rendered), dtype, COSINE_FLOOR))
    if task == interface.TEXT2TEXT:
        checks.append(
            check(*pipeline_check(params, reference_device(rendered), texts, _texts(http_out[outputs[0]]), VALIDATION_MAX_NEW_TOKENS))
        )
    if task in GENERATIVE_TASKS and params.temperature > 0:
        checks.append(sampling_check(http_client, name, texts[:1], params.temperature))
    backend = params.backend
    parity = None
    if backend != "python":
        parity = parity_check(rendered, name, http_client, parity_floor)
        detail = ", ".join(f"{k} {v}" for k, v in parity.items() if k != "ok")
        checks.append(check(f"parity {backend} vs torch", parity["ok"], detail))
    if backend == "onnx":  # the model refuses to load where its device's provider does not (serving/runtimes/onnxruntime.py ort_session)
        provider = "CUDAExecutionProvider on the GPU" if uses_gpu(rendered) else "CPUExecutionProvider"
        detail = f"{provider}, {export_precision(rendered)} graph (the served model loads with no other provider)"
        checks.append(check("onnx provider", True, detail))
    checks.append(metrics_check(settings, name, before))
    sample = http_out[outputs[0]][0]
    return {
        "ok": all(c["ok"] for c in checks),
        "task": task,
        "backend": backend,
        "parity": parity,
        "latency_ms": {"http": round(http_ms, 1), "grpc": round(grpc_ms, 1)},
        "sample": {
            "input": texts[0] if isinstance(texts[0], str) else f"a file of {len(texts[0])} bytes",
            "output": sample[0].decode() if sample.dtype == np.object_ else [round(float(x), 5) for x in sample[:4]],
        },
        "checks": checks,
    }


def metrics_check(settings: Settings, name: str, before: float) -> dict[str, Any]:
    """Triton's success counter rose by the validation's requests (2 at least). It counts a request when the model
    releases it, a moment after its client has the answer (a decoupled model's final response goes first): read again
    for up to METRICS_WAIT_S, not once after a fixed pause that a loaded machine can outlast."""
    deadline = time.monotonic() + METRICS_WAIT_S
    while True:
        after = client.model_metrics(settings.url("metrics_port"), name).get(SUCCESS_METRIC, 0.0)
        if after >= before + 2 or time.monotonic() >= deadline:
            return check("metrics count requests", after >= before + 2, f"{SUCCESS_METRIC} {before:.0f} -> {after:.0f}")
        time.sleep(0.1)


def validate_streaming(settings: Settings, name: str, rendered: mc.ModelConfig, checks: list[dict], floor: float) -> dict[str, Any]:
    """A streaming (decoupled) generation model: the answer streamed over gRPC, joined, equals the one JSON answer
    of HTTP /generate ("stream": false) and the in-process greedy text; it arrived in pieces with a finish
    reason and token counts. Backend onnx: the parity gate on streamed answers too."""
    params = model_parameters(rendered)
    prompt = PROBES[params.task][0]
    before = client.model_metrics(settings.url("metrics_port"), name).get(SUCCESS_METRIC, 0.0)
    try:
        streamed = client.stream_generate(settings.url("grpc_port"), name, prompt, VALIDATION_OPTIONS)
        status, answer = client.http_generate(settings.url(), name, {interface.TEXT: prompt, **VALIDATION_OPTIONS, interface.STREAM: False})
    except Exception as err:  # noqa: BLE001 - reported as a failed check with its hint
        hints = "; ".join(p.fix for p in explain(str(err)))
        checks.append(check("streaming", False, f"{type(err).__name__}: {err}" + (f" -- fix: {hints}" if hints else "")))
        return {"ok": False, "checks": checks}
    pieces = len(streamed["pieces"])
    checks.append(
        check(
            "grpc stream",
            # in pieces, unless the answer is too short to show it: one token, or one and the end token (which adds no text)
            streamed["finish_reason"] in ("stop", "length") and (pieces > 1 or streamed["completion_tokens"] <= 2),
            f"{pieces} responses, first after {1000 * streamed['first_piece_s']:.0f} ms, finish {streamed['finish_reason']}, "
            f"{streamed['prompt_tokens']} prompt + {streamed['completion_tokens']} completion tokens",
        )
    )
    generated = answer.get(interface.TEXT_OUTPUT)
    checks.append(check("http generate (one answer)", status == 200 and generated is not None, f"HTTP {status}: {str(answer)[:120]}"))
    if params.task == interface.TEXT2TEXT:  # beams do not stream (text2text_checks.py); the whole answer is the pipeline's
        device = reference_device(rendered)
        checks.append(check(*stream_check(params, device, prompt, streamed["text"], generated, VALIDATION_MAX_NEW_TOKENS)))
        checks.append(check(*pipeline_check(params, device, [prompt], [generated or ""], VALIDATION_MAX_NEW_TOKENS)))
    else:
        checks.append(check("stream equals generate", generated == streamed["text"], f"streamed {streamed['text']!r} vs {generated!r}"))
    if params.load_format == "dummy":  # vLLM made up its own random weights: nothing in-process gives the same noise
        checks.append(check("served equals in-process", True, "not compared: random weights (vllm.load_format: dummy, for benchmarks)"))
    else:  # backend vllm: the same saved model on torch (engine_from_parameters)
        reference = _texts(reference_outputs(rendered, [prompt])[interface.TEXT_OUTPUT])[0]
        served = (generated or "" if params.task == interface.TEXT2TEXT else streamed["text"]).strip()  # whole: beams too
        detail = f"served {served!r} vs in-process {reference!r}"
        same = served == reference
        if params.backend == "vllm" and not same:
            # other kernels (vLLM's attention, fused layers; float16): greedy answers may part where two tokens are
            # nearly tied. The engine is right when the answers agree well into the text, not only at its start.
            agreed = len(os.path.commonprefix([served, reference]))
            same = agreed >= min(VLLM_AGREEMENT_CHARS, len(served), len(reference))
            detail = f"vLLM and torch agree on the first {agreed} characters: {detail}"
        checks.append(check("served equals in-process", same, detail))
    parity = parity_check(rendered, name, None, floor, settings.url("grpc_port")) if params.backend == "onnx" else None
    if parity:
        checks.append(check("parity onnx vs torch", parity["ok"], ", ".join(f"{k} {v}" for k, v in parity.items() if k != "ok")))
    if params.temperature > 0:
        checks.append(seeded_sampling_check(settings.url(), name, prompt, params.temperature))
    checks.append(metrics_check(settings, name, before))
    return {
        "ok": all(c["ok"] for c in checks),
        "task": params.task,
        "backend": params.backend,
        "streaming": True,
        "parity": parity,
        "latency_ms": {"first_piece": round(1000 * streamed["first_piece_s"], 1), "stream": round(1000 * streamed["piece_times_s"][-1], 1)},
        "sample": {"input": prompt, "output": streamed["text"]},
        "checks": checks,
    }


def validate_server(
    settings: Settings, server_state: dict[str, Any], output_json: str, output_md: str, parity_floors: dict[str, float] | None = None
) -> dict[str, Any]:
    http_client = client.http_client(settings.url(), connection_timeout=60, network_timeout=600)
    grpc_client = client.grpc_client(settings.url("grpc_port"))
    metadata = http_client.get_server_metadata()
    server = {
        "live": http_client.is_server_live(),
        "ready": http_client.is_server_ready(),
        "version": metadata.get("version"),
        **settings.endpoints,
        **{k: v for k, v in public_state(server_state).items() if k in ("pid", "origin", "log", "action", "reason", "ready_after_s")},
    }
    models = {}
    for name in settings.models:
        log.info("validating %s", name)
        models[name] = validate_model(settings, name, http_client, grpc_client, (parity_floors or {}).get(name, OnnxSpec.parity_floor))
        for item in models[name]["checks"]:
            (log.info if item["ok"] else log.error)("  %-30s %s  %s", item["name"], "ok" if item["ok"] else "FAIL", item["detail"])
    report = {
        "ok": server["live"] and server["ready"] and all(m["ok"] for m in models.values()),
        "server": server,
        "models": models,
        "torch": host.torch_facts(),  # the build setup chose (hf2triton.torch_variant) and whether CUDA works
        "finished_at": time.time(),
    }
    # failed-report.md is deliberately not a rule output: Snakemake deletes the outputs of a failed job, and
    # the user needs this one to see why.
    if not report["ok"]:
        failed_dir = Path(output_json).parent
        atomic_write_text(failed_dir / FAILED_REPORT, render_markdown(report))
        failed = [f"{n}: {c['name']} ({c['detail']})" for n, m in models.items() for c in m["checks"] if not c["ok"]]
        raise UserError("validation failed: " + "; ".join(failed), f"see {failed_dir / FAILED_REPORT} and {settings.log_file}")
    atomic_write_json(output_json, report)
    atomic_write_text(output_md, render_markdown(report))
    (Path(output_json).parent / FAILED_REPORT).unlink(missing_ok=True)  # an earlier failure's report is not news
    return report


def validate_step(
    server: dict[str, Any],
    models: list[str],
    work: str,
    repository: str,
    output_json: str,
    output_md: str,
    parity_floors: dict[str, float] | None = None,
    gateway: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Rule `validate`: make sure the server runs the current repository, then validate it."""
    settings = settings_from_params(server, models, work, repository)
    prune_repository(repository, models)
    require_api_key(gateway or {})  # the gateway's key policy (gateway.process.exposure), before anything running is touched
    state = ensure_server(settings)
    return validate_server(settings, state, output_json, output_md, parity_floors)
