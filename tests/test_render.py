"""Rendering: config.pbtxt parses back as a ModelConfig with the expected fields, per task."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from hf2triton.pipeline.render import SERVING_DIR, SERVING_MODULE, render_model, serving_files
from hf2triton.specs import GenerationSpec, ModelSpec, serving_values
from hf2triton.triton.modelconfig import build_model_config, config_text


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


@pytest.mark.parametrize(
    "task,inputs,outputs",
    [
        ("feature-extraction", ["text", "prompt_name"], ["embedding", "prompt_tokens"]),
        ("text-classification", ["text"], ["label", "score"]),
        ("text-generation", ["text", "max_new_tokens", "temperature"], ["text_output"]),
        ("token-classification", ["text", "aggregation_strategy", "stride"], ["entities"]),
        ("fill-mask", ["text", "top_k"], ["candidates"]),
        ("text-ranking", ["text", "query"], ["score", "prompt_tokens"]),
        ("text2text-generation", ["text", "max_new_tokens", "temperature"], ["text_output"]),
    ],
)
def test_tasks_render_expected_tensors(task, inputs, outputs):
    config = parse(config_text(build_model_config("m", task, 8, 2, "KIND_CPU", 500, {"task": task}, embedding_dim=384)))
    assert config.name == "m" and config.backend == "python" and config.max_batch_size == 8
    assert [t.name for t in config.input] == inputs
    assert [t.name for t in config.output] == outputs
    assert config.input[0].data_type == mc.TYPE_STRING and list(config.input[0].dims) == [1]
    assert all(t.optional for t in config.input[1:])
    assert config.instance_group[0].count == 2 and config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert config.parameters["task"].string_value == task
    if task == "feature-extraction":
        assert config.output[0].data_type == mc.TYPE_FP32 and list(config.output[0].dims) == [384]


def test_no_batching_makes_texts_dimension_explicit():
    config = build_model_config("m", "feature-extraction", 0, 1, "KIND_CPU", 500, {}, embedding_dim=16)
    assert not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [-1, 1] and list(config.output[0].dims) == [-1, 16]


@pytest.mark.parametrize(
    "queue,policy",
    [
        ((0, 0), None),  # the default: no policy, so Triton's batcher keeps prefetching (no 500 ms stalls)
        ((16, 0), {"max_queue_size": 16}),
        ((0, 2.5), {"default_timeout_microseconds": 2_500_000, "allow_timeout_override": True}),
    ],
)
def test_queue_policy_only_when_a_bound_is_set(queue, policy):
    config = build_model_config("m", "feature-extraction", 8, 1, "KIND_CPU", 500, {}, embedding_dim=16, queue=queue)
    assert config.dynamic_batching.HasField("default_queue_policy") == (policy is not None)
    for field, value in (policy or {}).items():
        assert getattr(config.dynamic_batching.default_queue_policy, field) == value
        assert config.dynamic_batching.default_queue_policy.timeout_action == mc.ModelQueuePolicy.REJECT


def test_gpu_instance_group():
    config = build_model_config("m", "text-generation", 4, 1, "KIND_GPU", 0, {})
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU and list(config.instance_group[0].gpus) == [0]


def test_render_model_writes_directory(tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "config.json").write_text(json.dumps({"hidden_size": 24}))
    model = ModelSpec(
        name="emb", source="org/emb", task="feature-extraction", max_batch_size=4, max_queue_delay_us=100, max_input_bytes=1000
    )
    values = serving_values(model, gpu_available=False, cpus=2)
    out = render_model(str(tmp_path / "repo" / "emb"), values, str(saved))
    config = parse((out / "config.pbtxt").read_text())
    assert list(config.output[0].dims) == [24]
    assert config.parameters["model_dir"].string_value == str(saved.resolve())
    assert config.parameters["num_threads"].string_value == "2"
    assert (out / "1" / "model.py").read_text() == SERVING_MODULE.read_text()
    copied = serving_files(values)
    assert all((out / "1" / source.relative_to(SERVING_DIR)).read_text() == source.read_text() for source in copied)
    assert {p.relative_to(out / "1") for p in (out / "1").rglob("*.py")} == {p.relative_to(SERVING_DIR) for p in copied}
    assert not [p for p in (tmp_path / "repo").iterdir() if p.name.startswith(".")], "no temporary directory left behind"


def test_render_generation_parameters(tmp_path):
    saved = tmp_path / "saved"
    saved.mkdir()
    generation = GenerationSpec(max_new_tokens=7, temperature=0.5, chat_template=False)
    model = ModelSpec(
        name="g", source="org/g", task="text-generation", max_batch_size=2, dtype="float32", max_input_bytes=10, generation=generation
    )
    out = render_model(str(tmp_path / "g"), serving_values(model, gpu_available=False, cpus=1), str(saved))
    params = parse((out / "config.pbtxt").read_text()).parameters
    assert params["max_new_tokens"].string_value == "7"
    assert params["temperature"].string_value == "0.5"
    assert params["chat_template"].string_value == "false"


@pytest.mark.parametrize(
    "backend,task,streaming,later",
    [
        ("python", "feature-extraction", False, ["runtimes.pytorch"]),
        ("python", "token-classification", False, ["runtimes.pytorch"]),
        ("python", "fill-mask", False, ["runtimes.pytorch"]),
        ("python", "text-ranking", False, ["runtimes.pytorch"]),
        ("onnx", "text-classification", False, ["runtimes.onnxruntime"]),
        ("tensorrt", "feature-extraction", False, ["runtimes.tensorrt"]),
        ("onnx", "text-generation", False, ["runtimes.onnxruntime"]),
        ("onnx", "text-generation", True, ["runtimes.onnxruntime", "batching.responder", "batching.onnx"]),
        ("python", "text-generation", True, ["runtimes.pytorch", "batching.responder", "batching.slots"]),
        ("vllm", "text-generation", True, ["runtimes.vllm"]),
        ("python", "text2text-generation", True, ["runtimes.pytorch", "batching.responder", "batching.seq2seq"]),
    ],
)
def test_rendered_serving_code_imports_without_hf2triton(tmp_path, backend, task, streaming, later):
    """Triton loads 1/model.py by path, in a Python where hf2triton need not be installed: the copies beside it import
    each other (as the package hf2triton_serving), and every module the model loads later (its task, its runtime, the
    batcher) was copied; no other runtime was."""
    values = SimpleNamespace(backend=backend, task=task, generation=SimpleNamespace(streaming=streaming))
    for source in serving_files(values):
        target = tmp_path / "1" / source.relative_to(SERVING_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    code = (
        "import importlib.util, sys; sys.modules['hf2triton'] = None\n"  # importing hf2triton fails
        f"spec = importlib.util.spec_from_file_location('model', {str(tmp_path / '1' / 'model.py')!r})\n"
        "model = importlib.util.module_from_spec(spec); spec.loader.exec_module(model)\n"
        f"model.tasks.engine_class({task!r}); [model._load_sibling(name) for name in {later!r}]\n"
        "assert model.tasks.__name__ == 'hf2triton_serving.tasks'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)  # noqa: S603 - fixed code
    assert done.returncode == 0, done.stderr[-2000:]
    runtimes = {p.name for p in (tmp_path / "1" / "runtimes").iterdir()} - {"__init__.py", "graphs.py", "__pycache__"}
    # the runtime's own modules (vLLM's: vllm.py and the vllm_frontends.py it imports), no other runtime's
    assert {name.removesuffix(".py").split("_")[0] for name in runtimes} == {later[0].split(".")[1]}, runtimes
