"""token-classification of texts longer than the context: with a stride, the engine's windows (all texts' in the same
batches) merged equal transformers' `pipeline("token-classification", stride=N)` for every strategy it allows with a
stride; the request option and the stride's checks (request and model default). A tagger with a 32-token context, so
texts of a few sentences already span several windows. No server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf2triton.pipeline.pipeline_answers import compare_entities, entity_lists, pipeline_entities
from hf2triton.serving import inputs, interface
from hf2triton.serving.inputs import RequestError
from tests.helpers import tiny_tagger

CONTEXT = 32
SENTENCES = [
    "John Smith met Maria Garcia in Paris on Monday.",
    "ACME Corp. opened an office in São Paulo, said Mr. O'Neil-Smith.",
    "The United Nations convened in Geneva; Angela Merkel and Emmanuel Macron attended.",
    "unaffable antidisestablishmentarianism supercalifragilistic Zürich Berlin Tokyo",
]
LONG_TEXTS = [" ".join(SENTENCES * 3), " ".join(reversed(SENTENCES * 2)), SENTENCES[0], "x"]
WINDOWED_STRATEGIES = [s for s in interface.AGGREGATION_STRATEGIES if s != "none"]  # the pipeline refuses none with a stride


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    return tiny_tagger(tmp_path_factory.mktemp("short-context") / "bert", context=CONTEXT)


@pytest.fixture(scope="module")
def engine(tagger):
    from hf2triton.serving.tasks.token_classification import TokenClassificationEngine

    engine = TokenClassificationEngine(str(tagger))
    engine.min_bucket = 2  # windows of several texts, in more than one length bucket
    return engine


def test_long_texts_span_several_windows(engine):
    assert engine.max_length == CONTEXT and engine.window == CONTEXT - 2
    windows = [1 + len(e.overflowing) for e in engine.tokenize(LONG_TEXTS, stride=8)]
    assert windows[0] >= 6 and windows[1] >= 4 and windows[3] == 1, windows


@pytest.mark.parametrize("stride", [0, 8, 29])
@pytest.mark.parametrize("strategy", WINDOWED_STRATEGIES)
def test_windowed_entities_equal_the_pipeline_with_stride(engine, tagger, strategy, stride):
    served = entity_lists(engine.run(LONG_TEXTS, aggregation_strategy=strategy, stride=stride)[interface.ENTITIES])
    reference = entity_lists(pipeline_entities(str(tagger), LONG_TEXTS, strategy=strategy, stride=stride))
    result = compare_entities(served, reference)
    assert result["ok"] and result["max_score_diff"] <= 1e-4, (result, served, reference)
    assert len(served[0]) > 10, "entities all along the long text (a test of nothing otherwise)"
    assert max(e["end"] for e in served[0]) > len(LONG_TEXTS[0]) * 0.8, "entities beyond the first window"
    # windows of one text alone give the answer they give in a batch
    alone = entity_lists(engine.run(LONG_TEXTS[:1], aggregation_strategy=strategy, stride=stride)[interface.ENTITIES])
    assert compare_entities(alone, served[:1])["ok"]


def test_without_stride_long_texts_are_truncated_as_the_pipeline(engine, tagger):
    served = entity_lists(engine.run(LONG_TEXTS)[interface.ENTITIES])
    assert compare_entities(served, entity_lists(pipeline_entities(str(tagger), LONG_TEXTS)))["ok"]
    assert max(e["end"] for e in served[0]) < len(LONG_TEXTS[0]) / 3


def test_model_default_stride_and_its_checks(tagger):
    from hf2triton.serving.tasks.token_classification import TokenClassificationEngine

    engine = TokenClassificationEngine(str(tagger), stride=8)
    windowed = engine.run(LONG_TEXTS[:1])[interface.ENTITIES]  # the default applies
    assert compare_entities(entity_lists(windowed), entity_lists(pipeline_entities(str(tagger), LONG_TEXTS[:1], stride=8)))["ok"]
    truncated = engine.run(LONG_TEXTS[:1], aggregation_strategy="none", stride=interface.NO_STRIDE)  # a request turns it off
    assert compare_entities(
        entity_lists(truncated[interface.ENTITIES]), entity_lists(pipeline_entities(str(tagger), LONG_TEXTS[:1], strategy="none"))
    )["ok"]
    with pytest.raises(RequestError, match="stride=8 needs an aggregation_strategy other than none"):
        engine.check_options("none", 8)
    with pytest.raises(RequestError, match=r"stride=30 must be less than the window of 30 tokens .*use 0 to 29"):
        engine.check_options("simple", 30)
    with pytest.raises(ValueError, match=r"token_classification.stride: stride=40 must be less than the window of 30 tokens"):
        TokenClassificationEngine(str(tagger), stride=40)


def test_stride_request_option():
    assert inputs.token_classification_options(None) == {interface.AGGREGATION_STRATEGY: "simple", interface.STRIDE: interface.NO_STRIDE}
    assert inputs.token_classification_options(None, None, 16)[interface.STRIDE] == 16  # the model's default
    raw = np.array([[4], [4]], dtype=np.int32)
    assert inputs.token_classification_options(np.array([[b"max"]], dtype=np.object_), raw, 16) == {
        "aggregation_strategy": "max",
        "stride": 4,
    }
    with pytest.raises(RequestError, match=r"stride=-3 is negative: send the tokens consecutive windows share \(0 or more\), or -1"):
        inputs.token_classification_options(None, np.array([[-3]], dtype=np.int32))
    with pytest.raises(RequestError, match="stride must hold one value per request"):
        inputs.token_classification_options(None, np.array([[1], [2]], dtype=np.int32))


def test_render_writes_the_stride_and_refuses_one_the_windows_cannot_hold(tagger, tmp_path):
    from hf2triton.errors import UserError
    from hf2triton.pipeline.render import render_model
    from hf2triton.specs import ModelSpec, serving_values
    from hf2triton.triton.modelconfig import read_model_config

    def render(stride: int):
        spec = ModelSpec(name="ner", source=str(tagger), task=interface.TOKEN_CLASSIFICATION, stride=stride)
        return render_model(str(tmp_path / f"ner{stride}"), serving_values(spec, gpu_available=False, cpus=2), str(tagger))

    assert read_model_config(render(8) / "config.pbtxt").parameters["stride"].string_value == "8"
    with pytest.raises(UserError) as refused:
        render(30)
    assert "model ner: token_classification.stride = 30 does not fit its windows of 30 text tokens" in refused.value.render()
    assert "set token_classification.stride for ner to 0-29" in refused.value.render()


def test_config_stride_only_for_a_tagger(tmp_path):
    import yaml

    from hf2triton.config import load_config
    from hf2triton.errors import UserError

    entry = {"name": "m", "source": "./m", "task": "text-classification", "token_classification": {"stride": 16}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    with pytest.raises(UserError, match=r"config.models\[0\].token_classification.stride: only for task token-classification"):
        load_config(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tagger):
    from tests.helpers import serving_workflow

    entry = {
        "name": "ner",
        "source": str(tagger),
        "task": "token-classification",
        "max_batch_size": 4,
        "token_classification": {"stride": 8},
    }
    yield from serving_workflow(tmp_path_factory.mktemp("ner-stride-workflow"), entry)


@pytest.mark.integration
def test_served_tagger_with_a_stride_validates_and_infer_windows_long_texts(served, tagger):
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT, passed_checks

    checks = passed_checks(served, "ner", {"served equals in-process", "aggregation strategies equal the pipeline"})
    assert "stride 8" in checks["aggregation strategies equal the pipeline"]["detail"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF2TRITON_CONFIG": ""}
    infer = [sys.executable, "-m", "hf2triton", "infer", "--grpc", served.settings().url("grpc_port"), "ner", LONG_TEXTS[0], "--json"]
    result = subprocess.run(
        [*infer, "--stride", "4", "--aggregation-strategy", "max"], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    reference = entity_lists(pipeline_entities(str(tagger), LONG_TEXTS[:1], strategy="max", stride=4))
    assert compare_entities([json.loads(result.stdout)], reference)["ok"], result.stdout
    refused = subprocess.run([*infer, "--stride", "30"], capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0 and "stride=30 must be less than the window of 30 tokens" in refused.stderr + refused.stdout
