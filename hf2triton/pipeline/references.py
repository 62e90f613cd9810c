"""Validation's in-process reference answers (the saved model run without Triton), remembered between serves.

Every `serve` compares what the server answers with the saved model run in-process (transformers' pipeline, the
engine without Triton). For a model whose files did not change, that reference answer is the same every time, yet
computing it imports torch and transformers and loads the model again: seconds of CPU per model on every re-serve
(the supervisor's restarts, a restored session, a config change to another model). The answer is kept here, keyed by
everything it depends on, and the served answer is still compared with it on every serve.

The key: the model's files (the sha256 digests of the manifest its build wrote, hf2triton.integrity; a model
without a manifest, or whose files no longer match it, is never taken from here), the reference's own arguments
(probe texts, device, dtype, ...), hf2triton's source and the versions of the libraries that compute it. Only CPU
references are kept: a GPU's answer may depend on the card and its kernels. `HF2TRITON_CACHE` names the folder
(default: `$XDG_CACHE_HOME/hf2triton` or `~/.cache/hf2triton`); `HF2TRITON_CACHE=off` turns it off.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from hf2triton import integrity
from hf2triton.pipeline.audio_probes import pipeline_speech_answers
from hf2triton.pipeline.pipeline_answers import JSON_ANSWERS, cross_encoder_scores, pipeline_answers, sentence_embeddings
from hf2triton.pipeline.text_probes import RANKING_QUERY
from hf2triton.serving import interface
from hf2triton.serving.interface import GENERATIVE_TASKS, NON_TEXT_TASKS, PORTABLE_PATHS, ModelParameters
from hf2triton.triton.modelconfig import model_parameters, uses_gpu

log = logging.getLogger(__name__)

T = TypeVar("T")
CACHE_ENV = "HF2TRITON_CACHE"
OFF = "off"
FOLDER = "references"
UNUSED_DAYS = 30  # an entry no serve has read for this long is deleted when another is written (old code versions)
REMEMBERED: list[str] = []  # the kinds answered from the cache in this process, in order (validation's report says so)
VALIDATION_MAX_NEW_TOKENS = 24
# Greedy, whatever generation.temperature is configured: served, gRPC and in-process answers must be equal.
VALIDATION_OPTIONS = {interface.MAX_NEW_TOKENS: VALIDATION_MAX_NEW_TOKENS, interface.TEMPERATURE: 0.0}
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "sentencepiece", "pillow", "soundfile")


def cache_root() -> Path | None:
    """The references' folder, or None when HF2TRITON_CACHE=off."""
    chosen = os.environ.get(CACHE_ENV, "")
    if chosen.lower() == OFF:
        return None
    if chosen:
        return Path(chosen).expanduser() / FOLDER
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hf2triton" / FOLDER


@functools.cache
def code_version() -> str:
    """hf2triton's source (every module: a reference runs engines, pipelines and probes from all over the package)
    and the versions of the libraries that compute the answers."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for name in LIBRARIES:
        try:
            digest.update(f"{name}=={metadata.version(name)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name} absent\0".encode())
    return digest.hexdigest()


def model_files(model_dir: str) -> dict[str, str] | None:
    """{relative path: sha256} of a built model's files, from its manifest; None when it has none or its files
    changed since (then the reference is computed, never remembered)."""
    manifest = Path(model_dir) / integrity.MANIFEST
    if not manifest.is_file() or integrity.problems(model_dir):
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
        return {name: facts["sha256"] for name, facts in sorted(files.items())}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prune(root: Path, days: float = UNUSED_DAYS) -> None:
    """Delete the entries not read or written for `days` (those of earlier code versions, models since changed)."""
    oldest = time.time() - days * 86400
    for entry in root.glob("*.pickle"):
        try:
            if entry.stat().st_mtime < oldest:
                entry.unlink()
        except OSError:  # another serve pruned or replaced it first
            pass


def portable(parameters: ModelParameters) -> dict[str, Any]:
    """A model's parameters without the paths to its files (those are keyed by their contents: the same model built
    in another folder is the same reference)."""
    return {k: v for k, v in dataclasses.asdict(parameters).items() if k not in PORTABLE_PATHS}


def _digest(value: object) -> str:
    """JSON for what json cannot write: an image's or audio's bytes by their digest."""
    if isinstance(value, bytes | bytearray):
        return "sha256:" + hashlib.sha256(value).hexdigest()
    raise TypeError(f"{type(value).__name__} is not a reference argument")


def remembered(kind: str, model_dir: str, device: str, arguments: dict[str, Any], compute: Callable[[], T]) -> T:
    """`compute()`'s answer: from the cache when the same reference (`kind` with these `arguments`, on `device`) was
    computed before for the same files and code, else computed and kept. Any trouble with the cache (unwritable,
    a damaged entry) computes the answer as if there were none."""
    root = cache_root()
    files = model_files(model_dir) if root and device == "cpu" else None
    if root is None or files is None:
        return compute()
    facts = {"kind": kind, "device": device, "arguments": arguments, "files": files, "code": code_version()}
    key = json.dumps(facts, sort_keys=True, default=_digest)
    entry = root / f"{hashlib.sha256(key.encode()).hexdigest()}.pickle"
    try:
        with entry.open("rb") as handle:
            stored_key, answer = pickle.load(handle)  # noqa: S301 - written by this function, in the user's own cache
        if stored_key == key:
            log.info("in-process reference (%s) of %s: remembered (%s)", kind, model_dir, entry)
            REMEMBERED.append(kind)
            os.utime(entry)  # in use: kept by prune()
            return answer
    except FileNotFoundError:
        pass
    except Exception as err:  # noqa: BLE001 - a damaged entry is recomputed and overwritten
        log.warning("in-process reference cache entry %s unreadable (%s): computing it again", entry, err)
    answer = compute()
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent)
        with os.fdopen(fd, "wb") as handle:
            pickle.dump((key, answer), handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, entry)
        prune(root)
    except OSError as err:
        log.warning("in-process reference not kept in %s: %s", root, err)
    return answer


def remembered_call(function: Callable[..., T], device: str, **arguments: Any) -> T:
    """`function(device=device, **arguments)`, `remembered`: the reference's kind is the function's name, its key the
    arguments by name (a ModelParameters without its paths, `portable`), the model's files those of the `model_dir`
    argument, else of the `params` one."""
    model_dir = arguments["model_dir"] if "model_dir" in arguments else arguments["params"].model_dir
    key = {
        name: portable(value) if isinstance(value, ModelParameters) else value for name, value in arguments.items() if name != "model_dir"
    }
    return remembered(function.__name__, model_dir, device, key, lambda: function(device=device, **arguments))


def reference_device(config: mc.ModelConfig) -> str:
    """The device the served model uses: GPU instances are compared with a GPU reference in the same dtype
    (a float32 CPU reference may pick another greedy token than float16 on a GPU)."""
    if uses_gpu(config):
        import torch

        if torch.cuda.is_available():
            return "cuda:0"
    return "cpu"


def reference_outputs(
    config: mc.ModelConfig, texts: list[str], backend: str | None = None, float32_cpu: bool = False
) -> dict[str, np.ndarray]:
    """The saved model run in-process with the same engine model.py uses (no Triton involved);
    `backend="python"` gives the torch reference for the parity gate, `float32_cpu` the full-precision one."""
    params: ModelParameters = model_parameters(config)
    float32_export = params.backend == "onnx" and params.task in NON_TEXT_TASKS  # an image / speech export: on a GPU too
    if backend:
        params = dataclasses.replace(params, backend=backend)
    if float32_cpu or float32_export:
        params = dataclasses.replace(params, dtype="float32")
    device = "cpu" if float32_cpu else reference_device(config)
    return remembered_call(in_process_outputs, device, params=params, texts=texts)


def in_process_outputs(params: ModelParameters, texts: list[str], device: str) -> dict[str, np.ndarray]:
    """The saved model's outputs for `texts`, run in-process on `device` (reference_outputs' answer)."""
    if params.task == interface.SPEECH_RECOGNITION:  # transformers' pipeline itself, on the same decoded audio
        chunked = {"chunk_length_s": params.chunk_length_s} if params.chunk_length_s else {}
        return pipeline_speech_answers(params.model_dir, texts, device, params.dtype, **chunked)
    if params.task in JSON_ANSWERS:  # the reference is transformers' pipeline itself
        return pipeline_answers(params.task, params.model_dir, texts, device, params.dtype, params.stride)
    if params.task == interface.TEXT_RANKING:  # the model in-process on the tokenizer's pair encoding
        return cross_encoder_scores(params.model_dir, RANKING_QUERY, texts, device, params.dtype)
    if params.task == interface.FEATURE_EXTRACTION:  # sentence-transformers' encode(), re-written apart from the engine
        return sentence_embeddings(params.model_dir, texts, device, params.dtype)
    from hf2triton.serving.tasks import engine_from_parameters

    engine = engine_from_parameters(params, device)
    return engine.run(texts, **(VALIDATION_OPTIONS if params.task in GENERATIVE_TASKS else {}))
