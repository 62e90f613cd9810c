"""token-classification (NER taggers): the engine's entities equal transformers' pipeline for every aggregation
strategy and two architectures (no server), the request option and config checks, the rendered interface, and one
real serve of a tagger: validation PASS and `infer --json` printing the pipeline's JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from hf2triton.pipeline.validate import PROBES, compare_entities, entity_lists, pipeline_entities
from hf2triton.serving import inputs, interface
from tests.helpers import ROOT, assert_onnx_task_backends, assert_rendered_task, passed_checks, serving_workflow, tiny_tagger

TEXTS = [
    *PROBES[interface.TOKEN_CLASSIFICATION],
    "x",
    "Mr. O'Neil-Smith (CEO of ACME Corp.) flew from São Paulo to Zürich.",
    "  leading and trailing spaces  ",
    "unaffable antidisestablishmentarianism supercalifragilistic",
]
MAX_SCORE_DIFF = {}  # architecture/strategy -> served vs pipeline (printed in the summary of -s runs)


@pytest.fixture(scope="module")
def taggers(tmp_path_factory):
    root = tmp_path_factory.mktemp("taggers")
    return {arch: tiny_tagger(root / arch, arch) for arch in ("bert", "distilbert")}


@pytest.mark.parametrize("architecture", ["bert", "distilbert"])
def test_engine_entities_equal_the_pipeline_for_every_strategy(taggers, architecture):
    from hf2triton.serving.tasks.token_classification import TokenClassificationEngine

    engine = TokenClassificationEngine(str(taggers[architecture]))
    engine.min_bucket = 2  # several length buckets: the texts are padded in more than one batch
    for strategy in interface.AGGREGATION_STRATEGIES:
        served = entity_lists(engine.run(TEXTS, aggregation_strategy=strategy)[interface.ENTITIES])
        reference = entity_lists(pipeline_entities(str(taggers[architecture]), TEXTS, strategy=strategy))
        result = compare_entities(served, reference)
        assert result["ok"], (strategy, result, served, reference)
        assert result["entities"] > len(TEXTS), "the tagger finds entities (a test of nothing otherwise)"
        keys = {"none": ["entity", "score", "index", "word", "start", "end"]}.get(
            strategy, ["entity_group", "score", "word", "start", "end"]
        )
        assert all(list(e) == keys for entities in served for e in entities), strategy
        for text, entities in zip(TEXTS, served):  # offsets into the original text
            assert all(0 <= e["start"] < e["end"] <= len(text) for e in entities)
        MAX_SCORE_DIFF[f"{architecture}/{strategy}"] = result["max_score_diff"]
        assert result["max_score_diff"] < 1e-5
    # one text alone gives the same answer as in a batch (padding does not change it)
    alone = entity_lists(engine.run(TEXTS[:1])[interface.ENTITIES])
    assert compare_entities(alone, entity_lists(engine.run(TEXTS)[interface.ENTITIES])[:1])["ok"]


def test_aggregation_strategy_option():
    assert inputs.token_classification_options(None)[interface.AGGREGATION_STRATEGY] == "simple"
    raw = np.array([[b"FIRST"], [b"first"]], dtype=np.object_)
    assert inputs.token_classification_options(raw)[interface.AGGREGATION_STRATEGY] == "first"
    with pytest.raises(inputs.RequestError, match="one of none, simple, first, average, max"):
        inputs.token_classification_options(np.array([[b"longest"]], dtype=np.object_))
    with pytest.raises(inputs.RequestError, match="one value per request"):
        inputs.token_classification_options(np.array([[b"max"], [b"none"]], dtype=np.object_))


def test_config_takes_a_tagger_on_python_and_onnx_not_tensorrt_nor_int8(tmp_path):
    assert_onnx_task_backends(tmp_path, interface.TOKEN_CLASSIFICATION, int8=False)


def test_rendered_interface(taggers, tmp_path):
    task = interface.TOKEN_CLASSIFICATION
    assert_rendered_task(tmp_path, taggers["bert"], task, "token_classification", ("aggregation_strategy", "stride"), "entities")


@pytest.fixture(scope="module")
def served(tmp_path_factory, taggers):
    entry = {"name": "ner", "source": str(taggers["bert"]), "task": "token-classification", "max_batch_size": 4}
    yield from serving_workflow(tmp_path_factory.mktemp("ner-workflow"), entry)


@pytest.mark.integration
def test_served_tagger_validates_and_infer_prints_the_pipelines_json(served, taggers):
    checks = passed_checks(served, "ner", {"http equals grpc", "served equals in-process", "aggregation strategies equal the pipeline"})
    assert "as transformers' pipeline" in checks["served equals in-process"]["detail"]
    grpc = served.settings().url("grpc_port")
    text = "Angela Merkel met Emmanuel Macron in Paris."
    env = {"PYTHONPATH": str(ROOT), "HF2TRITON_CONFIG": ""}
    for strategy in ("simple", "none"):
        command = [sys.executable, "-m", "hf2triton", "infer", "--grpc", grpc, "ner", text, "--json", "--aggregation-strategy", strategy]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**_environ(), **env}, check=False)
        assert result.returncode == 0, result.stderr
        assert compare_entities(
            [json.loads(result.stdout)], entity_lists(pipeline_entities(str(taggers["bert"]), [text], strategy=strategy))
        )["ok"], result.stdout
    readable = subprocess.run(
        [sys.executable, "-m", "hf2triton", "infer", "--grpc", grpc, "ner", text],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_environ(), **env},
    )
    expected = json.loads(pipeline_entities(str(taggers["bert"]), [text])[0])
    lines = readable.stdout.strip().splitlines()
    assert readable.returncode == 0 and len(lines) == len(expected), readable.stdout + readable.stderr
    assert all(f"[{e['start']}:{e['end']}]" in line and e["entity_group"] in line for e, line in zip(expected, lines))


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)
