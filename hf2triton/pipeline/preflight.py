"""Step `preflight`: cheap checks of the host before any expensive work (runs first: highest priority).

Python-backend stub for this Python, free disk for models still to be built, GPU presence against
`device:`, ports free or held by our own server, estimated host memory of all model instances (CPU instances:
with their working memory at the configured limits), and the GPU memory budget: weights + working memory at
the configured limits + a CUDA context per GPU instance against the free memory of each GPU it is placed on (`gpus`; a
backend vllm model: the share of each whole GPU its engine spans, vllm.gpu_memory_utilization, its weights split over
them).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json, free_bytes, human_bytes, tree_size
from hf2triton.gateway.process import require_api_key
from hf2triton.pipeline.sources import resolve_local_path
from hf2triton.serving.interface import GENERATION, TEXT2TEXT
from hf2triton.specs import Footprint, ServerSpec, from_param, gpu_placement, instance_kind, onnx_precision, parse_source, reserved_gpus
from hf2triton.triton import mps
from hf2triton.triton.cleanup import find_ours
from hf2triton.triton.install import locate_tritonserver
from hf2triton.triton.ports import LISTEN_FIX, cannot_listen, listening_ports
from hf2triton.triton.settings import Settings
from hf2triton.triton.state import observe, read_state

log = logging.getLogger(__name__)

INSTANCE_OVERHEAD_BYTES = 450 * 1024**2  # a Python stub with torch + transformers imported
CUDA_CONTEXT_BYTES = 600 * 1024**2  # per GPU instance (own process): CUDA context, cuBLAS workspace, allocator slack
VLLM_ENGINE_PROCESS_BYTES = 2 * 1024**3  # backend vllm: vLLM's engine-core process beside the stub (torch, CUDA, vllm)
GGUF_EXPANSION = 7.5  # Q4 GGUF -> float32 weights
BYTES_PER_PARAM = {"float32": 4, "float16": 2, "bfloat16": 2}


def instance_bytes(models: list[Footprint], estimates: dict[str, int | None]) -> int:
    """Estimated bytes of every instance of `models`."""
    return sum((estimates[m.name] or 0) * m.instances for m in models)


def _check(name: str, ok: bool, detail: str, fix: str = "") -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail, "fix": fix}


def write_problem(directory: Path) -> str:
    """'' when a file can be created in `directory` (made when missing), else why not: a probe file, because
    free space, permissions, a read-only mount and a file in the way all fail only when writing."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".hf2triton-probe-"):
            return ""
    except OSError as err:
        return f"{err.strerror or err} ({type(err).__name__})"


def writable_checks(directories: dict[str, tuple[Path, str]]) -> list[dict[str, Any]]:
    """One check per directory the pipeline will write (label -> (path, fix)), naming the one that fails."""
    checks = []
    for label, (directory, fix) in directories.items():
        problem = write_problem(directory)
        checks.append(_check(f"writable:{label}", not problem, f"{directory}: {problem or 'writable'}", fix))
    return checks


def source_bytes(model: Footprint) -> int | None:
    """Size of a local/package source on disk (None for hub sources: known only when fetching)."""
    source = parse_source(model.source)
    if source.is_hub:
        return None
    try:
        return tree_size(resolve_local_path(source))
    except UserError:
        return None


def source_expansion(model: Footprint) -> float:
    """Bytes of float32 weights per byte of source (a Q4 GGUF expands when loaded)."""
    return GGUF_EXPANSION if model.source.endswith(".gguf") else 1.0


def serving_dtype(model: Footprint, gpu: bool) -> str:
    kind = "KIND_GPU" if gpu else "KIND_CPU"
    if model.backend == "onnx" and onnx_precision(model.backend, kind, model.dtype, model.task) == "float32":
        return "float32"  # the export's precision (an image / speech model's on a GPU too), whatever dtype says
    return model.dtype if model.dtype != "auto" else ("float16" if gpu else "float32")


def weight_bytes(model: Footprint, pretrained_dir: Path, gpu: bool) -> int | None:
    """The weights at the serving dtype: from the saved model's manifest, else from the source's size."""
    manifest = pretrained_dir / "hf2triton.json"
    per_param = BYTES_PER_PARAM[serving_dtype(model, gpu)]
    if manifest.is_file():
        return json.loads(manifest.read_text())["parameters"] * per_param
    size = source_bytes(model)
    return None if size is None else int(size * source_expansion(model)) * per_param // 4


def estimate_model_memory(model: Footprint, pretrained_dir: Path, gpu: bool) -> int | None:
    """Host bytes one instance needs: weights at the serving dtype plus the stub's own overhead; on the CPU also
    its working memory at the configured limits (a GPU instance's is counted against the GPU: gpu_budget)."""
    weights = weight_bytes(model, pretrained_dir, gpu)
    if weights is None:
        return None
    working = 0 if gpu else working_bytes(model, architecture(model, pretrained_dir), serving_dtype(model, gpu=False))
    engine = VLLM_ENGINE_PROCESS_BYTES if model.gpu_memory_utilization else 0
    return weights + INSTANCE_OVERHEAD_BYTES + working + engine


def architecture(model: Footprint, pretrained_dir: Path) -> dict[str, Any] | None:
    """The model's config.json: the saved model's, else a local source directory's (a GGUF or hub source is
    known only once it is built)."""
    candidates = [pretrained_dir / "config.json"]
    source = parse_source(model.source)
    if not source.is_hub:
        try:
            path = resolve_local_path(source)
            candidates.append(path / "config.json")
        except UserError:
            pass
    for candidate in candidates:
        try:
            return json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
    return None


def working_bytes(model: Footprint, arch: dict[str, Any] | None, dtype: str) -> int:
    """Peak activation memory of one instance at its configured limits, one layer's activations at a time.
    Generation: the KV cache of its rows (streaming: max_sequences) at the full context, their logits, and one
    prefill (streaming: max_prefill_tokens tokens, their attention scores against the full context; static: a
    max_batch_size batch of full-length prompts). Otherwise one max_batch_size batch at the full length."""
    if not arch:
        return 0
    size = BYTES_PER_PARAM[dtype]
    hidden = int(arch.get("hidden_size") or 0)
    heads = int(arch.get("num_attention_heads") or 1)
    context = int(arch.get("max_position_embeddings") or 512)
    intermediate = int(arch.get("intermediate_size") or 4 * hidden)
    if model.task != GENERATION:
        tokens = model.max_batch_size * context
        return tokens * (intermediate + 4 * hidden) * size + model.max_batch_size * heads * context * context * size
    rows = max(model.max_sequences, model.max_batch_size)
    kv_heads = int(arch.get("num_key_value_heads") or heads)
    head_dim = int(arch.get("head_dim") or hidden // heads)
    cache = 2 * int(arch.get("num_hidden_layers") or 0) * kv_heads * head_dim * size * context * rows
    tokens = min(model.max_prefill_tokens or model.max_batch_size * context, rows * context)
    # gated feed-forward (gate, up, their product), hidden states, attention scores + mask (eager / math SDPA)
    prefill = tokens * (3 * intermediate + 4 * hidden) * size + tokens * (heads + 1) * context * size
    logits = (tokens if model.backend == "onnx" else rows) * int(arch.get("vocab_size") or 0) * 4  # the ONNX decoder: every position's
    return cache + prefill + logits


def gpu_placements(models: list[Footprint], gpu_count: int) -> dict[str, tuple[int, ...]]:
    """The GPUs each GPU model's instances go on, as render places them (specs.gpu_placement)."""
    reserved = reserved_gpus(models, True, gpu_count)
    return {m.name: gpu_placement(m.gpus, m.gpu_span, "KIND_GPU", gpu_count, () if m.backend == "vllm" else reserved) for m in models}


def gpu_budget(
    models: list[Footprint], pretrained_dirs: dict[str, str], placement: dict[str, tuple[int, ...]], totals: dict[int, int]
) -> dict[int, tuple[int, list[str]]]:
    """Per GPU: the bytes the instances placed on it need (weights + working memory + one CUDA context each; a vllm
    engine: its share of each GPU it spans, of that GPU's whole memory `totals[gpu]`, which vLLM takes at start
    whatever the model) and one line per model."""
    budget: dict[int, tuple[int, list[str]]] = {}

    def add(gpu: int, need: int, line: str) -> None:
        total, lines = budget.get(gpu, (0, []))
        budget[gpu] = (total + need, [*lines, line])

    for model in models:
        for gpu in placement[model.name]:
            if model.gpu_memory_utilization:
                whole = totals.get(gpu, 0)
                need = round(model.gpu_memory_utilization * whole)
                size = human_bytes(whole) if whole else "an unknown size"
                share = f"{model.gpu_memory_utilization:g} of the GPU's {size}"
                add(gpu, need, f"{model.name}: vLLM's engine takes {share} = {human_bytes(need)}")
                continue
            pretrained = Path(pretrained_dirs[model.name])
            weights = weight_bytes(model, pretrained, gpu=True) or 0
            working = working_bytes(model, architecture(model, pretrained), serving_dtype(model, gpu=True))
            need = model.instances * (weights + working + CUDA_CONTEXT_BYTES)
            line = f"{model.name}: {model.instances} x (weights {human_bytes(weights)} + working {human_bytes(working)} "
            add(gpu, need, line + f"+ CUDA context {human_bytes(CUDA_CONTEXT_BYTES)}) = {human_bytes(need)}")
    return budget


def gpu_checks(models: list[Footprint], pretrained_dirs: dict[str, str], memory: list[tuple[int, int]], held: int) -> list[dict[str, Any]]:
    """The GPUs the models name exist; each GPU's budget fits its free memory (+ `held`: what our running server holds,
    freed when it restarts); a vllm engine's weights, split over the GPUs it spans, leave room for its KV cache."""
    placement = gpu_placements(models, len(memory))
    checks = []
    for model in models:
        missing = [gpu for gpu in placement[model.name] if gpu >= len(memory)]
        if missing:
            checks.append(
                _check(
                    f"gpus:{model.name}",
                    False,
                    f"model {model.name} is placed on GPU {', '.join(map(str, missing))}, this host has {len(memory)} GPU(s) "
                    f"(0-{len(memory) - 1})",
                    f"set gpus for {model.name} to GPUs of 0-{len(memory) - 1}, or gpus: all"
                    + (", or a smaller vllm.tensor_parallel_size x pipeline_parallel_size" if model.backend == "vllm" else ""),
                )
            )
        elif model.backend == "vllm" and model.gpu_span > 1:
            checks.append(vllm_span_check(model, pretrained_dirs[model.name], placement[model.name], memory))
    totals = {gpu: total for gpu, (_, total) in enumerate(memory)}
    for gpu, (need, lines) in sorted(gpu_budget(models, pretrained_dirs, placement, totals).items()):
        if gpu >= len(memory):
            continue
        free = memory[gpu][0]
        checks.append(
            _check(
                "gpu-memory" if gpu == 0 else f"gpu-memory:{gpu}",
                need <= free + held,
                f"the GPU models need {human_bytes(need)} at their limits on GPU {gpu}, which has {human_bytes(free)} free"
                + (f" + {human_bytes(held)} held by our running server" if held else "")
                + f" ({'; '.join(lines)})",
                "fewer GPU instances, a lower generation.max_sequences, max_batch_size or vllm.gpu_memory_utilization, float16, "
                "other gpus for some models, or device: cpu for some models",
            )
        )
    return checks


def vllm_span_check(model: Footprint, pretrained_dir: str, gpus: tuple[int, ...], memory: list[tuple[int, int]]) -> dict[str, Any]:
    """A tensor / pipeline parallel engine: its weights, split over the GPUs it spans, must leave room for the KV cache
    in vLLM's share of the smallest of them (vLLM refuses to start with no room for one sequence)."""
    weights = weight_bytes(model, Path(pretrained_dir), gpu=True) or 0
    share = round(model.gpu_memory_utilization * min(memory[gpu][1] for gpu in gpus))
    each = weights // model.gpu_span
    return _check(
        f"vllm-span:{model.name}",
        each < share,
        f"model {model.name}: weights {human_bytes(weights)} over {model.gpu_span} GPUs ({', '.join(map(str, gpus))}) = "
        f"{human_bytes(each)} each, vLLM's share of each GPU {human_bytes(share)} (the rest holds its KV cache)",
        f"a larger vllm.tensor_parallel_size (or pipeline_parallel_size) or vllm.gpu_memory_utilization for {model.name}",
    )


def torch_cuda_check(facts: dict[str, Any], gpu_models: list[str]) -> dict[str, Any]:
    """torch must run CUDA on this GPU (its build follows the driver: hf2triton.torch_variant)."""
    return _check(
        "torch-cuda",
        bool(facts["cuda_works"]),
        f"{host.describe_torch(facts)}; on the GPU: {', '.join(gpu_models)}",
        "set up again with the build this driver runs (rm .venv/.installed; make setup prints the choice; "
        "TORCH_VARIANT=cu126 for drivers 525-575), or device: cpu for these models",
    )


def onnx_providers() -> list[str]:
    import onnxruntime

    return list(onnxruntime.get_available_providers())


def onnx_cuda_check(providers: list[str], gpu_models: list[str]) -> dict[str, Any]:
    """backend onnx on a GPU runs ONNX Runtime's CUDA provider (the model refuses to load without it)."""
    return _check(
        "onnxruntime-cuda",
        "CUDAExecutionProvider" in providers,
        f"ONNX Runtime offers {', '.join(providers)}; backend onnx on the GPU: {', '.join(gpu_models)}",
        "install onnxruntime-gpu in place of onnxruntime on this GPU host, or device: cpu for these models",
    )


def preflight_step(
    models: list[dict[str, Any]],
    server: dict[str, Any],
    work: str,
    pretrained_dirs: dict[str, str],
    gpu_available: bool,
    output: str,
    gateway: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Rule `preflight` (specs arrive as params dicts; `gateway`: gateway.process.exposure's facts)."""
    footprints = [from_param(Footprint, m) for m in models]
    settings = Settings.of(from_param(ServerSpec, server), [m.name for m in footprints], work)
    return run_preflight(footprints, settings, work, pretrained_dirs, gpu_available, output, gateway)


def run_preflight(
    models: list[Footprint],
    settings: Settings,
    work: str,
    pretrained_dirs: dict[str, str],
    gpu_available: bool,
    output: str,
    gateway: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The checks; `work` is paths.work as configured (named in messages); `gateway`: where the OpenAI gateway
    listens beyond loopback ({}: on loopback or off), whose API key must be set before anything is downloaded."""
    checks = []
    if gateway:
        try:
            require_api_key(gateway)
            checks.append(_check("gateway-key", True, f"the gateway on {gateway['host']}: its API key is in ${gateway['api_key_env']}"))
        except UserError as err:
            checks.append(_check("gateway-key", False, err.message, err.fix or ""))
    try:
        install = locate_tritonserver()
        checks.append(_check("tritonserver", True, f"{install.binary} ({install.origin})"))
    except UserError as err:
        checks.append(_check("tritonserver", False, err.message, err.fix or ""))

    checks.append(_check("gpu", True, "NVIDIA GPU present" if gpu_available else "no GPU: models with device auto run on CPU"))
    for model in models:
        how = f"inferred from {model.task_inferred_from}" if model.task_inferred_from else "as configured"
        checks.append(_check(f"task:{model.name}", True, f"task: {model.task} ({how})"))
        if model.task == TEXT2TEXT:
            checks.append(_check(f"t2t:{model.name}", True, text2text_settings(model, pretrained_dirs[model.name])))
    for model in models:
        if model.device == "gpu" and not gpu_available:
            checks.append(_check(f"device:{model.name}", False, "device: gpu but this host has no GPU", "set device: auto or cpu"))

    checks += writable_checks(
        {
            "paths.work": (Path(work), f"set paths.work in config.yaml to a directory you can write, or make {work} writable"),
            "repository": (Path(settings.repository), f"make {settings.repository} writable (the project's rendered repository)"),
        }
    )
    pending = [m for m in models if not (Path(pretrained_dirs[m.name]) / "hf2triton.json").is_file()]
    need = sum(int(2 * (source_bytes(m) or 0) * source_expansion(m)) for m in pending)
    free = free_bytes(work)
    checks.append(
        _check(
            "disk",
            free >= need,
            f"{human_bytes(free)} free at {work}, {human_bytes(need)} needed for {len(pending)} model(s) still to build"
            + (" (hub sources are checked when fetched)" if any(parse_source(m.source).is_hub for m in pending) else ""),
            "free space or point paths.work at a larger disk",
        )
    )

    state = read_state(settings)
    ours = observe(settings, state).cmdline_matches if state else False
    # our servers, found by their command lines too (a lost or corrupt state file, a changed paths.work)
    our_servers = find_ours(settings).servers
    our_ports = set().union(*(listening_ports(pid) for pid in our_servers)) if our_servers else set()
    unusable = cannot_listen(settings.server.host)  # an address of another machine: not "a port in use"
    if unusable:
        checks.append(
            _check("host", False, f"server.host = {settings.server.host!r}: this machine cannot listen there ({unusable})", LISTEN_FIX)
        )
    for key, port in settings.ports.items() if not unusable else ():
        held_by_us = port in our_ports
        free_now = host.port_is_free(settings.server.host, port)
        checks.append(
            _check(
                f"port:{key}",
                free_now or held_by_us,
                f"{settings.server.host}:{port} "
                + ("free" if free_now else "held by our tritonserver" if held_by_us else "in use by another program"),
                f"stop that program or set server.{key} in config.yaml to a free port",
            )
        )

    # where the instances will run (device: gpu without a GPU is refused by the gpu check above)
    on_gpu = {m.name: gpu_available and instance_kind(m.device, gpu_available) == "KIND_GPU" for m in models}
    if any(on_gpu.values()):  # a GPU model needs a torch that runs CUDA here, not a silent fall back to the CPU
        checks.append(torch_cuda_check(host.torch_facts(), [n for n, gpu in on_gpu.items() if gpu]))
    onnx_on_gpu = [m.name for m in models if on_gpu[m.name] and m.backend == "onnx"]
    if onnx_on_gpu:  # and ONNX Runtime's CUDA provider for backend onnx there (the CPU package has none)
        checks.append(onnx_cuda_check(onnx_providers(), onnx_on_gpu))
    try:  # server.cuda_mps: on without a GPU model or without the MPS binary is refused here, before any model is built
        placed = gpu_placements([m for m in models if on_gpu[m.name]], host.gpu_count())  # `instances` on each of its GPUs
        gpu_instances = sum(m.instances * len(placed[m.name]) for m in models if on_gpu[m.name])
        plan = mps.plan(settings.server.cuda_mps, gpu_instances, settings.server_dir)
        checks.append(_check("cuda_mps", True, ("on: " if plan.wanted else "off: ") + plan.reason))
    except UserError as err:
        checks.append(_check("cuda_mps", False, err.message, err.fix or ""))
    estimates = {m.name: estimate_model_memory(m, Path(pretrained_dirs[m.name]), on_gpu[m.name]) for m in models}
    per_model = "".join(f"; {n}: {human_bytes(e)}/instance" for n, e in estimates.items() if e)
    ram_need = instance_bytes(models, estimates)
    available = host.available_memory_bytes()
    if ours:
        available += host.process_rss_bytes(int(state["pid"])) or 0  # freed if the server restarts
    checks.append(
        _check(
            "memory",
            ram_need <= available,
            f"estimated {human_bytes(ram_need)} for all instances, {human_bytes(available)} available{per_model}",
            "fewer instances, a smaller dtype, fewer models, or a lower generation.max_sequences or max_prefill_tokens",
        )
    )
    gpu_models = [m for m in models if on_gpu[m.name]]
    memory = host.gpu_memory_table() if gpu_models else None
    if memory is not None:
        held = host.gpu_memory_of([int(state["pid"]), *host.descendants(int(state["pid"]))]) if ours else 0
        checks += gpu_checks(gpu_models, pretrained_dirs, memory, held)
    shm = Path("/dev/shm")  # noqa: S108 - only measured
    if shm.is_dir():
        shm_free = shutil.disk_usage(shm).free
        shm_need = settings.server.shm_default_byte_size * sum(m.instances for m in models) * 2
        checks.append(
            _check(
                "shared-memory",
                shm_free >= shm_need,
                f"{shm}: {human_bytes(shm_free)} free, {human_bytes(shm_need)} needed",
                "free /dev/shm or lower server.shm_default_byte_size",
            )
        )
    report = {"ok": all(c["ok"] for c in checks), "checks": checks}
    for check in checks:
        (log.info if check["ok"] else log.error)("preflight %-22s %s  %s", check["name"], "ok " if check["ok"] else "FAIL", check["detail"])
    if not report["ok"]:
        failed = [c for c in checks if not c["ok"]]
        raise UserError(
            "preflight failed: " + "; ".join(f"{c['name']}: {c['detail']}" for c in failed),
            "; ".join(dict.fromkeys(c["fix"] for c in failed)),
        )
    atomic_write_json(output, report)
    return report


def text2text_settings(model: Footprint, pretrained: str) -> str:
    """The line naming what of its checkpoint's generation config a text2text model's answers follow (read from its
    saved files; before they are saved, the server log names it when the model loads)."""
    from hf2triton.serving.tasks.text2text import CheckpointGeneration

    if not model.checkpoint_defaults:
        return CheckpointGeneration(None, None).describe()
    if not (Path(pretrained) / "hf2triton.json").is_file():
        return "t2t: checkpoint generation settings: read once the model is saved (the server log names them)"
    return CheckpointGeneration.from_files(pretrained, model.pipeline_task, True).describe()
