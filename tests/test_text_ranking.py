"""text-ranking (cross-encoder rerankers): the engine's relevance scores equal the model in-process on the tokenizer's
pair encoding with sigmoid (no server), the query option, config checks, the rendered interface, and one real serve:
validation PASS, `infer --query` and the gateway's POST /v1/rerank equal to Triton's own answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hf2triton import host
from hf2triton.pipeline.pipeline_answers import compare_scores, cross_encoder_scores
from hf2triton.pipeline.validate import PROBES, RANKING_QUERY
from hf2triton.serving import inputs, interface
from hf2triton.triton import client
from tests.helpers import ROOT, assert_onnx_task_backends, make_workflow, passed_checks, tiny_reranker

DOCUMENTS = [
    "x",
    "Mr. O'Neil-Smith (CEO of ACME Corp.) flew from São Paulo to Paris.",
    "  leading and trailing spaces  ",
    "unaffable antidisestablishmentarianism supercalifragilistic, " + "and more words " * 40,  # cut to 128 tokens
]
MAX_SCORE_DIFF = {}  # query -> served vs reference


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    return tiny_reranker(tmp_path_factory.mktemp("reranker"))


def test_engine_scores_equal_the_cross_encoder_in_process(reranker):
    from hf2triton.serving.tasks.text_ranking import TextRankingEngine

    model_dir = str(reranker)
    texts = [*PROBES[interface.TEXT_RANKING], *DOCUMENTS]
    engine = TextRankingEngine(model_dir)
    engine.min_bucket = 2  # several length buckets: the pairs are padded in more than one batch
    for query in (RANKING_QUERY, "q", "a long query " * 30):
        served = engine.run(texts, query=query)
        reference = cross_encoder_scores(model_dir, query, texts)
        result = compare_scores(served, reference)
        assert result["ok"], (query, result, served, reference)
        assert served[interface.SCORE].dtype == np.float32 and served[interface.PROMPT_TOKENS].dtype == np.int32
        assert 0 < served[interface.SCORE].min() and served[interface.SCORE].max() < 1
        assert served[interface.PROMPT_TOKENS].max() <= 128  # truncated longest-first to the context
        MAX_SCORE_DIFF[query[:20]] = result["max_score_diff"]
        assert result["max_score_diff"] < 1e-5
    assert np.ptp(engine.run(texts, query=RANKING_QUERY)[interface.SCORE]) > 0.05  # the scores tell documents apart
    alone = engine.run(texts[-1:], query=RANKING_QUERY)[interface.SCORE]
    assert abs(float(alone[0]) - float(engine.run(texts, query=RANKING_QUERY)[interface.SCORE][-1])) < 1e-5
    try:  # sentence-transformers' own CrossEncoder, where it is installed (not in this project's environment)
        from sentence_transformers import CrossEncoder
    except ImportError:
        return
    theirs = CrossEncoder(model_dir, device="cpu").predict([(RANKING_QUERY, t) for t in texts])
    assert np.abs(np.asarray(theirs) - engine.run(texts, query=RANKING_QUERY)[interface.SCORE]).max() < 1e-5


def test_same_ranking_allows_ties_to_swap_but_not_a_real_reordering():
    """The same document twice scores equal in the reference; served from another batch's padding a few 1e-7 apart."""
    tokens = {interface.PROMPT_TOKENS: np.array([5, 5, 7], dtype=np.int32)}
    reference = {interface.SCORE: np.array([0.5, 0.5, 0.2], dtype=np.float32), **tokens}
    tie = compare_scores({interface.SCORE: np.array([0.4999998, 0.5000001, 0.2], dtype=np.float32), **tokens}, reference)
    assert tie["ok"] and tie["same_ranking"]
    close = {interface.SCORE: np.array([0.5, 0.5, 0.4995], dtype=np.float32), **tokens}  # reversed, each within 1e-3
    swapped = compare_scores({**close, interface.SCORE: np.array([0.4998, 0.4998, 0.4999], dtype=np.float32)}, close)
    assert not swapped["same_ranking"] and not swapped["ok"] and swapped["max_score_diff"] < 1e-3


def test_query_option():
    assert inputs.text_ranking_options(np.array([[b"q?"], [b"q?"]], dtype=np.object_), 100) == {interface.QUERY: "q?"}
    with pytest.raises(inputs.RequestError, match="input 'query' is missing"):
        inputs.text_ranking_options(None, 100)
    with pytest.raises(inputs.RequestError, match="one value per request"):
        inputs.text_ranking_options(np.array([[b"a"], [b"b"]], dtype=np.object_), 100)
    with pytest.raises(inputs.RequestError, match="query is empty"):
        inputs.text_ranking_options(np.array([[b"  "]], dtype=np.object_), 100)
    with pytest.raises(inputs.RequestError, match="exceeds max_input_bytes=4"):
        inputs.text_ranking_options(np.array([[b"abcdef"]], dtype=np.object_), 4)


def test_config_takes_text_ranking_on_python_and_onnx_and_renders_its_interface(reranker, tmp_path):
    from hf2triton.pipeline.render import render_model, serving_files
    from hf2triton.specs import ModelSpec, serving_values
    from hf2triton.triton.modelconfig import read_model_config

    (tmp_path / "config").mkdir()
    assert_onnx_task_backends(tmp_path / "config", interface.TEXT_RANKING, int8=False)
    serving = serving_values(ModelSpec(name="m", source=str(reranker), task=interface.TEXT_RANKING), gpu_available=False, cpus=2)
    assert "tasks/text_ranking.py" in {str(p).split("serving/")[-1] for p in serving_files(serving)}
    config = read_model_config(render_model(str(tmp_path / "m"), serving, str(reranker)) / "config.pbtxt")
    assert [(t.name, t.optional, list(t.dims)) for t in config.input] == [("text", False, [1]), ("query", True, [1])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("score", [1]), ("prompt_tokens", [1])]


def test_engine_refuses_a_classifier_of_several_labels(tmp_path):
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from hf2triton.serving.tasks.text_ranking import TextRankingEngine
    from tests.helpers import minilm_dir

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="one label.*has 2"):
        TextRankingEngine(str(tmp_path))


@pytest.fixture(scope="module")
def served(tmp_path_factory, reranker):
    """The reranker served with the OpenAI gateway (max_batch_size 4: the gateway splits 7 documents in two requests)."""
    model = {"name": "rank", "source": str(reranker), "task": interface.TEXT_RANKING, "max_batch_size": 4}
    workflow = make_workflow(tmp_path_factory.mktemp("rank-workflow"), [model])
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield workflow
    workflow.stop()


def _infer(workflow, *args: str) -> subprocess.CompletedProcess:
    """`python -m hf2triton infer rank ARGS` against the served workflow (over gRPC)."""
    command = [sys.executable, "-m", "hf2triton", "infer", "--grpc", workflow.settings().url("grpc_port"), "rank", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF2TRITON_CONFIG": ""}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)


def _rerank(workflow, body: dict, path: str = "/v1/rerank") -> tuple[int, dict]:
    status, text = client.http_post(f"http://127.0.0.1:{workflow.config['openai']['port']}{path}", body=body, timeout=60)
    return status, json.loads(text)


@pytest.mark.integration
def test_served_reranker_validates_and_the_gateway_answers_as_triton(served, reranker):
    import tritonclient.grpc as grpcclient

    checks = passed_checks(served, "rank", {"http equals grpc", "served equals in-process"})
    assert "3 documents' relevance as the cross-encoder in-process" in checks["served equals in-process"]["detail"]
    gateway = json.loads((served.directory / "results" / "validation" / "gateway.json").read_text())
    assert gateway["ok"] and [c["name"] for c in gateway["checks"]] == ["rank: rerank equals Triton", "rank: score equals Triton"], gateway
    documents = [*PROBES[interface.TEXT_RANKING], *DOCUMENTS]
    query = RANKING_QUERY
    triton = client.grpc_client(served.settings().url("grpc_port"))
    try:
        parts = [triton.infer("rank", client.build_inputs(grpcclient, documents[i : i + 4], {interface.QUERY: query})) for i in (0, 4)]
    finally:
        triton.close()
    direct = np.concatenate([p.as_numpy(interface.SCORE).reshape(-1) for p in parts])
    counts = np.concatenate([p.as_numpy(interface.PROMPT_TOKENS).reshape(-1) for p in parts])
    tokens = int(counts.sum())
    reference = cross_encoder_scores(str(reranker), query, documents)
    assert compare_scores({interface.SCORE: direct, interface.PROMPT_TOKENS: counts}, reference)["ok"]
    # the gateway: every document, best first, each score exactly Triton's (float32 through JSON), its text, the tokens
    status, answer = _rerank(served, {"model": "rank", "query": query, "documents": documents})
    assert status == 200, answer
    assert set(answer) == {"id", "model", "results", "usage"} and answer["model"] == "rank" and answer["id"].startswith("rerank-")
    results = answer["results"]
    assert [r["index"] for r in results] == sorted(range(len(documents)), key=lambda i: -float(direct[i]))
    assert all(np.float32(r["relevance_score"]) == direct[r["index"]] for r in results)
    assert all(r["document"] == {"text": documents[r["index"]]} for r in results)
    assert answer["usage"] == {"total_tokens": tokens}
    status, top = _rerank(served, {"model": "rank", "query": query, "documents": documents, "top_n": 2, "return_documents": False})
    assert status == 200 and top["results"] == [{k: r[k] for k in ("index", "relevance_score")} for r in results[:2]], top
    status, refused = _rerank(served, {"model": "rank", "documents": documents})
    assert status == 400 and refused["error"]["param"] == "query", refused
    # vLLM's other paths (Cohere's v2 client posts to /v2/rerank), Cohere v1's {"text": ...} documents: the same answer
    objects = [{"text": document} for document in documents]
    for path, body in (("/v2/rerank", {"documents": documents}), ("/rerank", {"documents": objects})):
        status, again = _rerank(served, {"model": "rank", "query": query, "top_n": 2, "return_documents": False, **body}, path)
        assert status == 200 and again["results"] == top["results"], (path, again)
    # the CLI: --json the scores in the documents' order, else best first; a reranker without --query is refused
    printed = _infer(served, "--query", query, "--json", *documents[:3])
    assert printed.returncode == 0, printed.stderr
    # (3 documents in one request, not 4: padded otherwise, so equal within float32 rounding, not bit for bit)
    assert np.abs(np.float32(json.loads(printed.stdout)["relevance_scores"]) - direct[:3]).max() < 1e-6
    readable = _infer(served, "--query", query, *documents[:3])
    assert readable.returncode == 0 and readable.stdout.split()[1::3] == ["text"] * 3, readable.stdout
    refused = _infer(served, documents[0])
    assert refused.returncode != 0 and "--query" in refused.stdout + refused.stderr
