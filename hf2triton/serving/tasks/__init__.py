"""Task heads, one module per task, each an `Engine` subclass (base.py) with the same steps: tokenise the request's
texts, run the runtime, shape the answer. The registry maps a task to its module and class: a new task is one
module here and one line in ENGINES (render copies only the model's task module, found here too).
"""

from __future__ import annotations

import importlib
from typing import Any

from .. import interface

# task -> (module in this package, class)
ENGINES = {
    interface.FEATURE_EXTRACTION: ("embedding", "EmbeddingEngine"),
    interface.CLASSIFICATION: ("classification", "ClassificationEngine"),
    interface.GENERATION: ("generation", "GenerationEngine"),
    interface.TOKEN_CLASSIFICATION: ("token_classification", "TokenClassificationEngine"),
    interface.FILL_MASK: ("fill_mask", "FillMaskEngine"),
    interface.TEXT_RANKING: ("text_ranking", "TextRankingEngine"),
    interface.TEXT2TEXT: ("text2text", "Text2TextEngine"),
    interface.IMAGE_CLASSIFICATION: ("vision", "ImageClassificationEngine"),
    interface.ZERO_SHOT_IMAGE_CLASSIFICATION: ("vision", "ZeroShotImageEngine"),
    interface.SPEECH_RECOGNITION: ("speech", "SpeechEngine"),
}
# a streaming model's batcher module (in serving/), by task (and backend); the causal one (preallocated cache on a
# GPU) otherwise
BATCHERS = {interface.TEXT2TEXT: "batching.seq2seq", (interface.GENERATION, "onnx"): "batching.onnx"}


def batcher_module(task: str, backend: str = "python") -> str:
    """The module whose `new_batcher` builds a streaming model's batcher (vLLM's engine batches itself)."""
    return BATCHERS.get((task, backend)) or BATCHERS.get(task, "batching.slots")


def engine_class(task: str) -> type:
    """The task's engine class, its module imported only now."""
    module, name = ENGINES[task]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def engine_from_parameters(
    params: interface.ModelParameters, device: str = "cpu", *, serving: bool = False, log=print, instance: dict[str, str] | None = None
) -> Any:
    """Build the engine a config.pbtxt `parameters` block describes; the one place an engine is chosen.

    backend vllm: inside its Triton model (`serving`) vLLM's engine (VllmEngine: it runs only in the vLLM
    environment; `instance`, Triton's initialize() args, says which of the model's frontends this is); elsewhere the
    same saved model on torch, what stands for it outside its Triton model (validation's reference, bench's
    yardstick)."""
    if serving and params.backend == "vllm":
        return importlib.import_module(f"{__name__}.generation").VllmEngine(params, device, log, instance or {})
    return engine_class(params.task)(
        params.model_dir,
        device=device,
        dtype=params.dtype,
        num_threads=params.num_threads,
        backend="python" if params.backend == "vllm" else params.backend,
        onnx_dir=params.onnx_dir,
        trt_engine=params.trt_engine,
        chat_template=params.chat_template,
        checkpoint_defaults=params.checkpoint_defaults,
        pipeline_task=params.pipeline_task,
        cuda_graphs=params.cuda_graphs,
        stride=params.stride,
        max_image_pixels=params.max_image_pixels,
        max_audio_seconds=params.max_audio_seconds,
        chunk_length_s=params.chunk_length_s,
    )
