"""Step `pretrained`: load the fetched model with transformers and save_pretrained it (model + tokenizer)
into one fixed directory per model. This is what the server loads: safetensors, fast to load, no GGUF
dequantisation at server start."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_directory, free_bytes, human_bytes, tree_size
from hf2triton.integrity import write_manifest
from hf2triton.serving.interface import (
    AUTO_CLASSES,
    CLASSIFICATION,
    FILL_MASK,
    IMAGE_CLASSIFICATION,
    IMAGE_TASKS,
    SPEECH_RECOGNITION,
    TEXT_RANKING,
    TOKEN_CLASSIFICATION,
    auto_class,
)

log = logging.getLogger(__name__)

# Files sentence-transformers keeps next to the HF model; save_pretrained does not copy them.
SENTENCE_TRANSFORMERS_FILES = ["modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"]
SENTENCE_TRANSFORMERS_DIRS = ["1_Pooling", "2_Normalize"]
MANIFEST = "hf2triton.json"


def auto_model_class(task: str, model_dir: str = ""):
    """The transformers class a task's model loads with (a speech model's: by its architectures, CTC or seq2seq)."""
    import transformers

    return getattr(transformers, auto_class(task, model_dir) if model_dir else AUTO_CLASSES[task])


# The head each task's answers come from, and what a checkpoint without it is for instead.
HEADS = {
    TOKEN_CLASSIFICATION: "a token-classification head (a tagger: architectures *ForTokenClassification)",
    FILL_MASK: "a masked-language-model head (architectures *ForMaskedLM)",
    CLASSIFICATION: "a sequence-classification head (architectures *ForSequenceClassification)",
    TEXT_RANKING: "a cross-encoder's one-label head (architectures *ForSequenceClassification, one label)",
    IMAGE_CLASSIFICATION: "an image-classification head (architectures *ForImageClassification)",
}
IMAGE_ONLY_TASKS = (IMAGE_CLASSIFICATION,)  # no tokenizer: the image processor alone prepares the input


def check_head(model, task: str, model_name: str) -> None:
    """Refuse a checkpoint without the task's head, before it is saved and served: transformers would give it a
    randomly initialised one (its answers noise, only a log warning says so), or a reranker's head with several labels
    (it would fail only when Triton loads it)."""
    if task not in HEADS:
        return
    architectures = ", ".join(getattr(model.config, "architectures", None) or ["none named"])
    missing = model.loading_info["missing_keys"]
    if missing:
        raise UserError(
            f"model {model_name}: task {task} needs {HEADS[task]}, and the checkpoint ({architectures}) has no weights for "
            f"{', '.join(sorted(missing)[:4])}{' ...' if len(missing) > 4 else ''}: transformers would add random ones",
            f"use a checkpoint fine-tuned for {task}, or write the task its architectures are for "
            "(a base *Model: feature-extraction; *ForMaskedLM: fill-mask; *ForTokenClassification: token-classification)",
        )
    if task == TEXT_RANKING and model.config.num_labels != 1:
        labels = model.config.num_labels
        raise UserError(
            f"model {model_name}: task text-ranking, but the checkpoint ({architectures}) has {labels} labels "
            f"({', '.join(map(str, model.config.id2label.values()))}), a cross-encoder reranker has one",
            f"a model with {labels} labels is a text-classification model: write task: text-classification; "
            "for reranking use a cross-encoder (one label)",
        )


def load_preprocessors(path: Path, task: str, kwargs: dict[str, Any]) -> list[Any]:
    """What prepares the model's input, saved next to it: the tokenizer (not for an image classifier), for the
    image tasks the image processor (preprocessor_config.json: resize, crop, normalisation), for speech the feature
    extractor (Whisper's log-mel: preprocessor_config.json too)."""
    from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer

    found = [] if task in IMAGE_ONLY_TASKS else [AutoTokenizer.from_pretrained(path, **kwargs)]
    if task in IMAGE_TASKS:
        found.append(AutoImageProcessor.from_pretrained(path))
    if task == SPEECH_RECOGNITION:
        found.append(AutoFeatureExtractor.from_pretrained(path))
    return found


def load_source_model(path: Path, gguf_file: str | None, task: str):
    """Load model and its preprocessors (tokenizer, image processor) with transformers (GGUF through gguf_file=);
    `model.loading_info` says which weights the checkpoint lacked (check_head)."""
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    if gguf_file:
        log.info("loading GGUF %s (dequantising to float32: ~45 s for 135M parameters on 2 cores)", gguf_file)
    try:
        preprocessors = load_preprocessors(path, task, kwargs)
        checked = task in HEADS  # which weights the checkpoint lacked: asked only where a head is checked
        model_class = auto_model_class(task, "" if gguf_file else str(path))
        loaded = model_class.from_pretrained(path, dtype="auto", output_loading_info=checked, **kwargs)
        model, loading_info = loaded if checked else (loaded, {"missing_keys": []})
    except (OSError, ValueError, KeyError) as err:
        raise UserError(
            f"transformers cannot load {path}{'/' + gguf_file if gguf_file else ''} as {task}: {str(err).splitlines()[0][:300]}",
            "check that the source is a transformers model of this task",
        ) from None
    if gguf_file:
        # save_pretrained refuses a model that still carries the GGUF quantisation marker; the weights
        # are already dequantised, so drop it.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
    model.loading_info = loading_info
    return model, preprocessors


def module_dirs(source_dir: Path) -> list[str]:
    """The sentence-transformers module directories modules.json names (the Pooling config may live elsewhere than
    1_Pooling)."""
    try:
        modules = json.loads((source_dir / "modules.json").read_text())
    except (OSError, ValueError):
        return []
    paths = [m.get("path") for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    return [p for p in paths if isinstance(p, str) and p and ".." not in Path(p).parts and not Path(p).is_absolute()]


def estimate_saved_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def pretrained_step(record: str, task: str, output: str, name: str = "") -> dict[str, Any]:
    """Load the source described by the fetch `record` and save it to `output` atomically (`name`: the model's, for
    the errors)."""
    fetched = json.loads(Path(record).read_text())
    source_dir = Path(fetched["path"])
    started = time.monotonic()
    model, preprocessors = load_source_model(source_dir, fetched.get("gguf_file"), task)
    tokenizer = None if task in IMAGE_ONLY_TASKS else preprocessors[0]
    check_head(model, task, name or fetched["source"])
    log.info(
        "loaded %s (%s, %.1fM parameters) in %.1f s",
        fetched["source"],
        type(model).__name__,
        model.num_parameters() / 1e6,
        time.monotonic() - started,
    )
    need = estimate_saved_bytes(model)
    free = free_bytes(Path(output).parent)
    if free < need * 1.1:
        raise UserError(
            f"not enough disk to save {fetched['source']}: needs {human_bytes(need)}, {human_bytes(free)} free at {Path(output).parent}",
            "free space, or point paths.work at a larger disk",
        )
    with atomic_directory(output) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for preprocessor in preprocessors:
            preprocessor.save_pretrained(tmp)
        if not fetched.get("gguf_file"):
            for name in SENTENCE_TRANSFORMERS_FILES:
                if (source_dir / name).is_file():
                    shutil.copy2(source_dir / name, tmp / name)
            for name in dict.fromkeys(SENTENCE_TRANSFORMERS_DIRS + module_dirs(source_dir)):
                if (source_dir / name).is_dir():
                    shutil.copytree(source_dir / name, tmp / name)
        manifest = {
            "source": fetched["source"],
            "resolved_revision": fetched.get("resolved_revision"),
            "task": task,
            "architecture": type(model).__name__,
            "parameters": model.num_parameters(),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "has_chat_template": bool(getattr(tokenizer, "chat_template", None)),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        write_manifest(tmp)  # file digests: a truncated or edited weight file is found before it is served
        manifest["bytes"] = tree_size(tmp)
    log.info("saved %s to %s (%s) in %.1f s total", fetched["source"], output, human_bytes(manifest["bytes"]), time.monotonic() - started)
    return manifest
