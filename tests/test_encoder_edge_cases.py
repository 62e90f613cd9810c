"""Encoder tasks at their edges, each against transformers' own answer: one-label and regression classifiers score
as the text-classification pipeline does, rerankers apply the activation their config names, RoBERTa-family models
stop at the positions their padding offset leaves, encoders without a pad token serve batches, a reranker tagged
text-classification is served as one, and one request's failed pass fails that request alone."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest

from hf2triton.serving import interface
from tests.helpers import minilm_dir, tiny_reranker

TEXTS = ["a short text", "Mr. O'Neil-Smith flew from São Paulo to Paris.", "words " * 20]


def _tiny_classifier(directory: Path, **config) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model_config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=128, initializer_range=0.4, **config,
    )  # fmt: skip
    BertForSequenceClassification(model_config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    "config",
    [{"num_labels": 1}, {"num_labels": 1, "problem_type": "regression"}, {"num_labels": 3, "problem_type": "multi_label_classification"}],
    ids=["one-label", "regression", "multi-label"],
)
def test_classification_scores_equal_the_pipeline(tmp_path, config):
    """One label: sigmoid (softmax of one logit was always 1.0); regression: the raw value; multi-label: sigmoid."""
    from transformers import pipeline

    from hf2triton.serving.tasks.classification import ClassificationEngine

    model_dir = _tiny_classifier(tmp_path / "classifier", **config)
    served = ClassificationEngine(str(model_dir), num_threads=1).run(TEXTS)
    reference = pipeline("text-classification", model=str(model_dir), device="cpu")(TEXTS)
    assert [label.decode() for label in served[interface.LABEL].tolist()] == [r["label"] for r in reference]
    np.testing.assert_allclose(served[interface.SCORE], [r["score"] for r in reference], atol=1e-5)
    assert not np.allclose(served[interface.SCORE], 1.0)


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, "identity"),
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}, "tanh"),
        ({"sbert_ce_default_activation_function": "Sigmoid"}, "sigmoid"),  # not a torch path: CrossEncoder's default
    ],
    ids=["identity-before-v4", "tanh-v4", "unimportable-name"],
)
def test_a_rerankers_declared_activation_is_applied(tmp_path, declared, expected):
    """The ms-marco cross-encoders declare Identity: CrossEncoder answers their raw logits, and so does the server."""
    import torch

    from hf2triton.pipeline.pipeline_answers import cross_encoder_scores
    from hf2triton.serving.tasks.text_ranking import TextRankingEngine

    model_dir = tiny_reranker(tmp_path / "reranker")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, **declared}))
    served = TextRankingEngine(str(model_dir), num_threads=1).run(TEXTS, query="where did he fly")[interface.SCORE]
    reference = cross_encoder_scores(str(model_dir), "where did he fly", TEXTS)[interface.SCORE]
    np.testing.assert_allclose(served, reference, atol=1e-5)
    sigmoid_of = torch.sigmoid(torch.logit(torch.from_numpy(served).clamp(1e-6, 1 - 1e-6))).numpy()  # the identity on (0, 1)
    applied = {"sigmoid": served.min() > 0 and served.max() < 1, "identity": not np.allclose(served, sigmoid_of)}
    applied["tanh"] = served.min() > -1 and served.max() < 1 and applied["identity"]
    assert applied[expected], served


def test_roberta_family_texts_stop_at_the_positions_the_padding_offset_leaves(tmp_path):
    """RoBERTa's position ids start at padding_idx + 1: with a tokenizer that names no model_max_length, a text of
    max_position_embeddings tokens ran past the position table (IndexError, a 500 for its whole batch)."""
    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    torch.manual_seed(0)
    model_dir = tmp_path / "roberta"
    config = RobertaConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=34, pad_token_id=0,
    )  # fmt: skip
    RobertaModel(config).save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(minilm_dir(), model_max_length=int(1e30)).save_pretrained(model_dir)
    engine = EmbeddingEngine(str(model_dir), num_threads=1)
    assert engine.max_length == 33  # 34 positions, padding_idx 0: ids 1..33
    vectors = engine.run(["word " * 100, "short"])[interface.EMBEDDING]
    assert vectors.shape == (2, 32) and np.isfinite(vectors).all()


def test_an_encoder_without_a_pad_token_serves_batches(tmp_path):
    """A GPT-2-style encoder (no pad token): transformers' __call__ refuses to pad; padding with any id under the mask
    answers each text as it is alone."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2Model

    from hf2triton.serving.tasks.embedding import EmbeddingEngine

    torch.manual_seed(0)
    model_dir = tmp_path / "gpt2"
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    tokenizer.pad_token = None
    GPT2Model(GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=2, n_positions=128)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (model_dir / "1_Pooling").mkdir()
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))
    engine = EmbeddingEngine(str(model_dir), num_threads=1)
    assert engine.tokenizer.pad_token_id is None
    together = engine.run(TEXTS)[interface.EMBEDDING]
    alone = np.concatenate([engine.run([text])[interface.EMBEDDING] for text in TEXTS])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_a_reranker_tagged_text_classification_is_served_as_text_ranking(tmp_path):
    """bge-rerankers' cards say text-classification; one label and sentence-transformers' CrossEncoder marks make it a
    reranker (a classifier's softmax/sigmoid of one logit would answer every text alike)."""
    from hf2triton.task_inference import directory_evidence, infer_task

    model_dir = tiny_reranker(tmp_path / "reranker")
    (model_dir / "README.md").write_text("---\npipeline_tag: text-classification\n---\n# reranker\n")
    (model_dir / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "CrossEncoder"}))
    task, where = infer_task(directory_evidence(model_dir))
    assert task == interface.TEXT_RANKING and "CrossEncoder marks" in where
    (model_dir / "config_sentence_transformers.json").unlink()  # no marks: the card decides
    assert infer_task(directory_evidence(model_dir))[0] == interface.CLASSIFICATION


class _Error:
    INTERNAL, INVALID_ARG = "INTERNAL", "INVALID_ARG"

    def __init__(self, message: str, code: str = "") -> None:
        self.message, self.code = message, code


def test_one_requests_failed_pass_fails_that_request_alone(monkeypatch):
    """Requests that share options run as one pass; where it fails, each runs alone: the others are answered, the
    bad one gets its own error -- INVALID_ARG where the engine named the input's mistake, INTERNAL otherwise."""
    from hf2triton.serving import inputs, model

    stand_in = types.SimpleNamespace(
        Tensor=lambda name, values: (name, values),
        InferenceResponse=lambda output_tensors, error=None: types.SimpleNamespace(output_tensors=output_tensors, error=error),
        TritonError=_Error,
    )
    monkeypatch.setattr(model, "pb_utils", stand_in)

    class Engine:
        outputs = (interface.SCORE,)

        def run(self, texts, **_):
            if "mistake" in texts:
                raise inputs.RequestError("text 'mistake' is refused")
            if "crash" in texts:
                raise IndexError("index out of range in self")
            return {interface.SCORE: np.array([float(len(t)) for t in texts], dtype=np.float32)}

    served = model.TritonPythonModel.__new__(model.TritonPythonModel)
    served.engine, served._log = Engine(), lambda message: None
    members = [(0, ["ok", "fine"]), (1, ["mistake"]), (2, ["crash"]), (3, ["last"])]
    answers = dict(served._run_group(members, {}))
    assert answers[0].error is None and answers[0].output_tensors[0][1].reshape(-1).tolist() == [2.0, 4.0]
    assert answers[3].error is None and answers[3].output_tensors[0][1].reshape(-1).tolist() == [4.0]
    assert answers[1].error.code == "INVALID_ARG" and "mistake" in answers[1].error.message
    assert answers[2].error.code == "INTERNAL" and answers[2].error.message.startswith(interface.INTERNAL_ERROR)
    assert "IndexError" in answers[2].error.message
