"""Issue 29: ONNX on the GPU.

#1 which ONNX Runtime package a host gets (CPU unless a model runs backend onnx on a CUDA 13 GPU host; ONNXRUNTIME
overrides) and the pip commands that switch; #3 the float16 export for the CUDA provider (real optimum export, ONNX
Runtime's fusions and float16 conversion), what a GPU instance refuses (dynamic int8, bfloat16), and the I/O-bound
encoder. The float16 graph's parity with torch float32 runs where ONNX Runtime has a CUDA provider and a GPU (the H200
through benchmarks/gpu/device.sh); elsewhere it is skipped with the reason."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from hf2triton.envs import (
    ORT_CPU_PACKAGES,
    ORT_GPU_PACKAGES,
    ORT_GPU_REQUIREMENTS,
    installed_versions,
    onnx_runtime_choice,
    onnx_runtime_commands,
)
from hf2triton.errors import UserError
from hf2triton.specs import ModelSpec, OnnxSpec, onnx_precision, require_onnx_on_gpu
from tests.helpers import ROOT, minilm_dir

EMBED = {"name": "minilm", "source": "org/minilm", "task": "feature-extraction", "backend": "onnx"}


def test_the_cpu_packages_unless_a_model_runs_onnx_on_a_cuda_13_gpu():
    assert onnx_runtime_choice([], "cu130")[0] == "cpu", "a GPU host without onnx models keeps the CPU package"
    assert onnx_runtime_choice([], "cpu")[0] == "cpu"
    choice, why = onnx_runtime_choice(["minilm"], "cu130")
    assert choice == "gpu" and "minilm" in why
    assert onnx_runtime_choice(["minilm"], "cu126", "cpu") == ("cpu", "ONNXRUNTIME=cpu")
    assert onnx_runtime_choice([], "cpu", "gpu") == ("gpu", "ONNXRUNTIME=gpu")
    with pytest.raises(UserError, match="ONNXRUNTIME=tpu is not a choice"):
        onnx_runtime_choice([], "cpu", "tpu")


@pytest.mark.parametrize(
    ("build", "named", "fix"),
    [("cu126", "a CUDA 13 build, and this host's torch build is cu126", "driver to 580"), ("cpu", "no NVIDIA GPU", "device: cpu")],
)
def test_onnx_on_a_gpu_that_cannot_run_the_gpu_package_is_refused(build, named, fix):
    with pytest.raises(UserError) as info:
        onnx_runtime_choice(["minilm"], build)
    assert "model minilm" in info.value.message and named in info.value.message and fix in info.value.fix


def test_switching_leaves_exactly_one_runtime():
    cpu = {"onnxruntime": "1.32.0", "onnxruntime-genai": "0.15.2"}
    gpu = {"onnxruntime-gpu": "1.31.1", "onnxruntime-genai-cuda": "0.15.2"}
    assert onnx_runtime_commands("cpu", cpu, "py") == [], "the right packages: nothing to do"
    assert onnx_runtime_commands("gpu", gpu, "py") == []
    to_gpu = onnx_runtime_commands("gpu", cpu, "py")
    assert to_gpu[0] == ["py", "-m", "pip", "uninstall", "-y", *ORT_CPU_PACKAGES]
    assert to_gpu[1][-2:] == ["-r", ORT_GPU_REQUIREMENTS]
    to_cpu = onnx_runtime_commands("cpu", gpu, "py")
    assert to_cpu[0][-2:] == list(ORT_GPU_PACKAGES) and to_cpu[1][-3:] == ["--no-deps", "onnxruntime==1.32.0", "onnxruntime-genai==0.15.2"]
    # both at once (requirements.txt re-installed the CPU one over the GPU one): they share files, so both go
    both = onnx_runtime_commands("gpu", {**cpu, **gpu}, "py")
    assert set(both[0][5:]) == {*ORT_CPU_PACKAGES, *ORT_GPU_PACKAGES} and both[1][-1] == ORT_GPU_REQUIREMENTS
    pins = (ROOT / "envs" / "onnxruntime-gpu.txt").read_text()
    assert "onnxruntime-gpu[cuda,cudnn]==1.31.1" in pins and "onnxruntime-genai-cuda==0.15.2" in pins


def test_this_cpu_host_keeps_the_cpu_package(tmp_path):
    if set(installed_versions(ORT_GPU_PACKAGES)):  # (the step would switch this host back to the CPU package)
        pytest.skip("this environment has the GPU package: a CPU host's choice is tested where setup installed the CPU one")
    assert set(installed_versions(ORT_CPU_PACKAGES + ORT_GPU_PACKAGES)) == set(ORT_CPU_PACKAGES)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"models": [{**EMBED, "source": str(minilm_dir())}]}))
    done = subprocess.run(
        [sys.executable, "-m", "hf2triton.envs", "onnx-runtime", "--config", str(config)],
        capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "HF2TRITON_ASSUME_NO_GPU": "1"}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "onnxruntime, onnxruntime-genai (no model runs backend onnx on a GPU" in done.stdout and "pip" not in done.stderr
    config.write_text(yaml.safe_dump({"models": [{**EMBED, "source": str(minilm_dir()), "device": "gpu"}]}))
    done = subprocess.run(
        [sys.executable, "-m", "hf2triton.envs", "onnx-runtime", "--config", str(config)],
        capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "HF2TRITON_ASSUME_NO_GPU": "1"}, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "hf2triton: error: model minilm: backend onnx with device gpu" in done.stderr
    assert "Traceback" not in done.stderr
    recipes = (ROOT / "Makefile").read_text()
    for target in ("serve:", "setup:"):
        assert "onnx-runtime" in recipes.split(f"\n{target}", 1)[1].split("\n", 1)[0], f"{target} installs the runtime it needs"


def test_precision_and_what_a_gpu_instance_refuses():
    assert onnx_precision("onnx", "KIND_GPU", "auto", "feature-extraction") == "float16"
    assert onnx_precision("onnx", "KIND_GPU", "float32", "feature-extraction") == "float32"
    assert onnx_precision("onnx", "KIND_CPU", "auto", "feature-extraction") == "float32"
    assert onnx_precision("tensorrt", "KIND_GPU", "auto", "feature-extraction") == "float32"
    assert onnx_precision("onnx", "KIND_GPU", "auto", "text-generation") == "float16", "the builder's float16 CUDA graph"
    assert onnx_precision("onnx", "KIND_GPU", "auto", "text-generation", "gguf-blocks") == "float32"
    assert onnx_precision("onnx", "KIND_GPU", "auto", "text-generation", "none", "optimum") == "float32"
    assert onnx_precision("onnx", "KIND_CPU", "auto", "text-generation") == "float32"
    int8 = ModelSpec(**EMBED, onnx=OnnxSpec(quantize="dynamic-int8"))
    require_onnx_on_gpu([int8], gpu_available=False)  # the CPU: int8 is what it is for
    require_onnx_on_gpu([ModelSpec(**EMBED, onnx=OnnxSpec(quantize="dynamic-int8"), device="cpu")], gpu_available=True)
    with pytest.raises(UserError) as info:
        require_onnx_on_gpu([int8], gpu_available=True)
    assert "model minilm: onnx.quantize dynamic-int8 is a CPU technique" in info.value.message
    assert "quantize: none" in info.value.fix and "device: cpu" in info.value.fix
    with pytest.raises(UserError, match="dtype bfloat16 with backend onnx on the GPU"):
        require_onnx_on_gpu([ModelSpec(**EMBED, dtype="bfloat16")], gpu_available=True)


def test_the_float16_export_keeps_the_served_tensors(tiny_models, tmp_path):
    """Fused, then float16 inside; int64 ids in and float32 out, as the float32 export."""
    import onnx

    from hf2triton.pipeline.export import export_onnx_step

    out = tmp_path / "onnx"
    manifest = export_onnx_step(str(tiny_models["feature-extraction"]), "feature-extraction", 17, "auto", "O2", "none", str(out), "float16")
    assert manifest["precision"] == "float16" and manifest["float16_initializers"] > 0
    assert manifest["fused_operators"].get("Attention", 0) == 2, manifest["fused_operators"]
    graph = onnx.load(str(out / "model.onnx")).graph
    assert {i.name: i.type.tensor_type.elem_type for i in graph.input}["input_ids"] == onnx.TensorProto.INT64
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert not any(t.data_type == onnx.TensorProto.FLOAT and len(t.dims) > 1 for t in graph.initializer), "weights are float16"
    assert json.loads((out / "export.json").read_text())["precision"] == "float16"


def test_the_bound_output_shape_fills_the_symbolic_dims():
    from hf2triton.serving.runtimes.onnxruntime import OrtEncoder

    encoder = OrtEncoder.__new__(OrtEncoder)
    encoder.output_dims = ["batch_size", "sequence_length", 384]
    assert encoder.output_shape(16, 40) == (16, 40, 384)
    encoder.output_dims = ["batch_size", 2]
    assert encoder.output_shape(3, 40) == (3, 2)


def test_graph_capable_sessions_ask_the_cuda_provider_for_graphs_and_only_there():
    from hf2triton.serving.interface import ModelParameters
    from hf2triton.serving.runtimes.onnxruntime import ort_providers

    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert ort_providers("cuda:1", available, cuda_graphs=True)[0] == ("CUDAExecutionProvider", {"device_id": 1, "enable_cuda_graph": "1"})
    assert ort_providers("cuda:0", available)[0] == ("CUDAExecutionProvider", {"device_id": 0})
    assert ort_providers("cpu", available, cuda_graphs=True) == ["CPUExecutionProvider"]
    onnx_encoder = ModelParameters(task="feature-extraction", backend="onnx", model_dir="m", onnx_dir="o")
    assert "cuda_graphs" in onnx_encoder.relevant(), "the rendered config carries it: a change rebuilds the repository"
    assert "cuda_graphs" not in ModelParameters(task="text-generation", backend="onnx", model_dir="m", onnx_dir="o").relevant()


def _cuda_onnx_runtime() -> str:
    """Why the GPU parity cannot run here ("" when it can)."""
    import onnxruntime
    import torch

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return f"ONNX Runtime here is the CPU package ({onnxruntime.__version__}): onnxruntime-gpu runs this on a GPU host"
    return "" if torch.cuda.is_available() else "no CUDA GPU visible to torch"


def test_float16_on_the_gpu_matches_torch_float32(tmp_path):
    """MiniLM's float16 export on the CUDA provider, I/O bound, against torch float32 on the CPU: cosine >= 0.999."""
    reason = _cuda_onnx_runtime()
    if reason:
        pytest.skip(reason)
    from hf2triton.pipeline.export import export_onnx_step
    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    out = tmp_path / "onnx"
    export_onnx_step(str(minilm_dir()), "feature-extraction", 17, "auto", "O2", "none", str(out), "float16")
    texts = ["a GPU runs this", "ONNX Runtime on CUDA, float16", "x" * 40, "short"] * 8
    served = EmbeddingEngine(str(minilm_dir()), device="cuda:0", backend="onnx", onnx_dir=str(out))
    assert served.model.binds_device and served.model.session.get_providers()[0] == "CUDAExecutionProvider"
    reference = EmbeddingEngine(str(minilm_dir()), device="cpu", dtype="float32").run(texts)
    got = served.run(texts)
    cosine = np.sum(got["embedding"] * reference["embedding"], axis=1)
    assert cosine.min() >= 0.999, cosine.min()
    assert (got["prompt_tokens"] == reference["prompt_tokens"]).all()


def test_onnx_runtime_cuda_graphs_answer_like_its_eager_runs(tmp_path):
    """The served ONNX encoder on a GPU replays ONNX Runtime's graph per bucket + a torch graph of the pooling:
    the same embeddings as the same session run eagerly (padded rows and columns change nothing), for batches in
    several buckets, a bucket met again (replayed, not captured), and a batch beyond the buckets (eager)."""
    reason = _cuda_onnx_runtime()
    if reason:
        pytest.skip(reason)
    from hf2triton.pipeline.export import export_onnx_step
    from hf2triton.serving.runtimes.graphs import OrtGraphs
    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    out = tmp_path / "onnx"
    export_onnx_step(str(minilm_dir()), "feature-extraction", 17, "auto", "O2", "none", str(out), "float16")
    texts = [f"sentence number {i} " * (i % 7 + 1) for i in range(300)]
    graphed = EmbeddingEngine(str(minilm_dir()), device="cuda:0", backend="onnx", onnx_dir=str(out), cuda_graphs=True)
    eager = EmbeddingEngine(str(minilm_dir()), device="cuda:0", backend="onnx", onnx_dir=str(out), cuda_graphs=False)
    assert isinstance(graphed.graphs, OrtGraphs) and graphed.model.graph_capable and eager.graphs is None
    for size in (1, 3, 16, 3, 40, 300):
        got, want = graphed.run(texts[:size]), eager.run(texts[:size])
        cosine = (got["embedding"] * want["embedding"]).sum(axis=1)
        assert cosine.min() >= 0.9999, (size, cosine.min())
        assert (got["prompt_tokens"] == want["prompt_tokens"]).all()
    assert not graphed.graphs.failed, graphed.graphs.failed
    assert len(graphed.graphs.graphs) >= 3, sorted(graphed.graphs.graphs)


@pytest.fixture(scope="module")
def smollm2_float16(tmp_path_factory):
    """SmolLM2 (the shipped GGUF's weights) saved, and built in float16 for CUDA by the model builder: (saved, onnx)."""
    reason = _cuda_onnx_runtime()
    if reason:
        pytest.skip(reason)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf2triton.pipeline.export import export_onnx_step
    from tests.helpers import smollm2_gguf

    root = tmp_path_factory.mktemp("smollm2-float16")
    saved, out = root / "smollm2", root / "onnx"
    gguf = {"gguf_file": smollm2_gguf().name}
    AutoModelForCausalLM.from_pretrained(smollm2_gguf().parent, **gguf).save_pretrained(saved)
    AutoTokenizer.from_pretrained(smollm2_gguf().parent, **gguf).save_pretrained(saved)
    manifest = export_onnx_step(str(saved), "text-generation", 17, "auto", "O2", "none", str(out), "float16")
    assert manifest["exporter"] == "genai-builder" and manifest["precision"] == "float16"
    return saved, out


def test_smollm2_float16_on_the_cuda_provider_answers_like_torch_float32(smollm2_float16):
    """Item 4: SmolLM2 built in float16 for CUDA, generated by the ONNX decoder loop on the CUDA provider (KV cache on
    the GPU): the same greedy text as torch float32 on the CPU for the validation's parity prompts."""
    from hf2triton.pipeline.validate import PARITY_GENERATION_PROMPTS
    from hf2triton.serving.tasks.generation import GenerationEngine

    saved, out = smollm2_float16
    served = GenerationEngine(str(saved), device="cuda:0", backend="onnx", onnx_dir=str(out))
    assert served.model.session.get_providers()[0] == "CUDAExecutionProvider"
    want = GenerationEngine(str(saved), device="cpu", dtype="float32").run(PARITY_GENERATION_PROMPTS, max_new_tokens=32)
    got = served.run(PARITY_GENERATION_PROMPTS, max_new_tokens=32)
    assert list(got["text_output"]) == list(want["text_output"]), (got, want)


def test_the_onnx_decoders_cuda_graphs_decode_its_eager_steps_tokens(smollm2_float16):
    """Issue 46 #3: the float16 builder graph behind the continuous batcher on the GPU, its decoding steps replaying
    ONNX Runtime's CUDA graph per (rows, columns) bucket over buffers bound once: the greedy tokens of the same slots
    run eagerly, for rows that join and leave at any step (padded rows, buckets met again, the columns growing past
    128), and the served batcher says it replays graphs."""
    from transformers import AutoTokenizer

    from hf2triton.pipeline.validate import PARITY_GENERATION_PROMPTS
    from hf2triton.serving.batching.onnx import OnnxSlotBatcher, new_batcher
    from hf2triton.serving.batching.sequences import Sampling, Sequence
    from hf2triton.serving.runtimes.onnxruntime import OrtDecoder

    saved, out = smollm2_float16
    tokenizer = AutoTokenizer.from_pretrained(saved)
    decoder = OrtDecoder(str(out), 0, "cuda:0", cuda_graphs=True)
    assert decoder.graph_capable, "the builder's graph: ONNX Runtime refused CUDA graphs for it"
    limits = {"max_sequences": 4, "max_queue": 16, "context": 512, "max_prefill_tokens": 256}
    lines: list[str] = []
    graphed = new_batcher(decoder, tokenizer, "cuda:0", cuda_graphs=True, log=lines.append, **limits)
    assert isinstance(graphed, OnnxSlotBatcher) and graphed.graphed, lines
    assert "replay CUDA graphs" in lines[-1], lines
    loaded = {shape[:2] for shape in graphed.graph_steps}  # issue 46: every row bucket captured at load
    assert loaded == {(rows, columns) for rows in (1, 2, 4) for columns in (128, 256)}, (loaded, lines)
    eager = OnnxSlotBatcher(decoder, tokenizer, "cuda:0", graphs=False, **limits)
    prompts = [*PARITY_GENERATION_PROMPTS, "Count from one to fifty in words:"]

    def decode(batcher) -> list[list[int]]:
        batcher.eos_ids = set()  # every row runs its length: the long one alone at the end, past 128 columns
        lengths = (12, 40, 7, 150, 25)
        sequences = [
            Sequence(tokenizer(p)["input_ids"], Sampling(max_new_tokens=n), lambda text, finish: None) for p, n in zip(prompts, lengths)
        ]
        pending = list(sequences)
        while pending or not batcher.idle:
            if pending and batcher.steps % 3 == 0:
                batcher.submit(pending.pop(0))
            batcher.step()
        return [sequence.generated for sequence in sequences]

    want = decode(eager)
    assert decode(graphed) == want
    assert decode(graphed) == want, "replayed: every bucket met again"
    shapes = {shape[:2] for shape in graphed.graph_steps}
    assert any(rows > 1 for rows, _ in shapes) and any(columns > 128 for _, columns in shapes), shapes
