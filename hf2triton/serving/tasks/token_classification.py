"""token-classification (NER taggers): each text's entities, exactly as `transformers.pipeline("token-classification")`
returns them -- `entity_group` (or `entity` and `index` for aggregation "none"), `score`, `word`, `start`, `end`
(character offsets into the text) -- as one JSON string per text.

The network runs batched (length buckets, CUDA graphs, every backend's runtime, as the other encoder tasks); the
per-token logits then go through transformers' own post-processing (`TokenClassificationPipeline.postprocess`:
softmax, gather_pre_entities, aggregate, group_entities, the "O" label dropped), so the answer equals the
pipeline's by construction. Texts longer than the model's context are truncated, as the pipeline does without a
`stride`.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np

from .. import interface
from .base import Engine


def plain(value: Any) -> Any:
    """numpy scalars (the pipeline's scores and offsets) as Python numbers, for JSON."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def entities_json(entities: list[dict[str, Any]]) -> str:
    """One text's entities as JSON, keys in the pipeline's order (the served answer and the reference alike)."""
    return json.dumps(entities, ensure_ascii=False, default=plain)


def postprocessor(tokenizer, config, base: type | None = None):
    """transformers' `TokenClassificationPipeline` (or `base`, e.g. FillMaskPipeline) with no model of its own: only its
    post-processing is used, which reads the tokenizer and `model.config` (its __init__ would load and place a model)."""
    from transformers import TokenClassificationPipeline

    class Postprocessor(base or TokenClassificationPipeline):
        def __init__(self) -> None:  # noqa: D107 - deliberately not the pipeline's
            self.tokenizer = tokenizer
            self.model = SimpleNamespace(config=config)
            self.framework = "pt"

    return Postprocessor()


class TokenClassificationEngine(Engine):
    """token-classification: per-token logits, then the pipeline's aggregation (request option, default simple)."""

    outputs = (interface.ENTITIES,)
    auto_class = interface.AUTO_CLASSES[interface.TOKEN_CLASSIFICATION]
    onnx_output = "logits"

    def __init__(self, model_dir: str, **kwargs: Any):
        super().__init__(model_dir, **kwargs)
        if self.fast_tokenizer is None:
            raise ValueError(
                f"token-classification needs a fast (Rust) tokenizer with a pad token, padding on the right: {model_dir} has "
                f"{type(self.tokenizer).__name__} (character offsets of the entities come from the fast tokenizer)"
            )
        self.pipeline = postprocessor(self.tokenizer, self.model.config)

    def tokenize(self, texts: list[str]) -> list:
        """Rust `Encoding`s with character offsets and the special-tokens mask (the entities' start / end)."""
        return self.fast_tokenizer.encode_batch(texts)

    def run(self, texts: list[str], aggregation_strategy: str = interface.DEFAULT_AGGREGATION_STRATEGY, **_: Any) -> dict[str, np.ndarray]:
        from transformers.pipelines.token_classification import AggregationStrategy

        strategy = AggregationStrategy(aggregation_strategy)
        encodings = self.tokenize(texts)
        logits: list[Any] = [None] * len(texts)
        for positions, batch in self.batches(texts, encodings):
            scores = self.tensors(batch)["logits"].cpu()
            for row, index in enumerate(positions):
                logits[index] = scores[row, : len(encodings[index].ids)]
        answers = [
            entities_json(self.entities(text, encoding, scores, strategy)) for text, encoding, scores in zip(texts, encodings, logits)
        ]
        return {interface.ENTITIES: np.array([answer.encode("utf-8") for answer in answers], dtype=np.object_)}

    def entities(self, text: str, encoding, logits, strategy) -> list[dict[str, Any]]:
        """The pipeline's postprocess over one text's logits, with the inputs its preprocess would have made."""
        torch = self.torch
        outputs = {
            "logits": logits[None],
            "input_ids": torch.tensor([encoding.ids]),
            "offset_mapping": torch.tensor([encoding.offsets]),
            "special_tokens_mask": torch.tensor([encoding.special_tokens_mask]),
            "sentence": text,
            "is_last": True,
        }
        return self.pipeline.postprocess([outputs], aggregation_strategy=strategy)

    def head(self, logits, batch: dict[str, Any]) -> dict[str, Any]:
        return {"logits": logits.float()}
