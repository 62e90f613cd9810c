"""The pretrained step refuses a checkpoint whose head does not fit the task, before anything is saved or served:
a reranker (text-ranking) with several labels, and a checkpoint without the task's head at all (transformers would
add a random one, with only a log warning). Real tiny checkpoints through the real step."""

from __future__ import annotations

import json

import pytest

from hf2triton.errors import UserError
from hf2triton.pipeline.pretrained import pretrained_step
from tests.helpers import minilm_dir, tiny_masked_lm, tiny_reranker, tiny_tagger


def run_pretrained(tmp_path, source, task: str) -> dict:
    record = tmp_path / "fetch.json"
    record.write_text(json.dumps({"path": str(source), "source": str(source)}))
    return pretrained_step(str(record), task, str(tmp_path / "pretrained"), name="m")


def two_label_classifier(directory):
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                        id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1})  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(directory)
    return directory


def test_a_reranker_with_two_labels_is_refused_as_a_classifier(tmp_path):
    with pytest.raises(UserError) as refused:
        run_pretrained(tmp_path, two_label_classifier(tmp_path / "sst2"), "text-ranking")
    message = refused.value.render()
    assert "model m: task text-ranking" in message and "has 2 labels (NEGATIVE, POSITIVE)" in message
    assert "a model with 2 labels is a text-classification model: write task: text-classification" in message
    assert not (tmp_path / "pretrained").exists()


@pytest.mark.parametrize(
    ("task", "head"),
    [
        ("token-classification", "token-classification head"),
        ("fill-mask", "masked-language-model head"),
        ("text-classification", "sequence-classification head"),
        ("text-ranking", "one-label head"),
    ],
)
def test_a_base_checkpoint_without_the_tasks_head_is_refused(tmp_path, task, head):
    # MiniLM (sentence-transformers): a BertModel, no head of any kind
    with pytest.raises(UserError) as refused:
        run_pretrained(tmp_path, minilm_dir(), task)
    message = refused.value.render()
    assert f"model m: task {task} needs" in message and head in message and "transformers would add random ones" in message
    assert "(BertModel)" in message and f"use a checkpoint fine-tuned for {task}" in message
    assert not (tmp_path / "pretrained").exists()


def test_a_tagger_is_not_a_masked_lm(tmp_path):
    with pytest.raises(UserError, match=r"task fill-mask needs a masked-language-model head.*BertForTokenClassification.*cls\.predictions"):
        run_pretrained(tmp_path, tiny_tagger(tmp_path / "tagger"), "fill-mask")


@pytest.mark.parametrize(
    ("builder", "task"), [(tiny_tagger, "token-classification"), (tiny_masked_lm, "fill-mask"), (tiny_reranker, "text-ranking")]
)
def test_a_checkpoint_with_its_head_is_saved(tmp_path, builder, task):
    manifest = run_pretrained(tmp_path, builder(tmp_path / "source"), task)
    assert manifest["task"] == task and (tmp_path / "pretrained" / "model.safetensors").is_file()
