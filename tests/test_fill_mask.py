"""fill-mask (masked language models): the engine's candidates equal transformers' pipeline for several top_k and two
architectures (no server), the request checks (top_k, exactly one mask token), config checks, the rendered interface,
and one real serve: validation PASS and `infer --json` printing the pipeline's JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hf2triton.pipeline.pipeline_answers import compare_entities, entity_lists, pipeline_candidates, probe_texts
from hf2triton.pipeline.validate import PROBES
from hf2triton.serving import inputs, interface
from tests.helpers import ROOT, assert_onnx_task_backends, assert_rendered_task, passed_checks, serving_workflow, tiny_masked_lm

TEXTS = [
    "[MASK]",
    "x [MASK]",
    "Mr. O'Neil-Smith (CEO of ACME Corp.) flew from São Paulo to [MASK].",
    "  leading and trailing spaces [MASK]  ",
    "[MASK] unaffable antidisestablishmentarianism supercalifragilistic, " + "and more words " * 12,
]
MAX_SCORE_DIFF = {}  # architecture/top_k -> served vs pipeline
ARCHITECTURES = ("bert", "distilbert")  # BertForMaskedLM, DistilBertForMaskedLM


@pytest.fixture(scope="module")
def masked_lms(tmp_path_factory):
    """Both tiny masked LMs, built once for the module."""
    return {architecture: tiny_masked_lm(tmp_path_factory.mktemp(architecture), architecture) for architecture in ARCHITECTURES}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_engine_candidates_equal_the_pipeline(masked_lms, architecture):
    from hf2triton.serving.tasks.fill_mask import FillMaskEngine

    model_dir = str(masked_lms[architecture])
    texts = [*probe_texts(interface.FILL_MASK, model_dir, PROBES[interface.FILL_MASK]), *TEXTS]
    engine = FillMaskEngine(model_dir)
    engine.min_bucket = 2  # several length buckets: the texts are padded in more than one batch
    for top_k in (1, 5, 50):
        served = entity_lists(engine.run(texts, top_k=top_k)[interface.CANDIDATES])
        reference = entity_lists(pipeline_candidates(model_dir, texts, top_k=top_k))
        result = compare_entities(served, reference)
        assert result["ok"], (top_k, result, served, reference)
        assert result["entities"] == top_k * len(texts)
        assert all(list(c) == ["score", "token", "token_str", "sequence"] for each in served for c in each)
        assert all("[MASK]" not in c["sequence"] and c["token_str"] for each in served for c in each)
        MAX_SCORE_DIFF[f"{architecture}/{top_k}"] = result["max_score_diff"]
        assert result["max_score_diff"] < 1e-5
    # one text alone gives the same answer as in a batch (padding does not change it)
    alone = entity_lists(engine.run(texts[-1:])[interface.CANDIDATES])
    assert compare_entities(alone, entity_lists(engine.run(texts)[interface.CANDIDATES])[-1:])["ok"]
    # a text without a mask token, or with two: a clear error naming the mask token
    with pytest.raises(inputs.RequestError, match=r"no mask token.*put \[MASK\]"):
        engine.check_masks([texts[0], "no mask here"])
    with pytest.raises(inputs.RequestError, match=r"2 mask tokens \[MASK\].*exactly one"):
        engine.check_masks(["two [MASK] and [MASK]"])
    with pytest.raises(inputs.RequestError, match="within its first 128 tokens"):
        engine.check_masks(["word " * 200 + "[MASK]"])
    # a mask inside the context of a longer text: refused, where the answer's `sequence` was the cut text
    with pytest.raises(inputs.RequestError, match="longer than this model's context of 128 tokens"):
        engine.run(["The [MASK] of " + "word " * 200 + "THE END"])


def test_top_k_option():
    assert inputs.fill_mask_options(None) == {interface.TOP_K: 5}
    assert inputs.fill_mask_options(np.array([[50], [50]], dtype=np.int32)) == {interface.TOP_K: 50}
    for bad in (0, 51, -1):
        with pytest.raises(inputs.RequestError, match="top_k=.* between 1 and 50"):
            inputs.fill_mask_options(np.array([[bad]], dtype=np.int32))
    with pytest.raises(inputs.RequestError, match="one value per request"):
        inputs.fill_mask_options(np.array([[1], [2]], dtype=np.int32))


def test_candidates_tied_in_score_may_come_in_either_order_and_either_may_be_cut_off():
    """float16 on a GPU rounds many small probabilities of a vocabulary to one value (the H200's top_k 50 check failed
    on such a tie, 2026-12-05): the candidates' order among ties, and which tied one the top-k keeps, are not the model's."""

    def candidates(*pairs):
        return [[{"score": score, "token": token} for token, score in pairs]]

    served = candidates((1, 0.5), (2, 0.1), (3, 0.1))
    assert compare_entities(served, candidates((1, 0.5), (3, 0.1), (2, 0.1)), ranked=True)["ok"]
    assert compare_entities(served, candidates((1, 0.5), (3, 0.1), (4, 0.1)), ranked=True)["ok"]  # 2 and 4 tie at the cut
    assert not compare_entities(served, candidates((1, 0.5), (3, 0.1), (2, 0.1)))["ok"]  # entities: order is the text's
    assert not compare_entities(served, candidates((1, 0.5), (3, 0.3), (2, 0.1)), ranked=True)["ok"]
    assert not compare_entities(served, candidates((9, 0.5), (2, 0.1), (3, 0.1)), ranked=True)["ok"]


def test_config_takes_fill_mask_on_python_and_onnx_and_renders_its_interface(masked_lms, tmp_path):
    (tmp_path / "config").mkdir()
    assert_onnx_task_backends(tmp_path / "config", interface.FILL_MASK, int8=True)
    assert_rendered_task(tmp_path, masked_lms["bert"], interface.FILL_MASK, "fill_mask", "top_k", "candidates")


@pytest.fixture(scope="module")
def served(tmp_path_factory, masked_lms):
    """The BERT masked LM served (max_batch_size 4: the 3 probes fit one request)."""
    model = {"name": "mlm", "source": str(masked_lms["bert"]), "task": interface.FILL_MASK, "max_batch_size": 4}
    yield from serving_workflow(tmp_path_factory.mktemp("mlm-workflow"), model)


def _infer(workflow, *args: str) -> subprocess.CompletedProcess:
    """`python -m hf2triton infer mlm ARGS` against the served workflow (over gRPC)."""
    command = [sys.executable, "-m", "hf2triton", "infer", "--grpc", workflow.settings().url("grpc_port"), "mlm", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF2TRITON_CONFIG": ""}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.mark.integration
def test_served_fill_mask_validates_and_infer_prints_the_pipelines_json(served, masked_lms):
    checks = passed_checks(served, "mlm", {"http equals grpc", "served equals in-process", "top_k equals the pipeline"})
    assert "candidates of 3 texts as transformers' pipeline" in checks["served equals in-process"]["detail"]
    text = "Paris is the [MASK] of France."
    for top_k in (None, 3):
        result = _infer(served, text, "--json", *(("--top-k", str(top_k)) if top_k else ()))
        assert result.returncode == 0, result.stderr
        reference = entity_lists(pipeline_candidates(str(masked_lms["bert"]), [text], top_k=top_k or 5))
        assert compare_entities([json.loads(result.stdout)], reference)["ok"], result.stdout
    readable = _infer(served, text)
    assert readable.returncode == 0 and len(readable.stdout.strip().splitlines()) == 5, readable.stdout + readable.stderr
    refused = _infer(served, "no mask in this text")
    assert refused.returncode != 0 and "put [MASK]" in refused.stdout + refused.stderr
    refused = _infer(served, text, "--top-k", "51")
    assert refused.returncode != 0 and "between 1 and 50" in refused.stdout + refused.stderr
