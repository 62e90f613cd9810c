"""Load, validate and complete config.yaml, and read it into typed specs (`load_project`).

Every mistake becomes a UserError whose single line names the key, the value and what is allowed, and it
is raised before any work starts (the Snakefile calls `load_project` at parse time).
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from hf2triton.errors import UserError
from hf2triton.serving.interface import (
    GENERATIVE_TASKS,
    NON_TEXT_TASKS,
    SPEECH_RECOGNITION,
    TASK_ALIASES,
    TEMPERATURES_ALLOWED,
    TEXT2TEXT,
    temperature_problem,
)
from hf2triton.specs import SHELL_METACHARACTERS, ProjectSpec, parse_source, project_spec
from hf2triton.task_inference import infer_entry_task

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"
MAX_CONFIG_BYTES = 1_000_000
MAX_YAML_NODES = 20_000  # far above any real config; stops alias ("billion laughs") bombs early
RESERVED_NAMES = {".", ".."}


def _expanded_size(node: yaml.Node, memo: dict[int, int], active: set[int]) -> int:
    """Number of nodes the document has once every alias is expanded (the cost of using it)."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in active:
        raise UserError("config contains a recursive YAML alias", "write the configuration out plainly")
    active.add(key)
    size = 1
    if isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo, active) + _expanded_size(v, memo, active) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, memo, active) for item in node.value)
    active.discard(key)
    memo[key] = size
    if size > MAX_YAML_NODES:
        raise UserError(
            f"config expands to more than {MAX_YAML_NODES} YAML nodes (an alias bomb?)",
            "write the configuration out plainly, without nested aliases",
        )
    return size


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping: YAML keeps the last silently (a second `server:`
    block drops the first, a repeated max_batch_size overrides the one above it)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) and key_node.value != "<<" else None
                if key is None:
                    continue
                if key in seen:
                    problem = f"key {key!r} appears twice in one mapping (first on line {seen[key]}); YAML would keep only the last"
                    raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _safe_load_bounded(text: str) -> Any:
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {}, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: Path) -> Any:
    """Parse a YAML file safely: bounded size and expansion, strict UTF-8, errors with line numbers."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"config file {path} not found", "create it (see README 'Configuration')") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UserError(f"{path}: {len(data)} bytes is too large for a config", f"keep it under {MAX_CONFIG_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: byte {err.start} is not valid UTF-8", "save the file as UTF-8") from None
    try:
        return _safe_load_bounded(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise UserError(f"{path}: YAML syntax error at {where}: {err.problem}", "fix the YAML at that place") from None
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({err})", "fix the YAML syntax") from None


def deep_merge(base: dict, override: dict) -> dict:
    """Merge `override` into a copy of `base`; mappings merge, everything else (lists too) replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _extend_with_defaults(validator_class):
    """A validator that fills `default:` values in while it validates (as snakemake.utils.validate does)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, subschema in properties.items():
                if "default" in subschema and prop not in instance:
                    instance[prop] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    # JSON Schema counts 8.0 as an integer; here a count, a size or a port is written as a whole number (a float one
    # would fail later, inside a step, as a bare TypeError); a number is finite (.nan compares false with any limit)
    checker = validator_class.TYPE_CHECKER.redefine_many(
        {
            "integer": lambda _, value: isinstance(value, int) and not isinstance(value, bool),
            "number": lambda _, value: isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        }
    )
    return jsonschema.validators.extend(validator_class, {"properties": set_defaults}, type_checker=checker)


_DefaultFillingValidator = _extend_with_defaults(jsonschema.Draft202012Validator)


def _key_path(path) -> str:
    out = "config"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _allowed(error: jsonschema.ValidationError) -> str:
    """Say what the schema allows for this error, in words."""
    kind, spec = error.validator, error.validator_value
    if kind == "enum":
        return "one of " + ", ".join(map(str, spec))
    if kind == "type":
        if spec == "integer" and isinstance(error.instance, float) and error.instance.is_integer():
            return f"a whole number, written without a decimal point ({int(error.instance)})"
        if isinstance(error.instance, float) and not math.isfinite(error.instance):
            bounds = error.schema
            within = f" between {bounds['minimum']} and {bounds['maximum']}" if "minimum" in bounds and "maximum" in bounds else ""
            return f"a finite number{within}"
        return f"a value of type {spec}"
    if kind == "pattern":
        return f"a string matching {spec}"
    if kind in ("minimum", "maximum"):
        bounds = error.schema
        return f"a number between {bounds.get('minimum', '-inf')} and {bounds.get('maximum', 'inf')}"
    if kind == "additionalProperties":
        return "only the keys " + ", ".join(sorted(error.schema.get("properties", {})))
    if kind == "required":
        return "the keys " + ", ".join(spec) + " to be present"
    if kind in ("minItems", "maxItems"):
        return f"between {error.schema.get('minItems', 0)} and {error.schema.get('maxItems', 'any')} entries"
    if kind in ("minLength", "maxLength"):
        return f"a string of {error.schema.get('minLength', 0)} to {error.schema.get('maxLength', 'any')} characters"
    return f"{kind} {spec}"


def _schema_error_line(error: jsonschema.ValidationError) -> UserError:
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(k for k in error.instance if k not in allowed)
        key = _key_path(path + [unknown[0]]) if unknown else _key_path(path)
        close = difflib.get_close_matches(str(unknown[0]), sorted(allowed), n=1) if unknown else []
        if close:  # a typo: max_batch_sise
            return UserError(f"{key}: unknown key", f"did you mean {close[0]!r}? (the keys here: {', '.join(sorted(allowed))})")
        return UserError(f"{key}: unknown key", f"use {_allowed(error)}")
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return UserError(f"{_key_path(path + missing[:1])}: missing", f"add it ({error.message})")
    value = repr(error.instance)
    if len(value) > 80:
        value = value[:77] + "..."
    if error.validator == "enum" and isinstance(error.instance, str):
        close = difflib.get_close_matches(error.instance, [str(v) for v in error.validator_value], n=1)
        if close:  # feature_extraction, sentence-similarity...
            return UserError(f"{_key_path(path)} = {value}: not allowed", f"did you mean {close[0]!r}? (use {_allowed(error)})")
    if error.validator == "type" and error.validator_value == "string" and isinstance(error.instance, (bool, int, float)):
        # YAML reads a bare no / 1.10 as false / 1.1: the text the user wrote needs quotes
        return UserError(f"{_key_path(path)} = {value}: not allowed", "use a string: put the value in quotes ('...')")
    return UserError(f"{_key_path(path)} = {value}: not allowed", f"use {_allowed(error)}")


STREAMING_BACKENDS = ("python", "onnx", "vllm")  # the engines a continuous batcher (or vLLM's own) runs on
TORCH_ONLY_TASKS = (TEXT2TEXT,)  # no ONNX export yet
# automatic-speech-recognition's max_request_bytes unless set: audio files are larger than texts, and the gateway's
# audio endpoints take OpenAI's 25 MB files (openai.max_audio_upload_mib); their duration is bounded on its own
# (max_audio_seconds, before decoding)
SPEECH_REQUEST_BYTES = 32 * 1024 * 1024
# exported to ONNX (ONNX Runtime), but never built into a TensorRT engine: none has run on a GPU for these tasks
NO_TENSORRT_TASKS = ("token-classification", "fill-mask", "text-ranking", *NON_TEXT_TASKS)
# dynamic int8 moves their scores past the parity gate's 1e-3 (measured, tiny tagger / reranker: 0.045 / 0.066)
NO_INT8_TASKS = ("token-classification", "text-ranking")


def _check_gpus(cfg: dict) -> None:
    """`gpus` only where instances run on a GPU; a vllm engine's list names exactly the GPUs it spans."""
    for index, model in enumerate(cfg["models"]):
        where, gpus = f"config.models[{index}]", model.get("gpus")
        if gpus is not None and model["device"] == "cpu":
            raise UserError(f"{where}.gpus = {gpus!r}: the model runs on the CPU (device: cpu)", "remove gpus, or set device: gpu or auto")
        if model["backend"] != "vllm":
            continue
        vllm = model.get("vllm") or {}
        span = vllm.get("tensor_parallel_size", 1) * vllm.get("pipeline_parallel_size", 1)
        if gpus == "all" or (gpus is not None and len(gpus) != span):
            raise UserError(
                f"{where}.gpus = {gpus!r}: a vllm engine spans tensor_parallel_size x pipeline_parallel_size = {span} GPU(s)",
                f"list exactly {span} GPU(s), e.g. gpus: {list(range(span))}, or leave gpus out (GPUs 0..{span - 1})",
            )


def _other_backends(task: str) -> str:
    return "use backend: python or onnx for it" if task in NO_TENSORRT_TASKS else "use backend: python, onnx or tensorrt for it"


def _check_semantics(cfg: dict, explicit_generation: set[int], explicit_onnx: set[int], explicit_vllm: frozenset = frozenset()) -> None:
    """Checks a JSON schema cannot express."""
    seen: dict[str, int] = {}
    for index, model in enumerate(cfg["models"]):
        name = model["name"]
        if name in RESERVED_NAMES or ".." in name:
            raise UserError(f"config.models[{index}].name = {name!r}: not a safe directory name", "use letters, digits, _ . -")
        folded = name.lower()
        if folded in seen:
            raise UserError(
                f"config.models[{index}].name = {name!r}: duplicate of config.models[{seen[folded]}]",
                "give every model a unique name (case-insensitively)",
            )
        seen[folded] = index
        parse_source(model["source"], where=f"config.models[{index}].source")
        if model["task"] not in GENERATIVE_TASKS and index in explicit_generation:
            raise UserError(
                f"config.models[{index}].generation: only for tasks {' and '.join(GENERATIVE_TASKS)} (task is {model['task']})",
                "remove the generation block",
            )
        if model["backend"] in ("python", "vllm") and index in explicit_onnx:
            raise UserError(
                f"config.models[{index}].onnx: only for backend onnx or tensorrt (backend is {model['backend']})",
                "remove the onnx block or change backend",
            )
        if model["backend"] != "vllm" and index in explicit_vllm:
            raise UserError(
                f"config.models[{index}].vllm: only for backend vllm (backend is {model['backend']})",
                "remove the vllm block, or set backend: vllm",
            )
        if model["backend"] == "vllm" and model["task"] != "text-generation":
            raise UserError(
                f"config.models[{index}].backend = 'vllm': only for task text-generation (task is {model['task']})",
                "use backend: python for it" if model["task"] in TORCH_ONLY_TASKS else _other_backends(model["task"]),
            )
        if model["backend"] == "vllm" and model["instances"] != 1:
            raise UserError(
                f"config.models[{index}].instances = {model['instances']}: backend vllm runs one engine (it batches itself)",
                "set instances: 1 and size the running batch with vllm.max_num_seqs; vllm.frontends puts several "
                "processes in front of that engine",
            )
        if model["backend"] == "vllm" and model["device"] == "cpu":
            raise UserError(
                f"config.models[{index}].device = 'cpu': backend vllm runs on a CUDA GPU",
                "set device: auto or gpu, or use backend: python on the CPU",
            )
        if model["backend"] in ("onnx", "tensorrt") and model["task"] in TORCH_ONLY_TASKS:
            raise UserError(
                f"config.models[{index}].backend = {model['backend']!r}: not yet for {model['task']}, torch only (no ONNX export)",
                "use backend torch for it: backend: python",
            )
        if model["backend"] == "tensorrt" and model["task"] in NO_TENSORRT_TASKS:
            raise UserError(
                f"config.models[{index}].backend = 'tensorrt': not built for {model['task']} (its ONNX export runs on ONNX Runtime)",
                "use backend: onnx (or python) for it",
            )
        if model.get("token_classification", {}).get("stride") is not None and model["task"] != "token-classification":
            raise UserError(
                f"config.models[{index}].token_classification.stride: only for task token-classification (task is {model['task']})",
                "remove the token_classification block",
            )
        if model.get("chunk_length_s") and model["task"] != "automatic-speech-recognition":
            raise UserError(
                f"config.models[{index}].chunk_length_s: only for task automatic-speech-recognition (task is {model['task']})",
                "remove chunk_length_s",
            )
        if model.get("continuous_batching") is False and model["task"] != "automatic-speech-recognition":
            raise UserError(
                f"config.models[{index}].continuous_batching: only for task automatic-speech-recognition (task is {model['task']}; "
                "a text-generation or text2text model batches continuously with generation.streaming)",
                "remove continuous_batching",
            )
        if model["backend"] == "tensorrt" and model["task"] == "text-generation":
            raise UserError(
                f"config.models[{index}].backend = 'tensorrt': not supported for text-generation",
                "use backend: onnx (KV-cache decoder) for it",
            )
        generation = model.get("generation") if model["task"] in GENERATIVE_TASKS else None
        if generation is not None and "streaming" not in generation:
            # streaming (continuous batching) on every engine that generates: torch, vLLM's, the ONNX decoder's
            generation["streaming"] = model["backend"] in STREAMING_BACKENDS
        elif generation is not None and not generation["streaming"] and model["backend"] == "vllm":
            raise UserError(
                f"config.models[{index}].generation.streaming = false: backend vllm always streams (a decoupled model)",
                "remove generation.streaming (a request may still ask for one whole answer: stream false)",
            )
        elif generation is not None and generation["streaming"] and model["backend"] not in STREAMING_BACKENDS:
            raise UserError(
                f"config.models[{index}].generation.streaming = true: needs backend python, onnx or vllm (backend is {model['backend']})",
                "use one of those backends, or streaming: false (each request answered whole)",
            )
        if model["onnx"]["exporter"] == "genai-builder" and model["task"] != "text-generation":
            raise UserError(
                f"config.models[{index}].onnx.exporter = 'genai-builder': the builder makes decoder graphs (task is {model['task']})",
                "use exporter: auto or optimum for encoder tasks",
            )
        quantize = model["onnx"]["quantize"]
        if quantize == "dynamic-int8" and model["task"] == "text-generation":
            raise UserError(
                f"config.models[{index}].onnx.quantize: int8 is for encoder tasks only",
                "use quantize: none, or gguf-blocks for a GGUF source (lossless 4-bit)",
            )
        if quantize == "dynamic-int8" and model["task"] in NO_INT8_TASKS:
            raise UserError(
                f"config.models[{index}].onnx.quantize = 'dynamic-int8': {model['task']} answers are held to scores within "
                "1e-3 of torch, and int8 moves them further (measured on a tiny model: 0.045 tagger, 0.066 reranker)",
                "use quantize: none (the float32 export: scores within 1e-5 of torch)",
            )
        if quantize != "none" and model["task"] in NON_TEXT_TASKS:  # optimum's float32 graph, held to torch's answers
            raise UserError(
                f"config.models[{index}].onnx.quantize = {quantize!r}: {model['task']} is exported in float32 only (its "
                "labels and transcripts are held to torch's by the export's parity gate)",
                "use quantize: none",
            )
        if quantize == "gguf-blocks" and not (model.get("gguf_file") or str(model["source"]).endswith(".gguf")):
            raise UserError(
                f"config.models[{index}].onnx.quantize = 'gguf-blocks': source {model['source']!r} is not a GGUF file",
                "use a .gguf source (or gguf_file:), or quantize: none / dynamic-int8",
            )
        queue = model["queue"]
        if model["max_batch_size"] == 0 and (queue["max_size"] or queue["timeout_s"]):
            raise UserError(
                f"config.models[{index}].queue = {queue}: a queue bound needs Triton's dynamic batcher (max_batch_size is 0)",
                "set max_batch_size >= 1, or remove the queue block (max_texts_per_request bounds an unbatched model's requests)",
            )
        if ".." in model["revision"].split("/"):
            raise UserError(f"config.models[{index}].revision = {model['revision']!r}: '..' not allowed", "use a branch, tag or commit")
        parser = model.get("generation", {}).get("tool_parser", "none")
        if parser != "none" and model["task"] != "text-generation":
            raise UserError(
                f"config.models[{index}].generation.tool_parser = {parser!r}: only for task text-generation (task is {model['task']})",
                "remove generation.tool_parser (tool calling needs a chat model's template)",
            )
        # the schema says 0..100; sampling needs 0 (greedy) or >= MIN_TEMPERATURE (1e-45 would give NaN)
        temperature = model.get("generation", {}).get("temperature", 0)
        if temperature_problem(float(temperature)):
            raise UserError(
                f"config.models[{index}].generation.temperature = {temperature!r}: not allowed (sampling divides by it)",
                f"use {TEMPERATURES_ALLOWED}",
            )
    server = cfg["server"]
    ports = {key: server[key] for key in ("http_port", "grpc_port", "metrics_port")}
    by_value: dict[int, str] = {}
    for key, port in ports.items():
        if port in by_value:
            raise UserError(
                f"config.server.{key} = {port}: same as server.{by_value[port]}",
                "give HTTP, gRPC and metrics three different ports",
            )
        by_value[port] = key
    openai = cfg["openai"]
    if openai["enabled"] and openai["port"] in by_value:
        raise UserError(
            f"config.openai.port = {openai['port']}: same as server.{by_value[openai['port']]}",
            "give the gateway a port of its own (e.g. 9000)",
        )
    for key in ("work", "vllm_env"):  # vllm_env: Triton sources <path>/bin/activate in an unquoted bash command
        problem = path_problem(cfg["paths"][key])
        if problem:
            raise UserError(
                f"config.paths.{key} = {cfg['paths'][key]!r}: {problem}", "choose an ASCII path of letters, digits and _ . / - only"
            )


# Why a path cannot hold what gets served (the work directory, the project directory): Triton starts each
# Python-backend stub as `bash -c "exec <stub> <model path> ..."` (unquoted) and LD_PRELOAD splits on spaces
# and colons; the stub embeds Python with an isolated config that reads file names as ASCII whatever the
# locale ("UnicodeEncodeError: 'ascii' codec" on its first import).
PATH_PROBLEMS = (
    (re.compile(r"\s"), "contains a space (or other whitespace)"),
    (re.compile(r"[:\x00]"), "contains a colon"),
    (re.compile(r"[^\x00-\x7f]"), "contains non-ASCII characters (Triton's Python-backend stub reads file names as ASCII)"),
    # that same unquoted bash command (and `source <vllm_env>/bin/activate && ...`) would expand or run these
    (
        re.compile("[" + re.escape("".join(sorted(SHELL_METACHARACTERS))) + "]"),
        "contains a shell metacharacter (" + "".join(sorted(SHELL_METACHARACTERS - set("\n\r\t"))) + ")",
    ),
)


def path_problem(path: str) -> str | None:
    """What makes `path` unusable for the served files (None: usable)."""
    return next((problem for pattern, problem in PATH_PROBLEMS if pattern.search(path)), None)


def check_project_paths(directory: str, python: str) -> None:
    """Refuse, before any work, a project directory or Python that the run would break on later: the steps
    would run (Snakemake puts the Python's path unquoted into each step's command: "bash: /my: No such file
    or directory"), the server would not start (see PATH_PROBLEMS)."""
    fix = (
        "move the project to a directory without spaces, colons, shell metacharacters or non-ASCII characters "
        "(and make its .venv again there)"
    )
    problem = path_problem(directory)
    if problem:
        raise UserError(f"the project directory {directory} {problem}", fix)
    if re.search(r"\s", python):
        raise UserError(
            f"the Python of this run, {python}, contains a space: Snakemake runs every step as `<python> <script>` unquoted", fix
        )


def apply_overrides(cfg: dict) -> dict:
    """Merge `overrides: {<model name>: {key: value}}` (e.g. a tuning overlay) into models[] by name.
    The merged models are then validated like any other (a bad overlay value is named as such)."""
    overrides = cfg.get("overrides")
    models = cfg.get("models")
    if not overrides or not isinstance(overrides, dict) or not isinstance(models, list):
        return cfg
    by_name = {m.get("name"): i for i, m in enumerate(models) if isinstance(m, dict)}
    for name, values in overrides.items():
        if name not in by_name:
            raise UserError(
                f"config.overrides.{name}: no model named {name!r}",
                "use one of " + ", ".join(str(n) for n in by_name) + " (or remove the overlay)",
            )
        if not isinstance(values, dict):
            raise UserError(f"config.overrides.{name} = {values!r}: not a mapping", "give model keys, e.g. {instances: 2}")
        if "name" in values:
            raise UserError(f"config.overrides.{name}.name: a model cannot be renamed by an override", "remove the key")
        models[by_name[name]] = deep_merge(models[by_name[name]], values)
    return cfg


TUNE_BOUNDS = {"max_batch_size": (1, 1024), "instances": (1, 16), "max_queue_delay_us": (0, 10_000_000)}


def _check_tune(cfg: dict) -> None:
    tune, names = cfg["tune"], {m["name"]: m for m in cfg["models"]}
    for name in tune["models"]:
        if name not in names:
            raise UserError(f"config.tune.models: no model named {name!r}", "use one of " + ", ".join(names))
        if names[name]["task"] in GENERATIVE_TASKS and names[name]["generation"].get("streaming"):
            raise UserError(
                f"config.tune.models: {name!r} streams (continuous batching), and tune sweeps the dynamic batching of static models",
                f"remove {name!r} from tune.models (its running batch is generation.max_sequences; `make bench` measures it), "
                "or set its generation.streaming: false",
            )
        if names[name]["task"] in NON_TEXT_TASKS:
            raise UserError(
                f"config.tune.models: {name!r} is an image or speech model ({names[name]['task']}); tune's loads are texts",
                f"remove {name!r} from tune.models",
            )
    for key, (low, high) in TUNE_BOUNDS.items():
        for value in tune[key]:
            if not low <= value <= high:
                raise UserError(f"config.tune.{key}: {value} is out of range", f"use values between {low} and {high}")


def _unshared(value: Any) -> Any:
    """A copy in which no mapping or list appears twice. YAML anchors (`generation: *defaults`) load as one
    object shared by several models, and deepcopy keeps the sharing: filling one model's derived defaults
    would then change the others'."""
    if isinstance(value, dict):
        return {key: _unshared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshared(item) for item in value]
    return copy.copy(value)


def validate_config(raw: Any) -> dict:
    """Validate a parsed config and return it completed with defaults (input is not modified)."""
    if not isinstance(raw, dict):
        raise UserError(
            f"config: the top level is a {type(raw).__name__}, not a mapping",
            "start config.yaml with 'models:' (see README 'Configuration')",
        )
    cfg = _unshared(raw)
    for key in cfg:
        if not isinstance(key, str):
            raise UserError(f"config: key {key!r} is not a string", "use plain names as keys")
    models = cfg.get("models")
    explicit_generation = (
        {i for i, m in enumerate(models) if isinstance(m, dict) and "generation" in m} if isinstance(models, list) else set()
    )
    explicit_onnx = {i for i, m in enumerate(models) if isinstance(m, dict) and "onnx" in m} if isinstance(models, list) else set()
    entries = models if isinstance(models, list) else []
    explicit_vllm = frozenset(i for i, m in enumerate(entries) if isinstance(m, dict) and "vllm" in m)
    cfg = apply_overrides(cfg)
    sized = {i for i, m in enumerate(cfg.get("models") or []) if isinstance(m, dict) and "max_request_bytes" in m}
    server = cfg.get("server")
    if isinstance(server, dict) and isinstance(server.get("cuda_mps"), bool):  # YAML 1.1 reads a bare on/off as a boolean
        server["cuda_mps"] = "on" if server["cuda_mps"] else "off"
    validator = _DefaultFillingValidator(_schema())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise _schema_error_line(errors[0])
    _infer_missing_tasks(cfg)
    for model in cfg["models"]:  # one task inside: summarization and translation are what text2text models do
        if model["task"] in TASK_ALIASES:  # the pipeline of that name: T5's task_specific_params for it
            model["pipeline_task"] = model["task"]
        model["task"] = TASK_ALIASES.get(model["task"], model["task"])
    for index, model in enumerate(cfg["models"]):
        if model["task"] == SPEECH_RECOGNITION and index not in sized:
            model["max_request_bytes"] = SPEECH_REQUEST_BYTES
    _check_semantics(cfg, explicit_generation, explicit_onnx, explicit_vllm)
    _check_gpus(cfg)
    _check_tune(cfg)
    return cfg


def _infer_missing_tasks(cfg: dict) -> None:
    """Fill in every task config.yaml leaves out (hf2triton.task_inference) before anything checks it; where it was
    inferred from goes with it (task_inferred_from: preflight and the run say so). A hub source's answer is kept under
    <paths.work>/hub/tasks/, so a rerun infers the same without asking the hub."""
    cache_dir = Path(cfg["paths"]["work"]) / "hub"
    for index, model in enumerate(cfg["models"]):
        if "task" in model:
            continue
        where = f"config.models[{index}]"
        source = parse_source(model["source"], where=f"{where}.source")
        model["task"], model["task_inferred_from"] = infer_entry_task(model, source, cache_dir, where)


def load_config(path: Path | str, overrides: dict | None = None) -> dict:
    """Read `path`, merge command-line overrides (--config/--configfile) over it, validate, fill defaults."""
    raw = read_yaml(Path(path))
    if overrides:
        if not isinstance(raw, dict):
            raw = {}
        raw = deep_merge(raw, overrides)
    return validate_config(raw)


def load_project(path: Path | str, overrides: dict | None = None) -> ProjectSpec:
    """config.yaml (plus --config/--configfile overrides) -> validated specs."""
    return project_spec(load_config(path, overrides))


def model_by_name(cfg: dict, name: str) -> dict:
    for model in cfg["models"]:
        if model["name"] == name:
            return model
    raise UserError(f"no model named {name!r} in config", "use one of " + ", ".join(m["name"] for m in cfg["models"]))
