"""text-ranking (cross-encoder rerankers, a `*ForSequenceClassification` with one label): per document its relevance
to the request's query, the (query, document) pair's logit through the activation its config names (sigmoid where it
names none) -- what sentence-transformers' CrossEncoder answers for a one-label model -- and the tokens the pair became
(usage counts).

The pairs are tokenised as the tokenizer's own pair encoding (`[CLS] query [SEP] document [SEP]`, token types 0 / 1;
longest-first truncation to the model's context), then run batched across documents (length buckets, CUDA graphs, as
the other encoder tasks); only one float per document leaves the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import interface
from .base import Engine


def score_activation(config: Any) -> Any:
    """The function sentence-transformers' CrossEncoder applies to the relevance logit: the one its config.json names
    (`sentence_transformers.activation_fn`, before v4 `sbert_ce_default_activation_function`) where that is a torch
    class, else sigmoid (one label). The ms-marco rerankers name Identity: their scores are the raw logits."""
    import importlib

    import torch

    named = getattr(config, "sentence_transformers", None)
    path = named.get("activation_fn") if isinstance(named, dict) else None
    path = path or getattr(config, interface.CROSS_ENCODER_KEY, None)
    if isinstance(path, str) and path.startswith("torch."):  # CrossEncoder imports only torch's classes without remote code
        module, _, name = path.rpartition(".")
        try:
            activation = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            raise ValueError(f"config.json's activation {path!r} is not a torch class here") from None
        if not (isinstance(activation, type) and issubclass(activation, torch.nn.Module)):
            raise ValueError(f"config.json's activation {path!r} is not a torch.nn module")
        return activation().eval()
    return torch.sigmoid


class TextRankingEngine(Engine):
    """text-ranking: the one relevance logit per (query, document) pair, through the model's activation."""

    outputs = (interface.SCORE, interface.PROMPT_TOKENS)
    auto_class = interface.AUTO_CLASSES[interface.TEXT_RANKING]
    onnx_output = "logits"

    def setup(self, model_dir: str) -> None:
        """A cross-encoder: one label (several labels are a text-classification model) and a fast tokenizer."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        self.activation = score_activation(config)
        labels = config.num_labels
        if labels != 1:
            raise ValueError(f"text-ranking needs a cross-encoder with one label (its relevance logit): {model_dir} has {labels}")
        if not self.tokenizer.is_fast or self.tokenizer.pad_token_id is None:
            tokenizer = type(self.tokenizer).__name__
            raise ValueError(f"text-ranking needs a fast (Rust) tokenizer with a pad token: {model_dir} has {tokenizer}")

    def run(self, texts: list[str], query: str = "", **_: Any) -> dict[str, np.ndarray]:
        """Each text (document) scored against `query`, in request order."""
        encodings = self.tokenize_pairs(query, texts)
        scores = np.empty(len(texts), dtype=np.float32)
        for positions, batch in self.batches(texts, encodings):
            scores[positions] = self.tensors(batch)[interface.SCORE].cpu().numpy()
        tokens = np.array([len(encoding.ids) for encoding in encodings], dtype=np.int32)
        return {interface.SCORE: scores, interface.PROMPT_TOKENS: tokens}

    def tokenize_pairs(self, query: str, texts: list[str]) -> list:
        """Rust `Encoding`s of the (query, text) pairs (truncated longest-first to the context, as __call__)."""
        fast = self.fast_tokenizer
        return getattr(fast, "encode_batch_fast", fast.encode_batch)([(query, text) for text in texts])

    def head(self, logits, batch: dict[str, Any]) -> dict[str, Any]:
        return {interface.SCORE: self.activation(logits.float()[:, 0])}
