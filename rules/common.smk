# Helpers shared by the rule files -- the config as typed specs (read once), one path function per artifact,
# per-model params. Config is validated here, at parse time, so any mistake stops the run before any work.
# Specs reach rules as plain dicts (to_param): Snakemake detects changed params only for builtin types.
import os
import re
import sys
from pathlib import Path

from hf2triton import host
from hf2triton.config import check_project_paths, load_project
from hf2triton.envs import require_vllm_gpu
from hf2triton.gateway.process import exposure as gateway_exposure
from hf2triton.errors import UserError
from hf2triton.integrity import damaged
from hf2triton.locks import clear_stale_locks
from hf2triton.pipeline.export import EXPORT_VERSION
from hf2triton.pipeline.render import RENDER_CODE, SERVING_FILES, serving_files
from hf2triton.pipeline.sources import package_version, resolve_model_sources
from hf2triton.pipeline.tensorrt import require_tensorrt, tensorrt_version
from hf2triton.specs import instance_kind, onnx_precision, require_onnx_on_gpu, reserved_gpus, serving_values, to_param
from hf2triton.triton.settings import REPOSITORY

# config.yaml next to the Snakefile, or the file $HF2TRITON_CONFIG names (read by hf2triton's bounded
# YAML loader); --config/--configfile values merge over it.
CONFIG_FILE = os.environ.get("HF2TRITON_CONFIG") or str(Path(workflow.basedir) / "config.yaml")
GPU_AVAILABLE = host.has_gpu()  # probed once per run
GPU_NAME = host.gpu_name() if GPU_AVAILABLE else "none"

try:
    check_project_paths(str(Path.cwd()), sys.executable)  # a space etc. would break the run late: refused now
    PROJECT = load_project(CONFIG_FILE, overrides=config)
    SOURCES, LOCAL_SOURCES = resolve_model_sources(PROJECT.models)
    require_tensorrt(PROJECT.models, GPU_AVAILABLE)
    require_vllm_gpu(PROJECT.models, GPU_AVAILABLE)
    require_onnx_on_gpu(PROJECT.models, GPU_AVAILABLE)
except UserError as err:
    sys.exit(f"hf2triton: error: {err.render()}")

for inferred in (model for model in PROJECT.models if model.task_inferred_from):
    print(f"hf2triton: {inferred.name}: task: {inferred.task} (inferred from {inferred.task_inferred_from})", file=sys.stderr)

if clear_stale_locks(Path.cwd()):
    print("hf2triton: removed the locks of an earlier run that was killed; resuming", file=sys.stderr)

WORK = PROJECT.work
GPU_COUNT = host.gpu_count() if GPU_AVAILABLE else 0  # `gpus: all` renders this many
RESERVED_GPUS = reserved_gpus(PROJECT.models, GPU_AVAILABLE, GPU_COUNT)  # the vllm engines' GPUs: left out of `all`
MODELS = PROJECT.names
SERVER = to_param(PROJECT.server)
GATEWAY_EXPOSURE = gateway_exposure(PROJECT.openai, PROJECT.server.host)  # the API-key policy's facts ({} on loopback)
SERVING_CODE = [str(path) for path in SERVING_FILES]  # all of it: tune renders variants of every backend


# ---------------------------------------------------------------- paths (one per artifact)


def model_work(name="{model}"):
    return f"{WORK}/models/{name}"


def hub_cache():
    return f"{WORK}/hub"


def fetch_record(name="{model}"):
    return f"{model_work(name)}/fetch.json"


def pretrained_dir(name="{model}"):
    return f"{model_work(name)}/pretrained"


def onnx_dir(name="{model}"):
    return f"{model_work(name)}/onnx"


def trt_engine(name="{model}"):
    return f"{model_work(name)}/tensorrt/engine.plan"


def trt_record(name="{model}"):
    """What the engine was built with (TensorRT version, GPU, profiles): lint reads it."""
    return f"{model_work(name)}/tensorrt/engine.json"


def repository_dir(name="{model}"):
    return f"{REPOSITORY}/{name}"


def results(path):
    return f"results/{path}"


def logs(rule, per_model=True):
    """results/logs/<rule>/<model>.log, or results/logs/<rule>.log for rules that are not per model."""
    return results(f"logs/{rule}/{{model}}.log" if per_model else f"logs/{rule}.log")


# ---------------------------------------------------------------- built artifacts are what gets served


def built_artifacts():
    """label -> directory of every built artifact that carries a manifest (saved model, ONNX export, rendered
    model)."""
    artifacts = {}
    for name in MODELS:
        artifacts.update({f"{name}:pretrained": pretrained_dir(name), f"{name}:repository": repository_dir(name)})
        if PROJECT.model(name).needs_onnx:
            artifacts[f"{name}:onnx"] = onnx_dir(name)
    return artifacts


BUILT = built_artifacts()


def damaged_artifacts():
    """{path: problems} of the built artifacts that no longer match the manifest written when they were built
    (a deleted model.py, a hand-edited config.pbtxt, a truncated weight file). Checked once per run."""
    found = damaged(BUILT)
    for path, what in found.items():
        print(f"hf2triton: {path} changed since it was built ({'; '.join(what[:3])}): building it again", file=sys.stderr)
    return found


DAMAGED = damaged_artifacts()


def force_damaged(name):
    """Called while the DAG is built (from the repository rule's input function): the model's damaged
    artifacts become forced files, so they are rebuilt and the dry run says "Forced execution"."""
    for path in DAMAGED:
        if path in (pretrained_dir(name), onnx_dir(name), repository_dir(name)):
            workflow.dag.forcefiles.add(path)


# ---------------------------------------------------------------- per-model params and inputs


def model_value(key):
    """Input function: one spec value of the wildcard's model (so params are exact per model)."""
    return lambda wildcards: getattr(PROJECT.model(wildcards.model), key)


def onnx_value(key):
    return lambda wildcards: getattr(PROJECT.model(wildcards.model).onnx, key)


def export_precision(wildcards):
    """float16 for ONNX Runtime on a GPU instance, else float32 (hf2triton.specs.onnx_precision)."""
    model = PROJECT.model(wildcards.model)
    kind = instance_kind(model.device, GPU_AVAILABLE)
    return onnx_precision(model.backend, kind, model.dtype, model.task, model.onnx.quantize, model.onnx.exporter)


def serving(wildcards):
    """The model's derived serving values (hf2triton.specs.serving_values): what the repository renders."""
    model = PROJECT.model(wildcards.model)
    return to_param(serving_values(model, GPU_AVAILABLE, host.cpu_count(), PROJECT.vllm_env, GPU_COUNT, RESERVED_GPUS))


def local_source(wildcards):
    """A local source's files are inputs of fetch: a file overwritten in place, added or removed refetches that model
    (the directory's own mtime misses the first). Package sources are tracked by their package version instead (a
    rebuilt venv gives them new mtimes, not new content)."""
    if SOURCES[wildcards.model].kind != "local":
        return []
    root, gguf = Path(LOCAL_SOURCES[wildcards.model]), PROJECT.model(wildcards.model).gguf_file
    if root.is_file() or gguf:
        return [str(root / gguf if gguf and root.is_dir() else root)]
    return sorted(str(path) for path in root.rglob("*") if path.is_file() and ".cache" not in path.parts)


def source_version(wildcards):
    return package_version(SOURCES[wildcards.model])


def repository_of(wildcards, input):
    """The repository root, derived from the rendered model directory (or directories) that are inputs."""
    rendered = input.repository
    return str(Path(rendered if isinstance(rendered, str) else rendered[0]).parent)


def work_of(wildcards, input):
    """paths.work, derived from the saved models that are inputs (<work>/models/<name>/pretrained)."""
    return str(next(Path(path) for path in input.built if Path(path).name == "pretrained").parents[2])


def artifacts(name, backends):
    """What a model is served from: the saved model, plus its ONNX export / TensorRT engine when a backend
    needs them."""
    inputs = {"pretrained": pretrained_dir(name)}
    if set(backends) & {"onnx", "tensorrt"}:
        inputs["onnx"] = onnx_dir(name)
    if "tensorrt" in backends:
        inputs["trt_engine"] = trt_engine(name)
    return inputs


def repository_inputs(wildcards):
    """Artifacts of the model's backend plus the serving code copied into it (so its code changes re-render)."""
    force_damaged(wildcards.model)
    values = serving_values(PROJECT.model(wildcards.model), GPU_AVAILABLE, host.cpu_count(), PROJECT.vllm_env)
    code = [str(path) for path in (*serving_files(values), *RENDER_CODE)]
    return {**artifacts(wildcards.model, [PROJECT.model(wildcards.model).backend]), "serving_code": code}


def preflight_models():
    """Only what preflight uses of each model (its memory at its limits), so e.g. a queue setting does not rerun it."""
    return [to_param(model.footprint()) for model in PROJECT.models]


def tune_inputs(wildcards):
    """Artifacts the sweep renders variants from; an ONNX export is built on demand when a tried backend needs it."""
    inputs = {"serving_code": SERVING_CODE}
    for model in PROJECT.tuned_models():
        # the current backend too: the sweep always measures the current settings
        for key, path in artifacts(model.name, {*PROJECT.tune.backends, model.backend}).items():
            inputs[f"{model.name}__{key}"] = path
    return inputs


# ---------------------------------------------------------------- publishing (rules/publish.smk)


def published_url(path):
    return f"{PROJECT.publish.url}/{path}"


def execution_env_archive():
    """The packed environment every published model carries (publish.execution_env)."""
    return f"{WORK}/execution_env/python_env.tar.gz"


def publish_inputs(wildcards):
    """The rendered model, what its parameters name (so a rebuilt export republishes), the validation, and the
    packed execution environment when one is configured."""
    env = {"execution_env": execution_env_archive()} if PROJECT.publish.execution_env else {}
    return {
        "repository": repository_dir(wildcards.model),
        **artifacts(wildcards.model, [PROJECT.model(wildcards.model).backend]),
        "validated": rules.validate.output.json,
        **env,
    }
