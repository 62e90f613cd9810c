"""Step `repository`: render model_repository/<name>/config.pbtxt and 1/model.py for one model.

config.pbtxt is built as a real `inference.ModelConfig` protobuf and printed with text_format, so it is
always syntactically valid; model.py is the package's serving module, copied verbatim.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from hf2triton.fsutil import atomic_directory

log = logging.getLogger("hf2triton.render")

SERVING_MODULE = Path(__file__).resolve().parent / "serving" / "model.py"
VERSION = "1"
HEADER = "# Rendered by hf2triton from config.yaml; edits are overwritten. Change config.yaml instead.\n"

STRING, FP32, INT32 = mc.TYPE_STRING, mc.TYPE_FP32, mc.TYPE_INT32


def task_io(task: str, embedding_dim: int | None) -> tuple[list[dict], list[dict]]:
    """Inputs and outputs per task. Every tensor has one row per text: clients send shape [n, 1]."""
    text = {"name": "text", "data_type": STRING, "dims": [1]}
    if task == "feature-extraction":
        return [text], [{"name": "embedding", "data_type": FP32, "dims": [embedding_dim or -1]}]
    if task == "text-classification":
        return [text], [{"name": "label", "data_type": STRING, "dims": [1]}, {"name": "score", "data_type": FP32, "dims": [1]}]
    if task == "text-generation":
        inputs = [
            text,
            {"name": "max_new_tokens", "data_type": INT32, "dims": [1], "optional": True},
            {"name": "temperature", "data_type": FP32, "dims": [1], "optional": True},
        ]
        return inputs, [{"name": "text_output", "data_type": STRING, "dims": [1]}]
    raise ValueError(f"unknown task {task!r}")


def build_model_config(
    name: str,
    task: str,
    max_batch_size: int,
    instances: int,
    kind: str,
    max_queue_delay_us: int,
    parameters: dict[str, str],
    embedding_dim: int | None = None,
) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    inputs, outputs = task_io(task, embedding_dim)
    for spec in inputs:
        tensor = config.input.add(name=spec["name"], data_type=spec["data_type"], optional=spec.get("optional", False))
        # Without batching the texts dimension is explicit: clients send [n, 1] either way.
        tensor.dims.extend(spec["dims"] if max_batch_size > 0 else [-1, *spec["dims"]])
    for spec in outputs:
        tensor = config.output.add(name=spec["name"], data_type=spec["data_type"])
        tensor.dims.extend(spec["dims"] if max_batch_size > 0 else [-1, *spec["dims"]])
    group = config.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.Kind.Value(kind))
    if kind == "KIND_GPU":
        group.gpus.append(0)
    if max_batch_size > 0:
        config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    for key, value in sorted(parameters.items()):
        config.parameters[key].string_value = str(value)
    return config


def instance_kind(device: str, gpu_available: bool) -> str:
    """config `device` -> Triton instance kind (auto: the GPU when this machine has one)."""
    return "KIND_GPU" if device == "gpu" or (device == "auto" and gpu_available) else "KIND_CPU"


def threads_per_instance(instances: int, cpus: int) -> int:
    """CPU instances share the machine's cores instead of each taking all of them."""
    return max(1, cpus // instances)


def read_model_config(path: Path | str) -> mc.ModelConfig:
    """Parse a config.pbtxt with the real ModelConfig protobuf (raises OSError / text_format.ParseError)."""
    return text_format.Parse(Path(path).read_text(encoding="utf-8"), mc.ModelConfig())


def config_text(config: mc.ModelConfig) -> str:
    return HEADER + text_format.MessageToString(config)


def embedding_dim_of(model_dir: Path) -> int | None:
    """hidden_size of the saved model (the pooled embedding width)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("dim")


def render_model(
    output: str,
    name: str,
    task: str,
    pretrained: str,
    max_batch_size: int,
    instances: int,
    kind: str,
    dtype: str,
    num_threads: int,
    max_queue_delay_us: int,
    max_input_bytes: int,
    generation: dict[str, Any] | None = None,
    backend: str = "python",
    onnx_dir: str = "",
    trt_engine: str = "",
) -> Path:
    """Write the model's repository directory `output` (config.pbtxt + 1/model.py) atomically."""
    parameters = {
        "task": task,
        "backend": backend,
        "model_dir": str(Path(pretrained).resolve()),
        "dtype": dtype,
        "num_threads": str(num_threads),
        "max_input_bytes": str(max_input_bytes),
    }
    if backend in ("onnx", "tensorrt"):
        parameters["onnx_dir"] = str(Path(onnx_dir).resolve())
        export = Path(onnx_dir) / "export.json"
        parameters["quantize"] = json.loads(export.read_text()).get("quantize", "none") if export.is_file() else "none"
    if backend == "tensorrt":
        parameters["trt_engine"] = str(Path(trt_engine).resolve())
    if task == "text-generation":
        generation = generation or {}
        parameters.update(
            max_new_tokens=str(generation.get("max_new_tokens", 64)),
            temperature=str(generation.get("temperature", 0)),
            chat_template="true" if generation.get("chat_template", True) else "false",
        )
    dim = embedding_dim_of(Path(pretrained)) if task == "feature-extraction" else None
    config = build_model_config(name, task, max_batch_size, instances, kind, max_queue_delay_us, parameters, dim)
    with atomic_directory(output) as tmp:
        (tmp / "config.pbtxt").write_text(config_text(config))
        (tmp / VERSION).mkdir()
        shutil.copyfile(SERVING_MODULE, tmp / VERSION / "model.py")
        os.chmod(tmp / VERSION, 0o755)  # noqa: S103 - readable by the server, writable only by us
    log.info("rendered %s (%s, %s x%d, max_batch_size %d)", output, task, kind, instances, max_batch_size)
    return Path(output)
