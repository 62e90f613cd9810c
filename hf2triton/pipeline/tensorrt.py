"""Step `tensorrt_engine`: build a TensorRT engine from the ONNX export with the real `tensorrt` Python API.

An engine is not portable: it is keyed on the TensorRT version, the GPU name and the ONNX file's hash.
TensorRT 11 removed the FP16/INT8 builder flags (networks are strongly typed): the precision comes from
the ONNX. Optimisation profiles cover batch 1..max_batch_size and sequence length 1..max_length.

TensorRT cannot be installed on the CPU machines this project is developed on, and CI has no GPU: the
build runs wherever `tensorrt` and a CUDA GPU exist; elsewhere `require_tensorrt` stops the run before
any work with a clear message.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_write_json, sha256_file
from hf2triton.specs import ModelSpec

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger(__name__)

UNAVAILABLE_FIX = "use backend: onnx or python for this model, or run on a machine with TensorRT and a CUDA GPU"


@dataclass(frozen=True)
class Profile:
    """min / opt / max shape of one dynamic input [batch, sequence]."""

    name: str
    min: tuple[int, int]
    opt: tuple[int, int]
    max: tuple[int, int]


def profile_shapes(input_names: list[str], max_batch_size: int, max_length: int, typical_length: int = 128) -> list[Profile]:
    """One optimisation profile: batch 1..max_batch_size, sequence 1..max_length, tuned for a full batch of
    typical-length texts."""
    batch = max(1, max_batch_size)
    opt_length = max(1, min(typical_length, max_length))
    return [Profile(name, (1, 1), (batch, opt_length), (batch, max_length)) for name in input_names]


def cache_key(trt_version: str, gpu_name: str, onnx_sha256: str, profiles: list[Profile]) -> str:
    """Engines are valid only for this TensorRT, this GPU, this ONNX graph and these shapes."""
    material = json.dumps(
        {"trt": trt_version, "gpu": gpu_name, "onnx": onnx_sha256, "profiles": [p.__dict__ for p in profiles]}, sort_keys=True
    )
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def tensorrt_version() -> str | None:
    """The installed TensorRT version without importing it (None if not installed)."""
    if importlib.util.find_spec("tensorrt") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt_cu13", "tensorrt_cu12"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def require_tensorrt(models: Sequence[ModelSpec], gpu_available: bool) -> None:
    """Stop before any work if a model asks for backend tensorrt where it cannot run."""
    wanted = [m.name for m in models if m.backend == "tensorrt"]
    if not wanted:
        return
    missing = []
    if tensorrt_version() is None:
        missing.append("TensorRT not installed")
    if not gpu_available:
        missing.append("no CUDA GPU")
    if missing:
        raise UserError(f"backend tensorrt for {', '.join(wanted)}: {' / '.join(missing)}", UNAVAILABLE_FIX)
    if any(m.device == "cpu" for m in models if m.name in wanted):
        raise UserError("backend tensorrt needs device: gpu or auto", "set device: auto for the model")


def engine_staleness(engine_path: Path | str, installed_tensorrt: str | None, gpu: str) -> str | None:
    """Why a built engine cannot run here (another TensorRT or GPU than its engine.json records), or None.
    An engine is not portable; the rule's params rebuild it when either changes, lint catches a copied one."""
    record_path = Path(engine_path).with_suffix(".json")
    if not record_path.is_file():
        return f"{record_path} is missing (the engine's TensorRT version and GPU are unknown)"
    record = json.loads(record_path.read_text())
    if installed_tensorrt and record.get("tensorrt") != installed_tensorrt:
        return f"built with TensorRT {record.get('tensorrt')}, installed is {installed_tensorrt}"
    if gpu and gpu != "none" and record.get("gpu") != gpu:
        return f"built for GPU {record.get('gpu')!r}, this host has {gpu!r}"
    return None


def build_engine(onnx_dir: str, max_batch_size: int, max_length: int, output: str, workspace_gib: int = 4) -> dict[str, Any]:
    """Parse model.onnx, add the optimisation profile, build and serialise the engine to `output`."""
    import tensorrt as trt

    onnx_path = Path(onnx_dir) / "model.onnx"
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch (the only mode since TensorRT 10)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UserError(f"TensorRT cannot parse {onnx_path}: {errors}", "re-export with another onnx.opset, or use backend onnx")
    inputs = [network.get_input(i).name for i in range(network.num_inputs)]
    profiles = profile_shapes(inputs, max_batch_size, max_length)
    profile = builder.create_optimization_profile()
    for shape in profiles:
        profile.set_shape(shape.name, shape.min, shape.opt, shape.max)
    config = builder.create_builder_config()
    config.add_optimization_profile(profile)
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_gib << 30)
    key = cache_key(trt.__version__, host.gpu_name(), sha256_file(onnx_path), profiles)
    started = time.monotonic()
    log.info(
        "building TensorRT %s engine for %s (inputs %s, batch <= %d, length <= %d)",
        trt.__version__,
        onnx_path,
        inputs,
        max_batch_size,
        max_length,
    )
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise UserError(f"TensorRT failed to build an engine from {onnx_path}", "read the TensorRT messages above; or use backend onnx")
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(output).with_suffix(".partial")
    tmp.write_bytes(bytes(serialized))
    tmp.replace(output)
    record = {
        "cache_key": key,
        "tensorrt": trt.__version__,
        "gpu": host.gpu_name(),  # as nvidia-smi names it: the rule's gpu_name param and lint compare the same string
        "profiles": [p.__dict__ for p in profiles],
        "seconds": round(time.monotonic() - started, 1),
    }
    atomic_write_json(Path(output).with_suffix(".json"), record)
    return record


def tensorrt_engine_step(onnx_dir: str, max_batch_size: int, gpu_available: bool, output: str, **_versions: Any) -> dict[str, Any]:
    """Rule `tensorrt_engine`: refuse clearly where TensorRT cannot run, else build (sequence limit from the
    exported model's config). The TensorRT version and GPU name are params only so a change rebuilds."""
    if tensorrt_version() is None or not gpu_available:
        require_tensorrt([ModelSpec(name=Path(output).parent.parent.name, source="-", task="-", backend="tensorrt")], gpu_available)
    config = json.loads((Path(onnx_dir) / "config.json").read_text())
    return build_engine(onnx_dir, max(1, max_batch_size), int(config.get("max_position_embeddings", 512)), output)
