"""Config schema: the shipped config is valid and complete; every bad value is one clear line."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from hf2triton.config import load_config, read_yaml, validate_config
from hf2triton.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
GOOD = {"models": [{"name": "m", "source": "org/model", "task": "feature-extraction"}]}


def with_model(**changes):
    cfg = copy.deepcopy(GOOD)
    cfg["models"][0].update(changes)
    return cfg


def with_server(**changes):
    cfg = copy.deepcopy(GOOD)
    cfg["server"] = changes
    return cfg


def test_shipped_config_is_valid_and_defaults_are_filled():
    cfg = load_config(ROOT / "config.yaml")
    assert [m["name"] for m in cfg["models"]] == ["smollm2", "minilm"]
    assert cfg["server"]["host"] == "127.0.0.1"
    assert cfg["models"][1]["revision"] == "main" and cfg["models"][1]["gguf_file"] is None


def test_minimal_config_gets_all_defaults():
    cfg = validate_config(GOOD)
    model = cfg["models"][0]
    assert model["backend"] == "python" and model["max_batch_size"] == 8 and model["instances"] == 1
    assert model["dynamic_batching"] == {"max_queue_delay_us": 2000}
    assert cfg["server"] == {
        "host": "127.0.0.1",
        "http_port": 8000,
        "grpc_port": 8001,
        "metrics_port": 8002,
        "startup_timeout_s": 300,
        "log_verbose": 0,
        "shm_default_byte_size": 16777216,
        "cuda_mps": "auto",
        "supervise": True,
    }
    assert cfg["paths"] == {"work": ".hf2triton", "vllm_env": ".venv-vllm"}
    assert GOOD["models"][0] == {"name": "m", "source": "org/model", "task": "feature-extraction"}, "input must not be modified"


def test_speech_models_take_an_audio_upload_unless_their_request_bytes_are_set():
    speech = {"task": "automatic-speech-recognition", "max_audio_seconds": 60}
    assert validate_config(with_model(**speech))["models"][0]["max_request_bytes"] == 32 << 20, "above the gateway's 25 MiB form"
    assert validate_config(with_model(**speech, max_request_bytes=1000))["models"][0]["max_request_bytes"] == 1000
    assert validate_config(GOOD)["models"][0]["max_request_bytes"] == 8 << 20, "texts and images keep 8 MiB"


def test_overrides_merge_over_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("models:\n  - {name: a, source: org/a, task: text-generation}\nserver: {http_port: 9000}\n")
    cfg = load_config(path, {"server": {"grpc_port": 9001}})
    assert cfg["server"]["http_port"] == 9000 and cfg["server"]["grpc_port"] == 9001


BAD = [
    # (config, words the one-line message must contain)
    ([], ["top level", "mapping"]),
    ({}, ["models", "missing"]),
    ({"models": []}, ["models", "entries"]),
    ({"models": GOOD["models"], "extra": 1}, ["config.extra", "unknown key"]),
    (with_model(bogus=1), ["models[0].bogus", "unknown key"]),
    (with_model(max_batchsize=4), ["max_batchsize", "unknown key", "max_batch_size"]),
    (with_model(name="a/b"), ["models[0].name", "'a/b'"]),
    (with_model(name="../x"), ["models[0].name"]),
    (with_model(name=".."), ["models[0].name"]),
    (with_model(name=""), ["models[0].name"]),
    (with_model(name="a b"), ["models[0].name"]),
    (with_model(task="summarisation"), ["models[0].task", "summarisation", "text-generation", "summarization"]),
    (with_model(backend="tensorrt_llm"), ["models[0].backend", "python"]),
    (with_model(max_batch_size=-1), ["max_batch_size", "-1", "between 0"]),
    (with_model(max_batch_size="4"), ["max_batch_size", "'4'", "integer"]),
    (with_model(max_batch_size=10**9), ["max_batch_size"]),
    (with_model(instances=0), ["instances", "0"]),
    (with_model(device="tpu"), ["device", "tpu", "auto"]),
    (with_model(dtype="int4"), ["dtype", "int4"]),
    (with_model(source="x; rm -rf /"), ["source", "';'"]),
    (with_model(source="org/model$(id)"), ["source"]),
    (with_model(source="not a hub id"), ["source"]),
    (with_model(source="pkg:../etc"), ["source", "package"]),
    (with_model(source="pkg:os/../../etc/passwd"), ["source", "leave the package"]),
    (with_model(revision="../../main"), ["revision"]),
    (with_model(gguf_file="model.bin"), ["gguf_file", ".gguf"]),
    (with_model(generation={"max_new_tokens": 0}), ["max_new_tokens", "0"]),
    (with_model(generation={"max_new_tokens": 8}), ["generation", "only for tasks text-generation and text2text-generation"]),
    (
        with_model(task="text-generation", generation={"temperature": 1e-45}),
        ["generation.temperature", "1e-45", "0 (greedy)", "0.01 and 100"],
    ),
    (with_model(task="text-generation", generation={"temperature": 0.005}), ["generation.temperature", "0.005", "0 (greedy)"]),
    (with_model(dynamic_batching={"max_queue_delay_us": -5}), ["max_queue_delay_us"]),
    (with_model(max_batch_size=0, queue={"max_size": 8}), ["models[0].queue", "max_batch_size is 0", "max_texts_per_request"]),
    (with_model(max_request_bytes=0), ["max_request_bytes", "0"]),
    (with_model(onnx={"quantize": "dynamic-int8"}), ["models[0].onnx", "only for backend onnx"]),
    (with_model(backend="onnx", onnx={"quantize": "int4"}), ["quantize", "int4", "dynamic-int8"]),
    (with_model(backend="onnx", onnx={"opset": 7}), ["opset", "7"]),
    (with_model(backend="tensorrt", task="text-generation"), ["tensorrt", "text-generation", "backend: onnx"]),
    (with_model(backend="tensorrt", task="fill-mask"), ["backend = 'tensorrt'", "not built for fill-mask", "use backend: onnx"]),
    (with_model(backend="onnx", task="text-ranking", onnx={"quantize": "dynamic-int8"}), ["onnx.quantize", "1e-3", "quantize: none"]),
    (with_model(backend="onnx", task="text2text-generation"), ["backend = 'onnx'", "torch only", "backend: python"]),
    (with_model(backend="onnx", task="text-generation", onnx={"quantize": "dynamic-int8"}), ["quantize", "encoder", "gguf-blocks"]),
    (with_model(backend="onnx", onnx={"quantize": "gguf-blocks"}), ["quantize", "gguf-blocks", "not a GGUF file", ".gguf source"]),
    ({"models": GOOD["models"] * 2}, ["duplicate", "models[1]"]),
    ({"models": [GOOD["models"][0], {**GOOD["models"][0], "name": "M"}]}, ["duplicate"]),
    (with_server(http_port=0), ["server.http_port", "0"]),
    (with_server(grpc_port=70000), ["server.grpc_port", "70000", "65535"]),
    (with_server(http_port=9000, grpc_port=9000), ["server.grpc_port", "same as server.http_port"]),
    (with_server(host="0.0.0.0; rm"), ["server.host"]),
    # the gateway on a Triton port: refused here, not found late as "in use by another program" (issue 24 #5)
    ({**GOOD, "openai": {"enabled": True, "port": 8000}}, ["config.openai.port = 8000", "same as server.http_port", "a port of its own"]),
    ({**with_server(grpc_port=9100), "openai": {"enabled": True, "port": 9100}}, ["openai.port = 9100", "same as server.grpc_port"]),
    ({**GOOD, "openai": {"enabled": True, "port": 8002}}, ["openai.port = 8002", "same as server.metrics_port"]),
    ({**GOOD, "openai": {"workers": 0}}, ["openai.workers"]),
    (with_model(task="text-generation", generation={"response_threads": 9}), ["generation.response_threads", "9"]),
    ({**GOOD, "openai": {"workers": "many"}}, ["openai.workers", "'many'"]),
    (with_server(startup_timeout_s=1), ["startup_timeout_s"]),
    (with_server(log_verbose=True), ["log_verbose"]),
    ({**GOOD, "paths": {"work": ""}}, ["paths.work"]),
    ({**GOOD, "paths": {"work": "with space"}}, ["paths.work", "whitespace"]),
    ({**GOOD, "paths": {"work": "werk-é"}}, ["paths.work", "'werk-é'", "non-ASCII", "fix: choose an ASCII path"]),
    ({**GOOD, "paths": {"work": "a:b"}}, ["paths.work", "colon"]),
    (with_model(max_batch_sise=4), ["models[0].max_batch_sise: unknown key", "did you mean 'max_batch_size'?"]),
    (with_model(task="feature_extraction"), ["task = 'feature_extraction'", "did you mean 'feature-extraction'?"]),
    (with_model(revision=1.1), ["revision = 1.1", "in quotes"]),
    # Triton sources <vllm_env>/bin/activate in an unquoted bash command: `$(...)` would run
    ({**GOOD, "paths": {"vllm_env": ".venv$(touch${IFS}x)"}}, ["paths.vllm_env", "shell metacharacter", "letters, digits"]),
    ({**GOOD, "paths": {"work": "w;id"}}, ["paths.work", "shell metacharacter"]),
    # JSON Schema counts 8.0 as an integer; it failed later as a bare TypeError (the repository rule, preflight's bind)
    (with_model(max_batch_size=32.0), ["max_batch_size = 32.0", "a whole number", "(32)"]),
    (with_server(http_port=8000.0), ["server.http_port = 8000.0", "a whole number"]),
    # .nan compares false with every limit: a 1e9-second audio passed max_audio_seconds, time_limit_s never ended
    (with_model(task="automatic-speech-recognition", max_audio_seconds=float("nan")), ["max_audio_seconds = nan", "a finite number"]),
    (with_model(task="text-generation", generation={"time_limit_s": float("inf")}), ["generation.time_limit_s = inf", "a finite number"]),
    ({**GOOD, "models": "m"}, ["config.models", "array"]),
    ({**GOOD, 1: "x"}, ["key 1"]),
]


@pytest.mark.parametrize("cfg,words", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_config_is_one_clear_line(cfg, words):
    with pytest.raises(UserError) as info:
        validate_config(cfg)
    message = info.value.render()
    assert "\n" not in message
    assert "fix:" in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_at_least_twenty_bad_configs():
    assert len(BAD) >= 25


@pytest.mark.parametrize(
    "content,words",
    [
        (b"models: [\n", ["YAML syntax error", "line"]),
        (b"models:\n  - name: \xff\xfe\n", ["UTF-8"]),
        (
            b"a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
            b"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n",
            ["alias bomb"],
        ),
        (b"!!python/object/apply:os.system ['true']\n", ["YAML"]),
        (b"- just\n- a list\n", ["mapping"]),
        # YAML keeps the last of two equal keys silently: a second server block dropped the first
        (b"server:\n  http_port: 8100\nmodels: []\nserver:\n  grpc_port: 8101\n", ["line 4", "'server' appears twice", "first on line 1"]),
    ],
)
def test_unreadable_config_files(tmp_path, content, words):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(UserError) as info:
        load_config(path)
    for word in words:
        assert word in info.value.render()


def test_an_unknown_users_home_in_a_local_source_is_one_clear_line():
    from hf2triton.pipeline.sources import resolve_local_path
    from hf2triton.specs import parse_source

    with pytest.raises(UserError) as info:
        resolve_local_path(parse_source("~no-such-user-here/model"), "config.models[0].source")
    assert "config.models[0].source = '~no-such-user-here/model'" in info.value.render() and "full path" in info.value.render()


def test_long_running_processes_get_no_hub_token(monkeypatch):
    from hf2triton.logs import without_secrets

    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 20)
    assert "HF_TOKEN" not in without_secrets(__import__("os").environ) and "PATH" in without_secrets(__import__("os").environ)


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match="not found"):
        read_yaml(tmp_path / "nope.yaml")


def test_schema_defaults_equal_the_interface_defaults():
    """The config schema and the serving interface agree on every generation default and limit."""
    import yaml

    from hf2triton.config import SCHEMA_PATH
    from hf2triton.serving import interface

    generation = yaml.safe_load(SCHEMA_PATH.read_text())["$defs"]["model"]["properties"]["generation"]["properties"]
    assert generation["max_new_tokens"]["default"] == interface.DEFAULTS.max_new_tokens
    assert generation["temperature"]["default"] == interface.DEFAULTS.temperature
    assert generation["chat_template"]["default"] == interface.DEFAULTS.chat_template
    assert (generation["max_new_tokens"]["minimum"], generation["max_new_tokens"]["maximum"]) == interface.MAX_NEW_TOKENS_RANGE


def test_temperature_is_zero_or_at_least_the_sampling_minimum():
    """The schema says 0..100; 0 < t < 0.01 (e.g. the float32 denormal 1e-45) would divide the logits into NaN."""
    from hf2triton.serving import interface

    for allowed in (0, 0.0, interface.MIN_TEMPERATURE, 0.7, 100):
        cfg = validate_config(with_model(task="text-generation", generation={"temperature": allowed}))
        assert cfg["models"][0]["generation"]["temperature"] == allowed
    for refused in (1e-45, 1e-3, 0.0099):
        with pytest.raises(UserError, match="0 \\(greedy\\) or a finite number between 0.01 and 100"):
            validate_config(with_model(task="text-generation", generation={"temperature": refused}))
    with pytest.raises(UserError, match="temperature = nan: not allowed -- fix: use a finite number between 0"):
        validate_config(with_model(task="text-generation", generation={"temperature": float("nan")}))


def test_specs_are_built_once_with_every_default(tmp_path):
    from hf2triton.config import load_project
    from hf2triton.specs import GenerationSpec

    path = tmp_path / "c.yaml"
    entry = "  - {name: %s, source: org/%s, task: %s}\n"
    path.write_text("models:\n" + entry % ("g", "g", "text-generation") + entry % ("e", "e", "feature-extraction"))
    project = load_project(path)
    assert project.model("g").generation == GenerationSpec() and project.model("e").generation is None
    assert project.server.http_port == 8000 and project.bench.concurrency == (1, 4, 16) and project.work == ".hf2triton"
    assert [m.name for m in project.tuned_models()] == ["e"]


def test_spec_defaults_equal_the_schema_defaults():
    """Code that builds a spec directly (tests, benchmarks, tune's variants) gets what config.yaml would."""
    from hf2triton.specs import BenchSpec, GenerationSpec, ModelSpec, OpenAISpec, ServerSpec, TuneSpec, project_spec

    entries = [{"name": "e", "source": "org/e", "task": "feature-extraction"}, {"name": "g", "source": "org/g", "task": "text-generation"}]
    project = project_spec(validate_config({"models": entries}))
    assert project.model("e") == ModelSpec(**entries[0])
    assert project.model("g") == ModelSpec(**entries[1], generation=GenerationSpec())
    assert (project.server, project.bench, project.tune, project.openai) == (ServerSpec(), BenchSpec(), TuneSpec(), OpenAISpec())


def test_response_threads_auto_reaches_the_model_as_0():
    """generation.response_threads: auto (0 in the rendered parameters: the stub picks by its host's cores) or a number."""
    from hf2triton.specs import project_spec

    def threads(value):
        generation = {} if value is None else {"response_threads": value}
        model = project_spec(validate_config(with_model(task="text-generation", generation=generation))).model("m")
        return model.generation.response_threads

    assert (threads(None), threads("auto"), threads(4)) == (0, 0, 4)


def test_a_generation_block_shared_through_a_yaml_anchor_is_derived_per_model():
    """Regression: an anchored block is one object for both models; the python model's derived
    streaming: true leaked into the onnx model, which was then refused."""
    text = """
models:
  - {name: a, source: org/llm, task: text-generation, generation: &gen {max_new_tokens: 8}}
  - {name: b, source: org/llm, task: text-generation, backend: onnx, generation: *gen}
  - {name: c, source: org/llm, task: text-generation, backend: onnx, generation: {<<: *gen, streaming: false}}
"""
    models = validate_config(yaml.safe_load(text))["models"]
    assert [m["generation"]["streaming"] for m in models] == [True, True, False]
    assert all(m["generation"]["max_new_tokens"] == 8 for m in models)


def test_streaming_is_the_default_on_python_and_onnx():
    generation = {"source": "org/llm", "task": "text-generation"}
    assert validate_config(with_model(**generation))["models"][0]["generation"]["streaming"] is True
    assert validate_config(with_model(**generation, backend="onnx"))["models"][0]["generation"]["streaming"] is True
    static = with_model(**generation, backend="onnx", generation={"streaming": False})
    assert validate_config(static)["models"][0]["generation"]["streaming"] is False
    cfg = with_model(**generation)
    cfg["tune"] = {"models": ["m"]}
    with pytest.raises(UserError) as info:
        validate_config(cfg)
    assert "'m' streams (continuous batching)" in info.value.message and "streaming: false" in info.value.fix
    cfg["models"][0]["generation"] = {"streaming": False}
    validate_config(cfg)


def test_genai_builder_is_for_decoders_only():
    generation = {"source": "org/llm", "task": "text-generation", "backend": "onnx"}
    assert validate_config(with_model(**generation))["models"][0]["onnx"]["exporter"] == "auto"
    assert validate_config(with_model(**generation, onnx={"exporter": "genai-builder"}))["models"][0]["onnx"]["exporter"] == "genai-builder"
    with pytest.raises(UserError) as info:
        validate_config(with_model(backend="onnx", onnx={"exporter": "genai-builder"}))
    assert "onnx.exporter = 'genai-builder'" in info.value.message and "feature-extraction" in info.value.message
    assert "exporter: auto or optimum" in info.value.fix


TASK_BENCH_OVERLAYS = ("benchmarks/h200/tasks-overlay.yaml", "benchmarks/tasks/onnx-overlay.yaml")
# issue 45's image and speech benchmark
MEDIA_BENCH_OVERLAYS = ("benchmarks/h200/media-overlay.yaml", "benchmarks/tasks/media-2cpu-overlay.yaml")
# overlays documented on top of others than gpu-overlay.yaml alone (device.sh multigpu tp-triton)
STACKED = {"benchmarks/h200/multigpu/tp2.yaml": ("benchmarks/h200/vllm-overlay.yaml", "benchmarks/h200/vllm-dummy.yaml")}


@pytest.mark.parametrize("overlay", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.yaml")), ids=lambda p: p)
def test_benchmark_overlays_are_valid_configs(overlay):
    """The overlays the documented GPU/CPU sequences pass with --configfile (a typo must fail here, not on the GPU machine)."""
    data = read_yaml(ROOT / overlay) or {}
    if overlay in TASK_BENCH_OVERLAYS + MEDIA_BENCH_OVERLAYS:  # the task benchmarks: their own configs of task models
        config = "benchmarks/tasks/media.yaml" if overlay in MEDIA_BENCH_OVERLAYS else "benchmarks/tasks/config.yaml"
        cfg = load_config(ROOT / config, data)
        assert set(data.get("overrides", {})) <= {m["name"] for m in cfg["models"]}
        return
    for below in reversed(STACKED.get(overlay, ())):
        base = read_yaml(ROOT / below)
        overrides = {name: {**base["overrides"].get(name, {}), **values} for name, values in data["overrides"].items()}
        data = {**base, **data, "overrides": overrides}
    if overlay.startswith("benchmarks/h200/") and overlay != "benchmarks/h200/gpu-overlay.yaml" and "overrides" in data:
        base = read_yaml(ROOT / "benchmarks/h200/gpu-overlay.yaml")  # the probe variants apply on top of the overlay
        data = {**base, **data, "overrides": {**base.get("overrides", {}), **data["overrides"]}}
    cfg = load_config(ROOT / "config.yaml", data)
    assert cfg["models"]


def test_gateway_workers_auto_is_one_per_two_cores_at_most_eight(tmp_path, monkeypatch):
    from hf2triton import host
    from hf2triton.gateway import process
    from hf2triton.specs import OpenAISpec, ServerSpec
    from hf2triton.triton.settings import Settings

    assert validate_config({**GOOD, "openai": {"workers": "auto"}}) is not None
    assert [OpenAISpec().worker_count(cores) for cores in (1, 2, 7, 8, 16, 128)] == [1, 1, 3, 4, 8, 8]
    assert OpenAISpec(workers=3).worker_count(2) == 3, "a number is taken as it is"
    settings = Settings.of(ServerSpec(), ["m"], str(tmp_path / "w"), str(tmp_path / "r"))
    for cores, workers in ((2, None), (16, "8")):
        monkeypatch.setattr(host, "cpu_count", lambda cores=cores: cores)
        command = process.command(settings, OpenAISpec(enabled=True))
        assert (command[command.index("--workers") + 1] if "--workers" in command else None) == workers, cores
