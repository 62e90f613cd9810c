"""Runtimes: what runs a task's network, one module per backend behind one small interface.

Each module has `load(spec: RuntimeSpec)`, returning a model that answers like a transformers one: `.config`, and
`model(**batch).<output>` for an encoder (`batch`: input_ids / attention_mask / token_type_ids tensors), or
`generate(...)` for a decoder. The task heads (hf2triton.serving.tasks) tokenise, pad, pool and shape the answers
the same way whichever runtime computed them. The backend picks the module once (`load_runtime`); a new runtime
is a module here and one line in RUNTIMES.

Streaming generation runs behind a batcher instead (`submit` / `stop`): the torch continuous batcher
(hf2triton.serving.batching) or, for backend vllm, vLLM's engine (vllm.py). graphs.py holds the CUDA graph
buckets the torch and ONNX Runtime encoders replay on a GPU. Copied next to model.py as the model needs them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

RUNTIMES = {"python": "pytorch", "onnx": "onnxruntime", "tensorrt": "tensorrt"}  # backend -> module


@dataclass(frozen=True)
class RuntimeSpec:
    """What a runtime loads: a saved model (its ONNX export / TensorRT engine) for one task on one device."""

    model_dir: str
    device: str = "cpu"
    dtype: str = "auto"
    num_threads: int = 0
    onnx_dir: str = ""
    trt_engine: str = ""
    auto_class: str = ""  # the transformers class of the task (torch)
    output: str = ""  # the network output the task's head reads: last_hidden_state, logits (ONNX Runtime, TensorRT)
    decoder: bool = False  # text generation: ONNX Runtime runs its KV-cache decoder loop
    cuda_graphs: bool = False


def runtime_module(backend: str) -> str:
    """The module (in this package) that runs `backend`."""
    if backend not in RUNTIMES:
        raise ValueError(f"unknown backend {backend!r}")
    return RUNTIMES[backend]


def load_runtime(backend: str, spec: RuntimeSpec) -> Any:
    """The backend's model for `spec` (imported only now: a CPU stub never imports tensorrt)."""
    return importlib.import_module(f"{__name__}.{runtime_module(backend)}").load(spec)
