"""Fixtures: tiny real models built locally, and the three of them served by a real run of the workflow.
Plain helpers live in tests/helpers.py."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

# Servers and clients started by the tests (snakemake runs inherit the environment) share one client key of
# their own, never the user's (hf2triton.triton.client.key_file).
os.environ.setdefault("HF2TRITON_KEY_FILE", str(Path(tempfile.mkdtemp(prefix="hf2triton-key-")) / "triton.key"))
# Validation's remembered in-process answers (hf2triton.pipeline.references): shared by this run's workers, fresh
# per run, never the user's ~/.cache.
os.environ.setdefault("HF2TRITON_CACHE", tempfile.mkdtemp(prefix="hf2triton-cache-"))
from hf2triton.triton import client  # noqa: E402 - after the key file is chosen
from tests.helpers import make_workflow, minilm_dir, tiny_llama, tiny_model_entries

client.create_key()  # as `make serve` does first: clients (and unit tests acting as one) only read it


def _tiny_bert_config(**extra):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        **extra,
    )


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Three tiny random-weight models (one per task) with real tokenizers, saved like a hub repo."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("tiny-models")
    bert_tokenizer = AutoTokenizer.from_pretrained(minilm_dir())

    embed = root / "tiny-embed"
    BertModel(_tiny_bert_config()).save_pretrained(embed)
    bert_tokenizer.save_pretrained(embed)
    (embed / "1_Pooling").mkdir()
    (embed / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))

    classify = root / "tiny-classify"
    BertForSequenceClassification(
        _tiny_bert_config(num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    ).save_pretrained(classify)
    bert_tokenizer.save_pretrained(classify)

    generate = tiny_llama(root / "tiny-generate", 256)
    return {"feature-extraction": embed, "text-classification": classify, "text-generation": generate}


@pytest.fixture(scope="session")
def tiny_workflow(tmp_path_factory, tiny_models):
    """The three tiny models served by a real run of the workflow, shared by the modules that only send
    requests (a module that changes config or kills processes builds its own: see test_workflow)."""
    workflow = make_workflow(tmp_path_factory.mktemp("tiny-workflow"), tiny_model_entries(tiny_models))
    workflow.first_run = workflow.run("serve")
    yield workflow
    workflow.stop()
