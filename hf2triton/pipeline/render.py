"""Step `repository`: render model_repository/<name>/config.pbtxt and 1/{model.py,interface.py,...} for one model.

config.pbtxt is built as a real `inference.ModelConfig` protobuf (hf2triton.triton.modelconfig) from the
model's derived serving values; the serving code is the package's own, copied verbatim. A backend vllm model
also names the venv Triton runs its stub in (EXECUTION_ENV_PATH; hf2triton.envs).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path

from hf2triton.envs import check_vllm_env
from hf2triton.errors import UserError
from hf2triton.fsutil import atomic_directory
from hf2triton.integrity import write_manifest
from hf2triton.serving import pooling
from hf2triton.serving.interface import DEFAULT_TOOL_PARSER, FEATURE_EXTRACTION, NO_STRIDE, ModelParameters
from hf2triton.serving.runtimes import runtime_module
from hf2triton.serving.tasks import ENGINES, batcher_module
from hf2triton.specs import VLLM_MAX_MODEL_LEN, ServingValues, VllmSpec, from_param
from hf2triton.triton import modelconfig
from hf2triton.triton.modelconfig import HEADER, build_model_config, config_text

log = logging.getLogger(__name__)

SERVING_DIR = Path(__file__).resolve().parent.parent / "serving"
# the code that writes a rendered model (this module, config.pbtxt's builder): inputs of the repository rule with the
# serving code, so a change to it renders the models again (as EXPORT_VERSION does for exports)
RENDER_CODE = (Path(__file__).resolve(), Path(modelconfig.__file__).resolve())
SERVING_MODULE = SERVING_DIR / "model.py"
# All the serving code (its package's own __init__.py aside: a rendered model.py makes its directory the package);
# each model gets the part of it `serving_files` names.
SERVING_FILES = tuple(sorted(p for p in SERVING_DIR.rglob("*.py") if p != SERVING_DIR / "__init__.py"))
VERSION = "1"


def serving_files(serving: ServingValues) -> tuple[Path, ...]:
    """The serving modules a model's version directory gets, copied to their paths in SERVING_DIR; the one place
    this is decided (rules/common.smk makes them the repository rule's inputs, so their changes re-render).

    What model.py loads for every model (the request checks, the task registry, streaming's request types), the
    model's task head (tasks.ENGINES) and its backend's runtime (runtimes.RUNTIMES; backend vllm: vLLM's), the torch
    continuous batcher for a streaming torch model -- and whatever those import, found in their own imports. So a
    CPU embedder carries no TensorRT, vLLM or batcher code, and a new module is copied wherever it is imported."""
    streaming = bool(serving.generation and serving.generation.streaming)
    roots = ["model.py", "interface.py", "inputs.py", "batching/sequences.py", "tasks/__init__.py", f"tasks/{ENGINES[serving.task][0]}.py"]
    if serving.backend == "vllm":
        roots.append("runtimes/vllm.py")
    else:
        roots.append(f"runtimes/{runtime_module(serving.backend)}.py")
        if streaming:
            roots += ["batching/responder.py", f"{batcher_module(serving.task, serving.backend).replace('.', '/')}.py"]
    files: set[Path] = set()
    pending = [SERVING_DIR / root for root in roots]
    while pending:
        path = pending.pop()
        if path not in files:
            files.add(path)
            pending += _imported(path)
    return tuple(sorted(files))


def _imported(path: Path) -> list[Path]:
    """The serving files a module needs at import: its package's __init__.py (below SERVING_DIR) and the modules its
    relative imports name (`from .x import y`, `from .. import x`) outside functions. An import inside a function is
    lazy (vLLM's runtime in tasks/generation.py): `serving_files` names its module where a model needs it."""
    needed = [path.parent / "__init__.py"] if path.parent != SERVING_DIR else []
    for node in _outside_functions(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = path.parents[node.level - 1].joinpath(*(node.module or "").split("."))
        if base.is_dir():  # a package: its __init__.py, and the modules (packages) imported from it by name
            named = [base / f"{alias.name}.py" for alias in node.names] + [base / alias.name / "__init__.py" for alias in node.names]
            needed += [file for file in named if file.is_file()] + ([base / "__init__.py"] if base != SERVING_DIR else [])
        else:
            needed.append(base.with_suffix(".py"))
    return needed


def _outside_functions(node: ast.AST):
    """`node` and the nodes below it, those inside function definitions aside."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _outside_functions(child)


def embedding_dim_of(model_dir: Path) -> int | None:
    """The pooled embedding's width: the saved model's hidden_size, once per pooling mode it concatenates."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    hidden = cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("dim")
    return sentence_embedding(model_dir).width(hidden) if hidden else None


def sentence_embedding(model_dir: Path | str) -> pooling.SentenceEmbedding:
    """The model's sentence-transformers description (serving/pooling.py), refused here -- before any server -- when
    hf2triton cannot serve it as sentence-transformers would."""
    try:
        return pooling.read(str(model_dir))
    except ValueError as err:
        fix = "serve a sentence-transformers model of Transformer, Pooling and Normalize modules"
        raise UserError(f"feature-extraction: {err}", fix) from None


def embedding_facts(model_dir: Path | str) -> dict[str, object]:
    """feature-extraction's ModelParameters for clients: prompt names, normalisation, Matryoshka widths."""
    embedding = sentence_embedding(model_dir)
    return {
        "prompt_names": json.dumps(list(embedding.prompts), ensure_ascii=False),
        "normalize": embedding.normalize,
        "matryoshka_dimensions": embedding.matryoshka,
    }


def model_parameters_for(serving: ServingValues, pretrained: str, onnx_dir: str = "", trt_engine: str = "") -> ModelParameters:
    quantize = "none"
    export = Path(onnx_dir) / "export.json" if onnx_dir else None
    if export is not None and export.is_file():
        quantize = json.loads(export.read_text()).get("quantize", "none")
    extra = dataclasses.asdict(serving.generation) if serving.generation else {}  # its fields are ModelParameters
    if serving.vllm:  # so are these, and the GPUs its engine spans
        extra.update(vllm_parameters(serving.vllm, served_context(serving, pretrained)), vllm_gpus=",".join(map(str, serving.gpus)))
    if serving.task == FEATURE_EXTRACTION:
        extra.update(embedding_facts(pretrained))
    # every serving value model.py reads has a ModelParameters field of the same name
    shared = {f.name: getattr(serving, f.name) for f in dataclasses.fields(ModelParameters) if hasattr(serving, f.name)}
    return ModelParameters(
        **shared,
        model_dir=str(Path(pretrained).resolve()),
        onnx_dir=str(Path(onnx_dir).resolve()) if onnx_dir else "",
        quantize=quantize,
        trt_engine=str(Path(trt_engine).resolve()) if trt_engine else "",
        **extra,
    )


def context_length(pretrained: Path) -> int | None:
    """Tokens the saved model attends to at most (prompt + generated), from its config.json."""
    cfg = json.loads((Path(pretrained) / "config.json").read_text())
    values = [cfg.get(key) for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")]
    return min((int(v) for v in values if isinstance(v, (int, float)) and v > 0), default=None)


def served_context(serving: ServingValues, pretrained: str) -> int | None:
    """Tokens per sequence the model is served with: its context, or for backend vllm vllm.max_model_len (null:
    the context, at most VLLM_MAX_MODEL_LEN, so a model claiming a million tokens does not make vLLM reserve them)."""
    context = context_length(Path(pretrained)) if (Path(pretrained) / "config.json").is_file() else None
    if serving.vllm is None:
        return context
    wanted = serving.vllm.max_model_len
    if wanted and context is not None and wanted > context:
        raise UserError(
            f"model {serving.name}: vllm.max_model_len = {wanted} exceeds the model's context of {context} tokens",
            f"set vllm.max_model_len for {serving.name} to at most {context}, or leave it null (the model's context)",
        )
    return wanted or min(context or VLLM_MAX_MODEL_LEN, VLLM_MAX_MODEL_LEN)


def vllm_parameters(vllm: VllmSpec, context: int | None) -> dict[str, object]:
    """VllmSpec as ModelParameters fields, nulls resolved: max_model_len the served context; 0 / "" (vLLM's default
    step size / the checkpoint's own quantization) for the others."""
    values = dataclasses.asdict(vllm)
    values.update(
        max_model_len=context or VLLM_MAX_MODEL_LEN,
        max_num_batched_tokens=vllm.max_num_batched_tokens or 0,
        quantization=vllm.quantization or "",
        async_scheduling="" if vllm.async_scheduling is None else str(vllm.async_scheduling).lower(),
    )
    return values


def check_generation_fits(serving: ServingValues, pretrained: str) -> None:
    """Refuse a default max_new_tokens that leaves no room for a prompt, before the server is touched (every
    request without its own value would fail)."""
    if not serving.generation:
        return
    context = served_context(serving, pretrained)
    wanted = serving.generation.max_new_tokens
    if context is not None and wanted >= context:
        raise UserError(
            f"model {serving.name}: generation.max_new_tokens = {wanted} does not fit its context of {context} tokens "
            "(the prompt counts too)",
            f"set generation.max_new_tokens for {serving.name} well below {context} (e.g. {min(256, context // 2)})",
        )


def check_stride_fits(serving: ServingValues, pretrained: str) -> None:
    """Refuse a token_classification.stride the model's windows cannot hold (or a slow tokenizer, which cannot
    window), before the server is touched: the model would fail to load."""
    if serving.stride == NO_STRIDE:
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    where = f"model {serving.name}: token_classification.stride = {serving.stride}"
    if not tokenizer.is_fast:
        raise UserError(f"{where}: windows need a fast (Rust) tokenizer, the model has {type(tokenizer).__name__}", "remove the stride")
    limits = (context_length(Path(pretrained)), tokenizer.model_max_length)
    window = min(int(x) for x in limits if x and 0 < x < 1e9) - tokenizer.num_special_tokens_to_add(pair=False)
    if serving.stride >= window:
        raise UserError(
            f"{where} does not fit its windows of {window} text tokens (the context less the special tokens)",
            f"set token_classification.stride for {serving.name} to 0-{window - 1} (a quarter of the window, {window // 4}, is common)",
        )


def check_tool_template(serving: ServingValues, pretrained: str) -> None:
    """Refuse generation.tool_parser for a model whose chat template does not render tools (it never names `tools`):
    every request with tools would be refused."""
    parser = serving.generation.tool_parser if serving.generation else DEFAULT_TOOL_PARSER
    if parser == DEFAULT_TOOL_PARSER:
        return
    from transformers import AutoTokenizer

    template = AutoTokenizer.from_pretrained(pretrained).chat_template
    sources = template.values() if isinstance(template, dict) else [template or ""]
    if not any("tools" in source for source in sources):
        raise UserError(
            f"model {serving.name}: generation.tool_parser = {parser!r}, but its chat template "
            f"{'does not render tools' if template else 'is missing'} (it never mentions `tools`)",
            f"give {serving.name} a model whose tokenizer_config.json has a chat template with tool support, "
            "or remove generation.tool_parser",
        )


def render_model(output: str, serving: ServingValues, pretrained: str, onnx_dir: str = "", trt_engine: str = "") -> Path:
    """Write the model's repository directory `output` (config.pbtxt + 1/model.py and the serving modules beside it)
    atomically."""
    check_generation_fits(serving, pretrained)
    check_stride_fits(serving, pretrained)
    check_tool_template(serving, pretrained)
    if serving.execution_env:
        check_vllm_env(serving.execution_env)
    parameters = model_parameters_for(serving, pretrained, onnx_dir, trt_engine)
    dim = embedding_dim_of(Path(pretrained)) if serving.task == FEATURE_EXTRACTION else None
    config = build_model_config(
        serving.name,
        serving.task,
        serving.max_batch_size,
        serving.instances,
        serving.kind,
        serving.max_queue_delay_us,
        parameters.to_strings(),
        dim,
        (serving.queue.max_size, serving.queue.timeout_s),
        streaming=bool(serving.generation and serving.generation.streaming),
        execution_env=serving.execution_env,
        gpus=serving.gpus[:1] if serving.backend == "vllm" else serving.gpus,  # vLLM's engine places its own workers
    )
    with atomic_directory(output) as tmp:
        (tmp / "config.pbtxt").write_text(config_text(config))
        (tmp / VERSION).mkdir()
        for source in serving_files(serving):
            target = tmp / VERSION / source.relative_to(SERVING_DIR)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        os.chmod(tmp / VERSION, 0o755)  # noqa: S103 - readable by the server, writable only by us
        write_manifest(tmp)
    log.info("rendered %s (%s, %s x%d, max_batch_size %d)", output, serving.task, serving.kind, serving.instances, serving.max_batch_size)
    return Path(output)


def repository_step(output: str, serving: dict, pretrained: str, onnx_dir: str = "", trt_engine: str = "") -> Path:
    """Rule `repository`: the serving values arrive as a params dict (hf2triton.specs.to_param)."""
    return render_model(output, from_param(ServingValues, serving), pretrained, onnx_dir, trt_engine)


def is_rendered(model_dir: Path) -> bool:
    """A model directory hf2triton rendered (its config.pbtxt starts with our header)."""
    config = model_dir / "config.pbtxt"
    try:
        with config.open(encoding="utf-8") as handle:
            return handle.read(len(HEADER)) == HEADER
    except (OSError, UnicodeDecodeError):
        return False


def prune_repository(repository: str, models: list[str]) -> list[str]:
    """Remove the directories hf2triton rendered for models no longer in the config (a model taken out of
    config.yaml would otherwise stay in the repository and be linted as one); anything else stays."""
    root = Path(repository)
    stale = [p for p in sorted(root.iterdir()) if p.is_dir() and p.name not in models and is_rendered(p)] if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path)
        log.info("removed %s: model %s is no longer in the config", path, path.name)
    return [p.name for p in stale]
