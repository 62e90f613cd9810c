"""feature-extraction as sentence-transformers defines it: every Pooling mode (alone and concatenated), Normalize only
where modules.json lists it, prompts (prepended; with include_prompt false left out of the pooling), decoder-based
embedders (lasttoken, left-padding tokenizers) on torch and ONNX Runtime, Matryoshka `dimensions`. The engine is held
to the independent reference (pipeline_answers.sentence_embeddings: sentence-transformers' encode re-written from its
source, each text alone) with no server; one real serve of two embedders checks validation and the gateway."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.gateway.errors import ApiError
from hf2triton.gateway.protocol import ServedModel, embedding_dimensions, embedding_prompt, matryoshka
from hf2triton.pipeline.pipeline_answers import compare_embeddings, sentence_embeddings
from hf2triton.serving import inputs, interface, pooling
from hf2triton.triton import client
from tests.helpers import ROOT, make_workflow, passed_checks, sentence_transformers_files, tiny_bert_embedder, tiny_decoder_embedder

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "x",
    "  leading and trailing spaces  ",
    "Triton sert des modèles — ça marche très bien. 東京は日本の首都です。",
    "a longer text of many words " * 30,  # cut to the 128-token context
]
PROMPTS = {"query": "query: Represent this sentence for searching relevant passages: ", "passage": "passage: "}
DECODER_PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:", "document": ""}


def _assert_equal(served: dict, reference: dict, what) -> float:
    """Served equals the reference: the same tokens, every value within 1e-5 (float32 on the CPU), lengths too."""
    assert served[interface.EMBEDDING].dtype == np.float32 and served[interface.PROMPT_TOKENS].dtype == np.int32
    assert served[interface.PROMPT_TOKENS].tolist() == reference[interface.PROMPT_TOKENS].tolist(), what
    diff = float(np.abs(served[interface.EMBEDDING] - reference[interface.EMBEDDING]).max())
    assert diff < 1e-5 and compare_embeddings(served, reference, 0.999)["ok"], (what, diff)
    return diff


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return tiny_bert_embedder(tmp_path_factory.mktemp("bert") / "model")


def _variant(bert, tmp_path, name: str, **files):
    directory = tmp_path / name
    shutil.copytree(bert, directory)
    return sentence_transformers_files(directory, **files)


def test_pooling_config_is_read_as_sentence_transformers_reads_it(bert, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(bert, plain)
    assert pooling.read(str(plain)) == pooling.SentenceEmbedding(), "no modules.json: mean, normalised (as before)"
    (plain / "1_Pooling").mkdir()
    (plain / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    assert pooling.read(str(plain)).modes == ("cls",) and pooling.read(str(plain)).normalize
    model = _variant(bert, tmp_path, "st", modes=("lasttoken",), normalize=False, prompts={"query": "q: "}, default_prompt_name="query")
    read = pooling.read(str(model))
    assert (read.modes, read.normalize, read.include_prompt, read.default_prompt_name) == (("lasttoken",), False, True, "query")
    assert read.prompts == {"query": "q: ", "document": ""} and read.prompt() == "q: " and read.prompt("document") == ""
    assert read.prepare("  Hi  ") == "Hi" and read.width(32) == 32
    config = model / "1_Pooling" / "config.json"
    config.write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True}))  # mean defaults to true
    assert pooling.read(str(model)).modes == ("cls", "mean") and pooling.read(str(model)).width(32) == 64
    config.write_text(json.dumps({"pooling_mode": "WeightedMean", "pooling_mode_cls_token": True}))  # the string wins
    assert pooling.read(str(model)).modes == ("weightedmean",)
    config.write_text(json.dumps({"pooling_mode_mean_tokens": False}))
    with pytest.raises(ValueError, match="no pooling mode"):
        pooling.read(str(model))
    config.write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    modules = json.loads((model / "modules.json").read_text())
    (model / "modules.json").write_text(json.dumps([*modules, {"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ValueError, match="Dense.*any other would change"):
        pooling.read(str(model))
    (model / "modules.json").write_text(json.dumps(modules))
    (model / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "q: "}, "default_prompt_name": "nope"}))
    with pytest.raises(ValueError, match="default_prompt_name 'nope'"):
        pooling.read(str(model))
    for declared, expected in (({"matryoshka_dimensions": [8, 16, 32]}, "32,16,8"), ({"is_matryoshka": True}, "any"), ({}, "")):
        matryoshka_model = tmp_path / f"m{expected}"
        tiny_bert_embedder(matryoshka_model, **declared)
        assert pooling.read(str(matryoshka_model)).matryoshka == expected


CONFIGS = [  # (modes, normalize, include_prompt)
    (("cls",), True, True),
    (("max",), False, True),
    (("mean",), True, False),
    (("mean_sqrt_len_tokens",), False, True),
    (("weightedmean",), False, False),
    (("lasttoken",), True, False),
    (("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"), False, True),  # concatenated in Pooling's order
]


@pytest.mark.parametrize("modes,normalize,include_prompt", CONFIGS)
def test_engine_equals_sentence_transformers_for_each_pooling_mode(bert, tmp_path, modes, normalize, include_prompt):
    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    files = {"modes": modes, "normalize": normalize, "include_prompt": include_prompt, "prompts": PROMPTS}
    model = str(_variant(bert, tmp_path, "m", **files, default_prompt_name="passage"))
    engine = EmbeddingEngine(model, min_bucket=2)  # several length buckets, each padded
    for prompt_name in (None, "query", "document"):  # None: the default prompt (passage)
        served = engine.run(TEXTS, prompt_name=prompt_name)
        _assert_equal(served, sentence_embeddings(model, TEXTS, prompt_name=prompt_name), (modes, prompt_name))
        assert served[interface.EMBEDDING].shape == (len(TEXTS), 32 * len(modes))
        norms = np.linalg.norm(served[interface.EMBEDDING], axis=1)
        assert np.allclose(norms, 1.0, atol=1e-5) == normalize, "normalised exactly when modules.json lists Normalize"
    query, document = engine.run(TEXTS, prompt_name="query"), engine.run(TEXTS, prompt_name="document")
    assert query[interface.PROMPT_TOKENS].min() > document[interface.PROMPT_TOKENS].min(), "the prompt's tokens are counted"
    assert np.abs(query[interface.EMBEDDING] - document[interface.EMBEDDING]).max() > 1e-3, "the prompt changes the embedding"
    alone = engine.run(TEXTS[3:4], prompt_name="query")[interface.EMBEDDING][0]
    assert np.abs(alone - query[interface.EMBEDDING][3]).max() < 1e-5, "a text's embedding does not depend on its batch"


def test_include_prompt_false_leaves_the_prompts_tokens_out(bert, tmp_path):
    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    included, excluded = (
        EmbeddingEngine(str(_variant(bert, tmp_path, f"p{flag}", modes=("mean",), include_prompt=flag, prompts=PROMPTS)))
        for flag in (True, False)
    )
    assert excluded.prompt_length(PROMPTS["query"]) == len(excluded.tokenizer(PROMPTS["query"].strip())["input_ids"]) - 1  # no [SEP]
    with_prompt, without = (engine.run(TEXTS[:2], prompt_name="query")[interface.EMBEDDING] for engine in (included, excluded))
    assert np.abs(with_prompt - without).max() > 1e-3


@pytest.fixture(scope="module")
def decoder_tokenizer(tiny_models):
    return tiny_models["text-generation"]  # SmolLM2's BPE tokenizer


@pytest.mark.parametrize("modes,include_prompt", [(("lasttoken",), True), (("weightedmean",), False)])
def test_decoder_embedder_equals_sentence_transformers_with_either_padding(decoder_tokenizer, tmp_path, modes, include_prompt):
    """A Qwen2Model embedder whose tokenizer pads on the left: the engine pads right (fast tokenizer, length buckets)
    or, without its fast tokenizer, as the tokenizer says (left, one batch); both equal the reference."""
    from hf2triton.serving.tasks.embedding import EmbeddingEngine, is_decoder

    model = tiny_decoder_embedder(tmp_path / "decoder", decoder_tokenizer)
    sentence_transformers_files(model, modes=modes, include_prompt=include_prompt, prompts=DECODER_PROMPTS)
    engine = EmbeddingEngine(str(model), min_bucket=2)
    assert engine.tokenizer.padding_side == "left" and engine.fast_tokenizer is not None and is_decoder(engine.model.config)
    for prompt_name in (None, "query"):
        reference = sentence_embeddings(str(model), TEXTS, prompt_name=prompt_name)
        _assert_equal(engine.run(TEXTS, prompt_name=prompt_name), reference, (modes, prompt_name, "right-padded"))
        batch = engine.tokenizer(TEXTS, padding=True)["attention_mask"]
        assert batch[1][0] == 0, "the tokenizer pads on the left"
        fast, engine.fast_tokenizer = engine.fast_tokenizer, None
        try:
            _assert_equal(engine.run(TEXTS, prompt_name=prompt_name), reference, (modes, prompt_name, "left-padded"))
        finally:
            engine.fast_tokenizer = fast


def test_decoder_embedder_on_onnx_runtime(decoder_tokenizer, tmp_path):
    """backend onnx: the decoder's export takes position_ids (the runtime fills them in), pooled as on torch."""
    from hf2triton.pipeline.export import export_onnx_step
    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    model = tiny_decoder_embedder(tmp_path / "decoder", decoder_tokenizer)
    sentence_transformers_files(model, modes=("lasttoken",), prompts=DECODER_PROMPTS)
    export_onnx_step(str(model), interface.FEATURE_EXTRACTION, 17, "auto", "O2", "none", str(tmp_path / "onnx"))
    engine = EmbeddingEngine(str(model), backend="onnx", onnx_dir=str(tmp_path / "onnx"), num_threads=2, min_bucket=2)
    assert "position_ids" in engine.model.input_names
    for prompt_name in (None, "query"):
        _assert_equal(
            engine.run(TEXTS, prompt_name=prompt_name), sentence_embeddings(str(model), TEXTS, prompt_name=prompt_name), prompt_name
        )


def test_prompt_name_option():
    names = ("query", "document")
    assert inputs.embedding_options(None, names) == {}
    assert inputs.embedding_options(np.array([[b"query"], [b"query"]], dtype=np.object_), names) == {interface.PROMPT_NAME: "query"}
    with pytest.raises(inputs.RequestError, match="prompt_name='nope' is not one of this model's prompts: query, document"):
        inputs.embedding_options(np.array([[b"nope"]], dtype=np.object_), names)
    with pytest.raises(inputs.RequestError, match="one value per request"):
        inputs.embedding_options(np.array([[b"query"], [b"document"]], dtype=np.object_), names)


def test_gateway_prompt_name_and_dimensions():
    plain = ServedModel("m", interface.FEATURE_EXTRACTION, False, 4, prompt_names=("query", "document"), width=32)
    listed = ServedModel("l", interface.FEATURE_EXTRACTION, False, 4, prompt_names=("query",), width=32, matryoshka="32,16,8")
    free = ServedModel("f", interface.FEATURE_EXTRACTION, False, 4, width=32, normalized=False, matryoshka="any")
    assert embedding_prompt({}, plain) is None and embedding_prompt({"prompt_name": "document"}, plain) == "document"
    for bad in ("nope", 3, ["query"]):
        with pytest.raises(ApiError) as refused:
            embedding_prompt({"prompt_name": bad}, plain)
        assert refused.value.status == 400 and refused.value.param == "prompt_name" and "query, document" in str(refused.value)
    assert embedding_dimensions({}, plain) is None
    with pytest.raises(ApiError, match="does not support matryoshka representation") as refused:
        embedding_dimensions({"dimensions": 16}, plain)
    assert refused.value.param == "dimensions"
    assert embedding_dimensions({"dimensions": 16}, listed) == 16 and embedding_dimensions({"dimensions": 5}, free) == 5
    for model, bad in ((listed, 12), (listed, 64), (free, 33), (free, 0), (free, "8"), (free, 2.5)):
        with pytest.raises(ApiError) as refused:
            embedding_dimensions({"dimensions": bad}, model)
        assert refused.value.status == 400 and refused.value.param == "dimensions", (model.name, bad)
    vectors = np.random.default_rng(0).normal(size=(3, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cut = matryoshka(vectors, 8, normalized=True)
    assert cut.shape == (3, 8) and cut.dtype == np.float32 and np.allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-6)
    assert np.allclose(cut * np.linalg.norm(vectors[:, :8], axis=1, keepdims=True), vectors[:, :8], atol=1e-6)
    assert np.array_equal(matryoshka(vectors, 8, normalized=False), vectors[:, :8]) and matryoshka(vectors, None, True) is vectors


def test_render_writes_the_embedding_facts_and_refuses_other_modules(bert, tmp_path):
    from hf2triton.pipeline.render import render_model
    from hf2triton.specs import ModelSpec, serving_values
    from hf2triton.triton.modelconfig import model_parameters, read_model_config

    model = tiny_bert_embedder(tmp_path / "source", matryoshka_dimensions=[8, 16])
    sentence_transformers_files(model, modes=("cls", "mean"), normalize=False, prompts=PROMPTS)
    serving = serving_values(ModelSpec(name="m", source=str(model), task=interface.FEATURE_EXTRACTION), gpu_available=False, cpus=2)
    config = read_model_config(render_model(str(tmp_path / "m"), serving, str(model)) / "config.pbtxt")
    assert [(t.name, t.optional) for t in config.input] == [("text", False), ("prompt_name", True)]
    assert [(t.name, list(t.dims)) for t in config.output] == [("embedding", [64]), ("prompt_tokens", [1])]  # two modes of 32
    params = model_parameters(config)
    assert json.loads(params.prompt_names) == ["query", "document", "passage"]
    assert (params.normalize, params.matryoshka_dimensions) == (False, "16,8")
    modules = json.loads((model / "modules.json").read_text())
    (model / "modules.json").write_text(json.dumps([*modules, {"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(UserError, match="Dense") as refused:
        render_model(str(tmp_path / "m2"), serving, str(model))
    assert "Transformer, Pooling and Normalize" in refused.value.fix


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="CUDA graphs need a CUDA GPU (the H200: benchmarks/h200/README.md)")
def test_every_mode_in_cuda_graphs_and_a_decoder_on_the_gpu(bert, decoder_tokenizer, tmp_path):
    """On a GPU (float16): the pooling of every mode replayed in torch CUDA graphs (prompt included), and a decoder
    embedder (eager: no graphs), each equal to sentence-transformers' float32 answer on the CPU."""
    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    modes = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
    encoder = _variant(bert, tmp_path, "all", modes=modes, normalize=False, prompts=PROMPTS)
    decoder = tiny_decoder_embedder(tmp_path / "decoder", decoder_tokenizer)
    sentence_transformers_files(decoder, modes=("lasttoken",), prompts=DECODER_PROMPTS)
    texts = [*TEXTS, *(f"sentence number {i} " * (i % 7 + 1) for i in range(40))]
    for model, graphed in ((encoder, True), (decoder, False)):
        engine = EmbeddingEngine(str(model), device="cuda:0", cuda_graphs=True)
        assert (engine.graphs is not None) == graphed
        for prompt_name in (None, "query"):
            for size in (1, 3, len(texts)):
                served = engine.run(texts[:size], prompt_name=prompt_name)
                reference = sentence_embeddings(str(model), texts[:size], prompt_name=prompt_name)
                assert compare_embeddings(served, reference, 0.999)["ok"], (model.name, prompt_name, size)
        assert not graphed or (engine.graphs.graphs and not engine.graphs.failed), engine.graphs and engine.graphs.failed


# ------------------------------------------------------------------ one real serve


@pytest.fixture(scope="module")
def served(tmp_path_factory, decoder_tokenizer):
    """Two embedders served with the gateway: `st` (a BERT: mean, Normalize, prompts with a default, Matryoshka widths
    16 and 8) and `qwen` (a Qwen2Model: lasttoken, no Normalize, is_matryoshka, Qwen3-Embedding's query prompt)."""
    root = tmp_path_factory.mktemp("embedders")
    bert = tiny_bert_embedder(root / "st", matryoshka_dimensions=[16, 8])
    sentence_transformers_files(bert, prompts=PROMPTS, default_prompt_name="passage")
    decoder = tiny_decoder_embedder(root / "qwen", decoder_tokenizer, is_matryoshka=True)
    sentence_transformers_files(decoder, modes=("lasttoken",), normalize=False, prompts=DECODER_PROMPTS)
    models = [
        {"name": name, "source": str(path), "task": interface.FEATURE_EXTRACTION, "max_batch_size": 4}
        for name, path in (("st", bert), ("qwen", decoder))
    ]
    workflow = make_workflow(root / "workflow", models)
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield workflow, {"st": str(bert), "qwen": str(decoder)}
    workflow.stop()


def _embeddings(workflow, body: dict) -> tuple[int, dict]:
    status, text = client.http_post(f"http://127.0.0.1:{workflow.config['openai']['port']}/v1/embeddings", body=body, timeout=60)
    return status, json.loads(text)


@pytest.mark.integration
def test_served_embedders_validate_and_the_gateway_takes_prompt_name_and_dimensions(served):
    workflow, sources = served
    checks = passed_checks(workflow, "st", {"http equals grpc", "served equals in-process", "prompts equal sentence-transformers'"})
    assert "query:" in checks["prompts equal sentence-transformers'"]["detail"]
    passed_checks(workflow, "qwen", {"served equals in-process", "prompts equal sentence-transformers'"})
    gateway = json.loads((workflow.directory / "results" / "validation" / "gateway.json").read_text())
    assert gateway["ok"] and len(gateway["checks"]) == 2 and all('"dimensions"' in c["detail"] for c in gateway["checks"]), gateway
    texts = TEXTS[:3]
    for name, dimensions in (("st", 8), ("qwen", 5)):
        for prompt_name in ("query", None):
            extra = {"prompt_name": prompt_name} if prompt_name else {}
            reference = sentence_embeddings(sources[name], texts, prompt_name=prompt_name)
            status, answer = _embeddings(workflow, {"model": name, "input": texts, **extra})
            assert status == 200, answer
            vectors = np.asarray([d["embedding"] for d in answer["data"]], dtype=np.float32)
            assert np.abs(vectors - reference[interface.EMBEDDING]).max() < 1e-5, (name, prompt_name)
            assert answer["usage"]["prompt_tokens"] == int(reference[interface.PROMPT_TOKENS].sum())
            status, answer = _embeddings(workflow, {"model": name, "input": texts, "dimensions": dimensions, **extra})
            assert status == 200, answer
            cut = np.asarray([d["embedding"] for d in answer["data"]], dtype=np.float32)
            want = reference[interface.EMBEDDING][:, :dimensions]
            want = want / np.linalg.norm(want, axis=1, keepdims=True) if name == "st" else want  # qwen does not normalise
            assert cut.shape == (3, dimensions) and np.abs(cut - want).max() < 1e-5, (name, prompt_name)
    for body, param, words in (
        ({"model": "st", "prompt_name": "nope"}, "prompt_name", "query, document, passage"),
        ({"model": "st", "dimensions": 12}, "dimensions", "only supports [16, 8]"),
        ({"model": "qwen", "dimensions": 33}, "dimensions", "out of range (1..32)"),
    ):
        status, answer = _embeddings(workflow, {"input": texts, **body})
        assert status == 400 and answer["error"]["param"] == param and words in answer["error"]["message"], answer
    command = [sys.executable, "-m", "hf2triton", "infer", "--grpc", workflow.settings().url("grpc_port"), "qwen", "--prompt-name", "query"]
    printed = subprocess.run(
        [*command, "--json", *texts], capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False
    )
    assert printed.returncode == 0, printed.stderr
    reference = sentence_embeddings(sources["qwen"], texts, prompt_name="query")[interface.EMBEDDING]
    assert np.abs(np.float32(json.loads(printed.stdout)["embeddings"]) - reference).max() < 1e-5
