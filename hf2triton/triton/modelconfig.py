"""config.pbtxt as the real `inference.ModelConfig` protobuf: built from the serving interface, printed
with text_format (always syntactically valid), parsed back for lint, validation, bench and the server."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from hf2triton.serving.interface import PORTABLE_PATHS, ModelParameters, Tensor, task_inputs, task_outputs

# Python-backend parameter: the environment (a directory holding bin/activate) the model's stub runs in
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"
HEADER = "# Rendered by hf2triton from config.yaml; edits are overwritten. Change config.yaml instead.\n"
# Triton's wire datatype -> the config.pbtxt data_type enum.
DATA_TYPES = {"BYTES": mc.TYPE_STRING, "FP32": mc.TYPE_FP32, "INT32": mc.TYPE_INT32, "INT64": mc.TYPE_INT64, "BOOL": mc.TYPE_BOOL}


def _add_tensor(collection, tensor: Tensor, texts_dim: bool, is_input: bool) -> None:
    entry = collection.add(name=tensor.name, data_type=DATA_TYPES[tensor.datatype])
    if is_input:
        entry.optional = tensor.optional
    # Without batching the texts dimension is explicit: clients send [n, *dims] either way (a streaming
    # model takes one prompt per request: no texts dimension).
    entry.dims.extend((-1, *tensor.dims) if texts_dim else tensor.dims)


def build_model_config(
    name: str,
    task: str,
    max_batch_size: int,
    instances: int,
    kind: str,
    max_queue_delay_us: int,
    parameters: dict[str, str],
    embedding_dim: int | None = None,
    queue: tuple[int, float] | None = None,
    streaming: bool = False,
    execution_env: str = "",
    gpus: tuple[int, ...] = (0,),
) -> mc.ModelConfig:
    """`queue` = (max waiting requests, seconds a request may wait; 0 = unbounded): Triton refuses requests beyond them.
    `streaming`: a decoupled generation model (one prompt per request, any number of responses; it batches
    continuously itself, so Triton does not: max_batch_size 0). `execution_env`: a venv directory Triton's Python
    backend activates before it starts this model's stub (backend vllm: its own torch; hf2triton.envs). `gpus`: a GPU
    model's GPUs (a vllm engine: the first of those it spans, where Triton starts its one instance)."""
    if streaming:
        max_batch_size = 0
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    texts_dim = max_batch_size == 0 and not streaming
    for tensor in task_inputs(task, streaming):
        _add_tensor(config.input, tensor, texts_dim, True)
    for tensor in task_outputs(task, embedding_dim, streaming):
        _add_tensor(config.output, tensor, texts_dim, False)
    if streaming:
        config.model_transaction_policy.decoupled = True
    group = config.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.Kind.Value(kind))
    if kind == "KIND_GPU":  # `instances` on each of these GPUs
        group.gpus.extend(gpus or (0,))
    if max_batch_size > 0:
        config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
        if queue and any(queue):  # opt-in: any policy disables Triton's prefetching (lone requests stall up to 500 ms)
            policy = config.dynamic_batching.default_queue_policy
            policy.max_queue_size, timeout_s = queue
            policy.timeout_action = mc.ModelQueuePolicy.REJECT
            policy.default_timeout_microseconds = round(timeout_s * 1_000_000)
            policy.allow_timeout_override = timeout_s > 0  # a client's own shorter timeout is honoured
    for key, value in sorted(parameters.items()):
        config.parameters[key].string_value = str(value)
    if execution_env:
        config.parameters[EXECUTION_ENV_PATH].string_value = execution_env
    return config


def config_text(config: mc.ModelConfig) -> str:
    return HEADER + text_format.MessageToString(config)


def read_model_config(path: Path | str) -> mc.ModelConfig:
    """Parse a config.pbtxt with the real ModelConfig protobuf (raises OSError / text_format.ParseError)."""
    return text_format.Parse(Path(path).read_text(encoding="utf-8"), mc.ModelConfig())


def read_model_config_or_none(path: Path | str) -> mc.ModelConfig | None:
    """The parsed config.pbtxt, or None where it is missing or unreadable (the lint reports why)."""
    try:
        return read_model_config(path)
    except (OSError, UnicodeDecodeError, text_format.ParseError):
        return None


def model_parameters(config: mc.ModelConfig) -> ModelParameters:
    """The typed `parameters` block model.py reads."""
    return ModelParameters.from_strings({key: value.string_value for key, value in config.parameters.items()})


def located_config(config: mc.ModelConfig, version_dir: Path | str) -> mc.ModelConfig:
    """A copy whose file parameters are absolute (ModelParameters.located): what in-process references load, for a
    published repository's relative paths as for a rendered one's absolute ones."""
    located = mc.ModelConfig()
    located.CopyFrom(config)
    params = model_parameters(config).located(str(version_dir))
    for key in PORTABLE_PATHS:
        if key in located.parameters:
            located.parameters[key].string_value = getattr(params, key)
    return located


def instance_count(config: mc.ModelConfig | None) -> int:
    return (sum(group.count or 1 for group in config.instance_group) or 1) if config else 1


def config_gpus(config: mc.ModelConfig) -> tuple[int, ...]:
    """The GPUs a model's config names: its GPU instance groups' and, for a vllm engine, those it spans."""
    named = {gpu for group in config.instance_group if group.kind == mc.ModelInstanceGroup.KIND_GPU for gpu in group.gpus}
    spans = model_parameters(config).vllm_gpus
    return tuple(sorted(named | {int(gpu) for gpu in spans.split(",") if gpu}))


def uses_gpu(config: mc.ModelConfig) -> bool:
    return any(group.kind == mc.ModelInstanceGroup.KIND_GPU for group in config.instance_group)
