"""The serving code (rendered as model.py) tested in-process against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf2triton.serving.model import (
    ClassificationEngine,
    EmbeddingEngine,
    GenerationEngine,
    RequestError,
    decode_texts,
    generation_options,
)

TEXTS = ["short", "a considerably longer sentence with many more tokens in it than the first", "naïve café — 東京"]


def test_decode_texts_accepts_utf8_and_refuses_bad_input():
    assert decode_texts(np.array([[b"caf\xc3\xa9"]], dtype=object), 100) == ["café"]
    for bad, message in [(b"\xff\xfe", "UTF-8"), (b"   ", "empty"), (b"x" * 101, "max_input_bytes"), (5, "BYTES")]:
        with pytest.raises(RequestError, match=message):
            decode_texts(np.array([[bad]], dtype=object), 100)


def test_generation_options_checked():
    defaults = {"max_new_tokens": 16, "temperature": 0.0}
    assert generation_options({}, defaults) == defaults
    assert generation_options({"max_new_tokens": np.array([[4]]), "temperature": np.array([[0.5]])}, defaults) == {
        "max_new_tokens": 4,
        "temperature": 0.5,
    }
    for raw, message in [
        ({"max_new_tokens": np.array([[-1]])}, "between 1"),
        ({"max_new_tokens": np.array([[1], [2]])}, "one value"),
        ({"temperature": np.array([[math.nan]])}, "finite"),
        ({"temperature": np.array([[-0.1]])}, "between 0"),
    ]:
        with pytest.raises(RequestError, match=message):
            generation_options(raw, defaults)


def test_embeddings_match_independent_mean_pooling_and_ignore_padding(tiny_models):
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = tiny_models["feature-extraction"]
    engine = EmbeddingEngine(str(path), num_threads=1)
    batched = engine.run(TEXTS)["embedding"]
    assert batched.shape == (3, 32) and batched.dtype == np.float32
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    for text, row in zip(TEXTS, batched):
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        expected = torch.nn.functional.normalize(hidden.mean(0), dim=0).numpy()
        assert float(np.dot(expected, row)) > 0.99999, text
        assert np.allclose(engine.run([text])["embedding"][0], row, atol=1e-5), "padding must not change a text's embedding"


def test_classification_labels_from_config(tiny_models):
    engine = ClassificationEngine(str(tiny_models["text-classification"]), num_threads=1)
    out = engine.run(TEXTS)
    assert {label.decode() for label in out["label"]} <= {"negative", "positive"}
    assert out["score"].shape == (3,) and np.all((out["score"] >= 0.5) & (out["score"] <= 1.0))


def test_generation_greedy_and_context_limit(tiny_models):
    engine = GenerationEngine(str(tiny_models["text-generation"]), num_threads=1)
    first = engine.run(["Hello there"], max_new_tokens=5)["text_output"]
    assert first.shape == (1,) and isinstance(first[0], bytes)
    assert engine.run(["Hello there"], max_new_tokens=5)["text_output"][0] == first[0], "greedy is deterministic"
    assert "<|im_start|>" in engine.prompt("hi"), "chat template applied"
    with pytest.raises(RequestError, match="exceeds the context"):
        engine.check_lengths(["word " * 400], 8)
