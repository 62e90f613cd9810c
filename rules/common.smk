# Helpers shared by the rule files -- the validated config, paths of artifacts, per-model params.
# Config is validated here, at parse time, so any mistake stops the run before any work.
import os
import re
import sys
from pathlib import Path

from hf2triton import host, render
from hf2triton.config import load_config, model_by_name
from hf2triton.errors import UserError
from hf2triton.export import EXPORT_VERSION
from hf2triton.locks import clear_stale_locks
from hf2triton.sources import package_version, resolve_model_sources
from hf2triton.tensorrt import require_tensorrt

# config.yaml next to the Snakefile, or the file $HF2TRITON_CONFIG names (read by hf2triton's bounded
# YAML loader); --config/--configfile values merge over it.
CONFIG_FILE = os.environ.get("HF2TRITON_CONFIG") or str(Path(workflow.basedir) / "config.yaml")

try:
    CFG = load_config(CONFIG_FILE, overrides=config)
    SOURCES, LOCAL_SOURCES = resolve_model_sources(CFG["models"])
    require_tensorrt(CFG["models"], host.has_gpu())
except UserError as err:
    sys.exit(f"hf2triton: error: {err.render()}")

if clear_stale_locks(Path.cwd()):
    print("hf2triton: removed the locks of an earlier run that was killed; resuming", file=sys.stderr)

WORK = CFG["paths"]["work"]
MODELS = [m["name"] for m in CFG["models"]]
GPU_AVAILABLE = host.has_gpu()
REPOSITORY = "model_repository"
SERVING_CODE = str(Path(workflow.basedir) / "hf2triton" / "serving" / "model.py")  # copied as 1/model.py


def model_value(key):
    """Input function: one config value of the wildcard's model (so params are exact per model)."""
    return lambda wildcards: model_by_name(CFG, wildcards.model)[key]


def pretrained_dir(name):
    return f"{WORK}/models/{name}/pretrained"


def local_source(wildcards):
    """A local source is an input of fetch: editing it refetches that model. Package sources are
    tracked by their package version instead (a rebuilt venv gives them new mtimes, not new content)."""
    source = SOURCES[wildcards.model]
    return [LOCAL_SOURCES[wildcards.model]] if source.kind == "local" else []


def source_version(wildcards):
    return package_version(SOURCES[wildcards.model])


def instance_kind(wildcards):
    return render.instance_kind(model_by_name(CFG, wildcards.model)["device"], GPU_AVAILABLE)


def threads_per_instance(wildcards):
    return render.threads_per_instance(model_by_name(CFG, wildcards.model)["instances"], host.cpu_count())


def generation_options(wildcards):
    model = model_by_name(CFG, wildcards.model)
    return model.get("generation") if model["task"] == "text-generation" else None


def queue_delay_us(wildcards):
    return model_by_name(CFG, wildcards.model)["dynamic_batching"]["max_queue_delay_us"]


def repository_of(wildcards, input):
    """The repository root, derived from the rendered model directories that are inputs."""
    return str(Path(input.repository[0]).parent)


def repository_inputs(wildcards):
    """What a model's repository is rendered from: the saved model, plus its ONNX export / TensorRT
    engine when the backend needs them, plus the serving code (so code changes re-render)."""
    backend = model_by_name(CFG, wildcards.model)["backend"]
    inputs = {"pretrained": pretrained_dir(wildcards.model), "serving_code": SERVING_CODE}
    if backend in ("onnx", "tensorrt"):
        inputs["onnx"] = onnx_dir(wildcards.model)
    if backend == "tensorrt":
        inputs["trt_engine"] = f"{WORK}/models/{wildcards.model}/tensorrt/engine.plan"
    return inputs


def onnx_dir(name):
    return f"{WORK}/models/{name}/onnx"


def onnx_value(key):
    return lambda wildcards: model_by_name(CFG, wildcards.model)["onnx"][key]



def preflight_models():
    """Only the model keys preflight uses, so e.g. a max_batch_size change does not rerun it."""
    keys = ("name", "source", "task", "device", "dtype", "instances", "backend")
    return [{key: model[key] for key in keys} for model in CFG["models"]]


def tuned_models(wildcards=None):
    """The models `tune` sweeps: config tune.models, or every model except text-generation ones."""
    names = CFG["tune"]["models"] or [m["name"] for m in CFG["models"] if m["task"] != "text-generation"]
    return [model_by_name(CFG, name) for name in names]


def tune_inputs(wildcards):
    """Artifacts the sweep renders variants from; an ONNX export is built on demand when a tried backend needs it."""
    inputs = {"serving_code": SERVING_CODE}
    for model in tuned_models():
        name, backends = model["name"], set(CFG["tune"]["backends"] or [model["backend"]])
        inputs[f"{name}__pretrained"] = pretrained_dir(name)
        if backends & {"onnx", "tensorrt"}:
            inputs[f"{name}__onnx"] = onnx_dir(name)
        if "tensorrt" in backends:
            inputs[f"{name}__trt_engine"] = f"{WORK}/models/{name}/tensorrt/engine.plan"
    return inputs
