"""The configuration as typed, frozen specs, built once from the validated config (schema defaults filled
in; hf2triton.config reads and validates it), what a model's `source:` string means, and the one derivation
of a model's serving values (used by the repository rule and by tune alike).

Rules, scripts and the package read these, never the raw dict: adding a model option means the schema, the
field here, and the code that uses it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf2triton.errors import UserError
from hf2triton.serving.interface import DEFAULTS, GENERATION, GENERATIVE_TASKS, NON_TEXT_TASKS

# ---------------------------------------------------------------- what a model's `source:` string means
# a hub repository, a local directory or .gguf file, or a file shipped inside an installed Python package
# (`pkg:<package>/<path>`); resolving the local and package ones to paths: hf2triton.pipeline.sources

HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
PACKAGE = re.compile(r"^pkg:([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:/(.*))?$")
LOCAL_PREFIXES = ("/", "./", "../", "~")
SHELL_METACHARACTERS = set(";&|`$<>(){}[]*?!\"'\\\n\r\t")


@dataclass(frozen=True)
class Source:
    kind: str  # "hub" | "local" | "package"
    value: str  # hub id, path as written, or package name
    inner_path: str = ""  # for packages: the path inside the package

    @property
    def is_hub(self) -> bool:
        return self.kind == "hub"


def parse_source(text: str, where: str = "source") -> Source:
    """Classify a source string; raise UserError naming `where` for anything unsafe or malformed."""
    if "\x00" in text or any(ch in SHELL_METACHARACTERS for ch in text):
        bad = sorted({ch for ch in text if ch in SHELL_METACHARACTERS or ch == "\x00"})
        raise UserError(
            f"{where} = {text!r}: contains {''.join(bad)!r}",
            "use a hub id (org/name), a path, or pkg:<package>/<path> without shell metacharacters",
        )
    package = PACKAGE.match(text)
    if text.startswith("pkg:"):
        if not package:
            raise UserError(f"{where} = {text!r}: malformed package source", "write pkg:<python_package>/<path inside it>")
        inner = package.group(2) or ""
        if any(part == ".." for part in Path(inner).parts) or inner.startswith("/"):
            raise UserError(f"{where} = {text!r}: the path may not leave the package", "remove '..' and leading '/'")
        return Source("package", package.group(1), inner)
    if text.startswith(LOCAL_PREFIXES):
        return Source("local", text)
    if HUB_ID.match(text) and ".." not in text and not text.endswith((".", "-")):
        return Source("hub", text)
    raise UserError(
        f"{where} = {text!r}: neither a hub id (org/name) nor a local path",
        "write local paths starting with ./, ../, / or ~, hub ids as org/name",
    )


# ---------------------------------------------------------------- the config's sections


@dataclass(frozen=True)
class OnnxSpec:
    opset: int = 17
    exporter: str = "auto"
    optimize: str = "O2"
    quantize: str = "none"
    parity_floor: float = 0.98


@dataclass(frozen=True)
class GenerationSpec:
    """Field names are ModelParameters' (rendered into config.pbtxt as they are)."""

    max_new_tokens: int = DEFAULTS.max_new_tokens
    temperature: float = DEFAULTS.temperature
    chat_template: bool = DEFAULTS.chat_template
    streaming: bool = True  # the config default (backends python, onnx, vllm)
    checkpoint_defaults: bool = DEFAULTS.checkpoint_defaults
    max_sequences: int = DEFAULTS.max_sequences
    max_prefill_tokens: int = DEFAULTS.max_prefill_tokens
    max_queue: int = DEFAULTS.max_queue
    max_new_tokens_limit: int = DEFAULTS.max_new_tokens_limit
    time_limit_s: float = DEFAULTS.time_limit_s
    max_n: int = DEFAULTS.max_n
    tool_parser: str = DEFAULTS.tool_parser
    response_threads: int = DEFAULTS.response_threads  # 0: auto (the config's "auto")


# vllm.max_model_len's schema maximum: a model whose config claims more context is served with this much
VLLM_MAX_MODEL_LEN = 131072


@dataclass(frozen=True)
class VllmSpec:
    """backend vllm: the engine's settings (field names are ModelParameters'; None: see render.vllm_parameters)."""

    gpu_memory_utilization: float = 0.5
    max_model_len: int | None = None  # None: the model's context, at most VLLM_MAX_MODEL_LEN
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None  # None: vLLM's default
    enforce_eager: bool = False
    enable_prefix_caching: bool = True  # vLLM's default: a request reuses the cached blocks of a prompt prefix seen before
    async_scheduling: bool | None = None  # None: vLLM's choice (on where it supports it)
    quantization: str | None = None  # None: the checkpoint's own
    load_format: str = "auto"  # dummy: random weights (benchmarks)
    tensor_parallel_size: int = 1  # GPUs each layer is split over (vLLM's multiprocessing executor, NCCL)
    pipeline_parallel_size: int = 1  # stages the layers are split into, one GPU group each
    frontends: int = 1  # Triton instances (processes) in front of the one engine (runtimes/vllm_frontends.py)


@dataclass(frozen=True)
class QueueSpec:
    max_size: int = 0  # 0: no bound (a Triton queue policy costs lone requests up to 500 ms: schema)
    timeout_s: float = 0


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    task: str
    revision: str = "main"
    task_inferred_from: str | None = None  # None: config.yaml names the task
    pipeline_task: str = ""  # text2text: the alias config.yaml names (summarization, translation_en_to_de, ...)
    gguf_file: str | None = None
    backend: str = "python"
    onnx: OnnxSpec = OnnxSpec()
    max_batch_size: int = 8
    instances: int = 1
    device: str = "auto"
    dtype: str = "auto"
    cuda_graphs: bool = DEFAULTS.cuda_graphs
    max_input_bytes: int = DEFAULTS.max_input_bytes
    max_queue_delay_us: int = 2000
    max_texts_per_request: int = DEFAULTS.max_texts_per_request
    max_request_bytes: int = DEFAULTS.max_request_bytes
    queue: QueueSpec = QueueSpec()
    generation: GenerationSpec | None = None  # text-generation models only
    vllm: VllmSpec | None = None  # backend vllm only
    stride: int = DEFAULTS.stride  # token-classification: window overlap of long texts (token_classification.stride)
    max_image_pixels: int = DEFAULTS.max_image_pixels  # image tasks: width x height of one image at most
    max_audio_seconds: float = DEFAULTS.max_audio_seconds  # automatic-speech-recognition: one audio's seconds at most
    chunk_length_s: float = DEFAULTS.chunk_length_s  # automatic-speech-recognition: 0 long-form, > 0 the pipeline's chunks
    continuous_batching: bool = DEFAULTS.continuous_batching  # automatic-speech-recognition: decoding steps shared
    gpus: str | tuple[int, ...] | None = None  # GPU instances: "all", these GPUs, or None (GPU 0; vllm: 0..span-1)

    @property
    def is_generation(self) -> bool:
        return self.task in GENERATIVE_TASKS

    @property
    def needs_onnx(self) -> bool:
        return self.backend in ("onnx", "tensorrt")

    def footprint(self) -> Footprint:
        """What preflight needs of the model: its memory at its limits (a queue setting does not rerun it)."""
        streaming = self.generation if self.generation and self.generation.streaming else None
        sequences, prefill = (streaming.max_sequences, streaming.max_prefill_tokens) if streaming else (0, 0)
        model = (self.name, self.source, self.task, self.device, self.dtype, self.instances, self.backend, self.max_batch_size)
        vllm_share = self.vllm.gpu_memory_utilization if self.vllm else 0.0
        defaults = self.generation.checkpoint_defaults if self.generation else DEFAULTS.checkpoint_defaults
        placed = (self.gpus, self.gpu_span)
        return Footprint(*model, sequences, prefill, vllm_share, self.task_inferred_from, self.pipeline_task, defaults, *placed)

    @property
    def gpu_span(self) -> int:
        """The GPUs one engine spans: a vllm model's tensor x pipeline parallel size, else 1."""
        return self.vllm.tensor_parallel_size * self.vllm.pipeline_parallel_size if self.vllm else 1


@dataclass(frozen=True)
class Footprint:
    name: str
    source: str
    task: str
    device: str
    dtype: str
    instances: int
    backend: str
    max_batch_size: int = 1
    max_sequences: int = 0  # streaming generation: sequences decoded together (its KV cache)
    max_prefill_tokens: int = 0  # streaming generation: prompt tokens prefilled at once (0: a whole batch's)
    gpu_memory_utilization: float = 0.0  # backend vllm: the fraction of the GPU its engine takes
    task_inferred_from: str | None = None  # shown by preflight (None: config.yaml names the task)
    pipeline_task: str = ""  # text2text: preflight names the checkpoint's generation settings (its alias task's)
    checkpoint_defaults: bool = DEFAULTS.checkpoint_defaults
    gpus: str | tuple[int, ...] | None = None  # as configured (ModelSpec.gpus); gpu_placement resolves it
    gpu_span: int = 1  # GPUs one engine spans (vllm: tensor x pipeline parallel)


@dataclass(frozen=True)
class ServerSpec:
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    startup_timeout_s: int = 300
    log_verbose: int = 0
    shm_default_byte_size: int = 16 * 1024 * 1024
    cuda_mps: str = "auto"
    supervise: bool = True

    @property
    def ports(self) -> dict[str, int]:
        return {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}


@dataclass(frozen=True)
class BenchSpec:
    concurrency: tuple[int, ...] = (1, 4, 16)
    protocols: tuple[str, ...] = ("http", "grpc")
    seconds: float = 5
    warmup_s: float = 1
    max_requests: int = 20000
    max_new_tokens: int = 16
    generation_max_new_tokens: tuple[int, ...] = (16, 32, 64, 128)
    generation_requests: int = 4
    static_baseline: bool = True
    openai_concurrency: tuple[int, ...] = (1, 4)
    openai_rounds: int = 2
    guidellm: bool = True  # a streaming model through the gateway: guidellm's sweep too (perf/guidellm.py)
    tool: str = "auto"
    inprocess_backends: bool = True


@dataclass(frozen=True)
class TuneSpec:
    models: tuple[str, ...] = ()
    max_batch_size: tuple[int, ...] = (8, 32)
    instances: tuple[int, ...] = (1, 2)
    max_queue_delay_us: tuple[int, ...] = (0, 2000, 10000)
    backends: tuple[str, ...] = ()
    concurrency: int = 16
    request_texts: int = 1
    latency_budget_ms: float = 1000
    seconds: float = 5
    max_requests: int = 20000


@dataclass(frozen=True)
class OpenAISpec:
    enabled: bool = False
    host: str | None = None  # None: server.host
    port: int = 9000
    api_key_env: str = "HF2TRITON_API_KEY"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_embedding_inputs: int | None = None  # None: OpenAI's limit, 2,048
    request_timeout_s: float = 30
    max_audio_upload_mib: int = 25  # an audio endpoint's form (OpenAI's 25 MB files); JSON bodies: 8 MiB
    workers: int | str = "auto"  # gateway processes sharing the port; auto: worker_count()
    upstream: str = "http"  # how generation streams reach the gateway: http (Triton's generate_stream: half the gateway's
    # CPU per token of grpc, benchmarks/probes/gateway_stream_profile.py), or grpc

    def bind_host(self, server_host: str) -> str:
        """Where the gateway listens: its own host, or Triton's."""
        return self.host or server_host

    def worker_count(self, cores: int) -> int:
        """`workers`, or for auto one process per 2 of the host's cores, at most 8 (2 cores: 1, as always). A stream's
        pieces arrive together for every client at each engine step, and a worker sends its share one after another:
        on a 16-core H100 host 8 workers beat 4 at 32 and 64 streaming clients on two leases (1.01 / 1.00 vs 0.91 / 0.92
        Triton's own SSE tokens/s, interleaved rounds, 2026-12-06) and matched them at 128."""
        if self.workers != "auto":
            return int(self.workers)
        return max(1, min(8, cores // 2))


@dataclass(frozen=True)
class PublishSpec:
    """Where `make publish` puts the validated repository and replicas serve it from (credentials: the standard
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment, never the config)."""

    url: str = ""  # s3://bucket/prefix; "": not configured
    endpoint_url: str = ""  # an S3-compatible server (MinIO, moto, Ceph); "": AWS
    region: str = "us-east-1"
    execution_env: str = ""  # a pinned requirements file packed into every published model; "": none
    execution_env_python: str = "python3.10"  # builds it (the stub's major.minor)
    execution_env_target: str = "/usr/bin/python3.10"  # runs it, on the serving machines (the official container's)


@dataclass(frozen=True)
class ProjectSpec:
    models: tuple[ModelSpec, ...]
    server: ServerSpec = ServerSpec()
    work: str = ".hf2triton"
    vllm_env: str = ".venv-vllm"  # the venv of backend vllm models (hf2triton.envs)
    bench: BenchSpec = BenchSpec()
    tune: TuneSpec = TuneSpec()
    openai: OpenAISpec = OpenAISpec()
    publish: PublishSpec = PublishSpec()

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def model(self, name: str) -> ModelSpec:
        for model in self.models:
            if model.name == name:
                return model
        raise UserError(f"no model named {name!r} in config", "use one of " + ", ".join(self.names))

    def tuned_models(self) -> list[ModelSpec]:
        """The models `tune` sweeps: tune.models, or every model except text-generation ones and image ones (its loads
        are texts)."""
        names = self.tune.models or tuple(m.name for m in self.models if not m.is_generation and m.task not in NON_TEXT_TASKS)
        return [self.model(name) for name in names]


def _tuples(values: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def model_spec(entry: dict[str, Any]) -> ModelSpec:
    blocks = ("onnx", "generation", "dynamic_batching", "queue", "vllm", "token_classification")  # built below
    values = {k: v for k, v in entry.items() if k not in blocks}
    if isinstance(values.get("gpus"), list):
        values["gpus"] = tuple(values["gpus"])
    generation = None
    if entry["task"] in GENERATIVE_TASKS:
        settings = dict(entry["generation"])
        settings["response_threads"] = 0 if settings.get("response_threads", "auto") == "auto" else settings["response_threads"]
        generation = GenerationSpec(**settings)
    stride = entry.get("token_classification", {}).get("stride")
    return ModelSpec(
        **values,
        stride=DEFAULTS.stride if stride is None else stride,
        onnx=OnnxSpec(**entry["onnx"]),
        queue=QueueSpec(**entry["queue"]),
        max_queue_delay_us=entry["dynamic_batching"]["max_queue_delay_us"],
        generation=generation,
        vllm=VllmSpec(**entry["vllm"]) if entry["backend"] == "vllm" else None,
    )


def project_spec(cfg: dict[str, Any]) -> ProjectSpec:
    """Specs from a config that `hf2triton.config.validate_config` completed (every default present; reading and
    validating config.yaml into specs: `hf2triton.config.load_project`)."""
    return ProjectSpec(
        models=tuple(model_spec(m) for m in cfg["models"]),
        server=ServerSpec(**cfg["server"]),
        work=cfg["paths"]["work"],
        vllm_env=cfg["paths"]["vllm_env"],
        bench=BenchSpec(**_tuples(cfg["bench"])),
        tune=TuneSpec(**_tuples(cfg["tune"])),
        openai=OpenAISpec(**_tuples(cfg["openai"])),
        publish=PublishSpec(**cfg["publish"]),
    )


# ---------------------------------------------------------------- derived serving values


@dataclass(frozen=True)
class ServingValues:
    """Everything the repository rule renders for a model, derived in one place from its spec and the host."""

    name: str
    task: str
    backend: str
    max_batch_size: int
    instances: int
    kind: str  # KIND_CPU | KIND_GPU
    dtype: str
    cuda_graphs: bool
    num_threads: int
    max_queue_delay_us: int
    max_input_bytes: int
    max_texts_per_request: int
    max_request_bytes: int
    queue: QueueSpec
    generation: GenerationSpec | None
    vllm: VllmSpec | None = None
    stride: int = DEFAULTS.stride
    max_image_pixels: int = DEFAULTS.max_image_pixels
    pipeline_task: str = ""
    max_audio_seconds: float = DEFAULTS.max_audio_seconds
    chunk_length_s: float = DEFAULTS.chunk_length_s
    continuous_batching: bool = DEFAULTS.continuous_batching
    execution_env: str = ""  # backend vllm: the absolute path of the venv Triton runs its stub in (EXECUTION_ENV_PATH)
    gpus: tuple[int, ...] = ()  # KIND_GPU: the GPUs its instance group names (`instances` on each); vllm: those it spans


def instance_kind(device: str, gpu_available: bool) -> str:
    """config `device` -> Triton instance kind (auto: the GPU when this machine has one)."""
    return "KIND_GPU" if device == "gpu" or (device == "auto" and gpu_available) else "KIND_CPU"


def gpu_placement(gpus: str | Sequence[int] | None, span: int, kind: str, gpu_count: int, reserved: Iterable[int] = ()) -> tuple[int, ...]:
    """The GPUs a model's instances go on (Triton places `instances` on each GPU its instance group names): () on the
    CPU; the configured list; "all": every GPU of the host but those `reserved` (the GPUs a vllm engine spans: its
    memory share is taken on each), or every GPU where that leaves none; None: GPU 0, or a vllm engine's 0..span-1."""
    if kind != "KIND_GPU":
        return ()
    if gpus == "all":
        every, taken = tuple(range(max(gpu_count, 1))), set(reserved)
        return tuple(i for i in every if i not in taken) or every
    if gpus is not None:
        return tuple(int(i) for i in gpus)
    return tuple(range(span))


def reserved_gpus(models: Sequence[ModelSpec] | Sequence[Footprint], gpu_available: bool, gpu_count: int) -> frozenset[int]:
    """The GPUs the vllm engines span: other models' `gpus: all` leaves them out (specs or preflight's footprints)."""
    engines = [m for m in models if m.backend == "vllm" and m.gpus != "all"]
    return frozenset(i for m in engines for i in gpu_placement(m.gpus, m.gpu_span, instance_kind(m.device, gpu_available), gpu_count))


def onnx_precision(backend: str, kind: str, dtype: str, task: str, quantize: str = "none", exporter: str = "auto") -> str:
    """The ONNX export's float precision: float16 for ONNX Runtime on a GPU instance (dtype auto or float16: the GPU's
    fast path, as torch gets there), float32 otherwise (CPU kernels; TensorRT picks its own). An encoder's fused graph
    is converted; a decoder is built in float16 for CUDA by ONNX Runtime GenAI's model builder (unquantised; optimum's
    decoder export stays float32, and the export's manifest says which precision was built)."""
    if backend != "onnx" or kind != "KIND_GPU" or dtype not in ("auto", "float16") or task in NON_TEXT_TASKS:
        return "float32"  # the image and speech tasks: optimum's float32 export (pipeline/media_export.py)
    if task == GENERATION and (quantize != "none" or exporter == "optimum"):
        return "float32"
    return "float16"


def require_onnx_on_gpu(models: Sequence[ModelSpec], gpu_available: bool) -> None:
    """What ONNX Runtime cannot do on a GPU instance, refused before any work: dynamic int8 (a CPU technique: the
    CUDA provider has no kernels for its integer MatMuls, they would run on the CPU) and bfloat16 (the export converts to float16)."""
    for model in models:
        if model.backend != "onnx" or instance_kind(model.device, gpu_available) != "KIND_GPU":
            continue
        if model.onnx.quantize == "dynamic-int8":
            raise UserError(
                f"model {model.name}: onnx.quantize dynamic-int8 is a CPU technique, and this model runs on the GPU",
                "use quantize: none (on the GPU the export is float16), or device: cpu to serve the int8 model on the CPU",
            )
        if model.dtype == "bfloat16":
            raise UserError(
                f"model {model.name}: dtype bfloat16 with backend onnx on the GPU (the ONNX export is float16 or float32)",
                "use dtype: auto or float16 (or float32), or backend: python for bfloat16",
            )


def threads_per_instance(instances: int, cpus: int) -> int:
    """CPU instances share the machine's cores instead of each taking all of them."""
    return max(1, cpus // instances)


def serving_values(
    model: ModelSpec,
    gpu_available: bool,
    cpus: int,
    vllm_env: str = ProjectSpec.vllm_env,
    gpu_count: int = 1,
    reserved: Iterable[int] = (),
) -> ServingValues:
    """The spec's fields as they are (every ServingValues field named like a ModelSpec field) plus what the
    host decides: the instance kind, the threads per instance, the GPUs (gpu_placement over the host's `gpu_count`
    GPUs, `reserved`: those the vllm engines span), and (backend vllm) the absolute path of the vLLM environment
    (`vllm_env`, relative to the working directory: the project directory)."""
    kind = instance_kind(model.device, gpu_available)
    derived = {
        "kind": kind,
        "instances": model.vllm.frontends if model.vllm else model.instances,  # vllm: one engine, `frontends` instances
        "num_threads": threads_per_instance(model.instances, cpus),
        "execution_env": os.path.abspath(vllm_env) if model.backend == "vllm" else "",
        "gpus": gpu_placement(model.gpus, model.gpu_span, kind, gpu_count, () if model.backend == "vllm" else reserved),
    }
    as_configured = {f.name: getattr(model, f.name) for f in dataclasses.fields(ServingValues) if f.name not in derived}
    return ServingValues(**as_configured, **derived)


def with_variant(model: ModelSpec, **changes: Any) -> ModelSpec:
    """The model with some settings changed (a tuning variant)."""
    return dataclasses.replace(model, **changes)


# ---------------------------------------------------------------- specs as Snakemake params


def to_param(spec: Any) -> dict[str, Any]:
    """A spec as a plain dict for a rule's `params`: Snakemake compares params by repr() of builtin types
    only (a dataclass would be skipped silently and a change would not rerun the rule)."""
    return dataclasses.asdict(spec)


def from_param(cls: type, data: dict[str, Any]) -> Any:
    """The spec `to_param` flattened (nested specs and tuples restored)."""
    import typing

    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        value = data[field.name]
        kinds = [t for t in typing.get_args(hints[field.name]) or [hints[field.name]] if dataclasses.is_dataclass(t)]
        if kinds and isinstance(value, dict):
            value = from_param(kinds[0], value)
        elif isinstance(value, list):
            value = tuple(value)
        values[field.name] = value
    return cls(**values)
