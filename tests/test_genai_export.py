"""onnx.exporter: decoders are built by ONNX Runtime GenAI's model builder (fused attention) where it knows
the architecture; elsewhere auto falls back to optimum, and asking for the builder by name is a clear error."""

from __future__ import annotations

import json

import pytest

from hf2triton.errors import UserError
from hf2triton.pipeline.export import export_onnx_step
from hf2triton.serving.interface import GENAI_CONFIG
from tests.helpers import smollm2_gguf


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """An architecture the builder does not know (GPT-2), tiny, with a real tokenizer."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("tiny-gpt2")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf().parent, gguf_file=smollm2_gguf().name)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=128)
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_auto_falls_back_to_optimum_for_an_architecture_the_builder_does_not_know(tiny_gpt2, tmp_path):
    out = tmp_path / "onnx"
    manifest = export_onnx_step(str(tiny_gpt2), "text-generation", 17, "auto", "O2", "none", str(out))
    assert manifest["exporter"] == "optimum" and manifest["opset"] == 17
    assert (out / "model.onnx").is_file() and not (out / GENAI_CONFIG).exists()
    assert json.loads((out / "export.json").read_text())["exporter"] == "optimum"


def test_the_builder_by_name_refuses_such_an_architecture_with_the_fix(tiny_gpt2, tmp_path):
    with pytest.raises(UserError) as info:
        export_onnx_step(str(tiny_gpt2), "text-generation", 17, "genai-builder", "O2", "none", str(tmp_path / "onnx"))
    assert "onnx.exporter = 'genai-builder'" in info.value.message and "GPT2LMHeadModel" in info.value.message
    assert "exporter: auto" in info.value.fix
    assert not (tmp_path / "onnx").exists()  # nothing half-written


def test_a_decoder_for_the_gpu_is_built_in_float16_and_answers_like_torch(tmp_path):
    """precision float16 (backend onnx on a GPU instance): the builder makes its float16 CUDA graph (KV cache in
    float16). ONNX Runtime's CPU provider runs that graph too, so its greedy text is checked here against torch
    float32; on the CUDA provider tests/test_onnx_gpu.py checks SmolLM2's."""
    import onnx
    import torch

    from hf2triton.serving.tasks.generation import GenerationEngine
    from tests.helpers import tiny_llama

    torch.manual_seed(0)
    model = tiny_llama(tmp_path / "tiny-llama", 256)
    out = tmp_path / "onnx"
    manifest = export_onnx_step(str(model), "text-generation", 17, "auto", "O2", "none", str(out), "float16")
    assert manifest["exporter"] == "genai-builder" and manifest["precision"] == "float16"
    assert '"cuda"' in (out / GENAI_CONFIG).read_text(), "built for the CUDA provider"
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    assert {i.type.tensor_type.elem_type for i in graph.input if i.name.startswith("past_key_values")} == {onnx.TensorProto.FLOAT16}
    texts = ["Tell me a story", "Hello there, how are you?", "x"]
    want = GenerationEngine(str(model), device="cpu", dtype="float32").run(texts, max_new_tokens=16)
    got = GenerationEngine(str(model), device="cpu", backend="onnx", onnx_dir=str(out)).run(texts, max_new_tokens=16)
    assert list(got["text_output"]) == list(want["text_output"])


def test_optimum_exports_a_decoder_for_the_gpu_in_float32_and_says_so(tiny_gpt2, tmp_path):
    manifest = export_onnx_step(str(tiny_gpt2), "text-generation", 17, "auto", "O2", "none", str(tmp_path / "onnx"), "float16")
    assert manifest["exporter"] == "optimum" and manifest["precision"] == "float32"
    assert json.loads((tmp_path / "onnx" / "export.json").read_text())["precision"] == "float32"
