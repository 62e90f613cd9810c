"""token-classification (NER taggers): each text's entities, exactly as `transformers.pipeline("token-classification")`
returns them -- `entity_group` (or `entity` and `index` for aggregation "none"), `score`, `word`, `start`, `end`
(character offsets into the text) -- as one JSON string per text.

The network runs batched (length buckets, CUDA graphs, every backend's runtime, as the other encoder tasks); the
per-token logits then go through transformers' own post-processing (`TokenClassificationPipeline.postprocess`:
softmax, gather_pre_entities, aggregate, group_entities, the "O" label dropped), so the answer equals the
pipeline's by construction. Texts longer than the model's context are truncated, as the pipeline does without a
`stride`; with one (the model's `token_classification.stride`, or the request's), each text is cut into overlapping
windows as the pipeline's preprocess does (the fast tokenizer's overflowing encodings), the windows of all texts run
in the same batches, and each text's windows go through postprocess together, which merges the overlaps
(`aggregate_overlapping_entities`).
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any

import numpy as np

from .. import interface
from ..inputs import RequestError
from .base import Engine

NO_STRIDE = interface.NO_STRIDE


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
        self.windowing: dict[int, Any] = {}  # stride -> a tokenizer copy that also returns the overflowing windows
        stride = int(self.options.get("stride", NO_STRIDE))
        if stride != NO_STRIDE and (problem := self.stride_problem(stride)):
            raise ValueError(f"token_classification.stride: {problem}")
        self.default_stride = stride

    @property
    def window(self) -> int:
        """Text tokens per window: the context less the special tokens each window gets ([CLS], [SEP])."""
        return self.max_length - self.tokenizer.num_special_tokens_to_add(pair=False)

    def stride_problem(self, stride: int, strategy: str = interface.DEFAULT_AGGREGATION_STRATEGY) -> str | None:
        """Why `stride` cannot window this model's texts (None when it can), in the pipeline's terms."""
        if stride < 0:
            return f"stride={stride} is negative: use 0 to {self.window - 1} tokens of overlap ({NO_STRIDE}: no windows, truncate)"
        if stride >= self.window:
            return (
                f"stride={stride} must be less than the window of {self.window} tokens (context {self.max_length} less "
                f"{self.max_length - self.window} special tokens): use 0 to {self.window - 1}"
            )
        if strategy == "none":
            return f"stride={stride} needs an aggregation_strategy other than none (as the pipeline): simple, first, average or max"
        return None

    def check_options(self, aggregation_strategy: str, stride: int) -> None:
        """Raise RequestError when a request's stride cannot window this model's texts (model.py: per request)."""
        if stride != NO_STRIDE and (problem := self.stride_problem(stride, aggregation_strategy)):
            raise RequestError(problem)

    def tokenize(self, texts: list[str], stride: int = NO_STRIDE) -> list:
        """Rust `Encoding`s with character offsets and the special-tokens mask (the entities' start / end); with a
        stride, each text's windows (its encoding then its overflowing ones, as transformers' fast tokenizer makes them
        for the pipeline's `return_overflowing_tokens`)."""
        if stride == NO_STRIDE:
            return self.fast_tokenizer.encode_batch(texts)
        if stride not in self.windowing:
            windowing = copy.deepcopy(self.fast_tokenizer)
            windowing.enable_truncation(self.max_length, stride=stride, direction=self.tokenizer.truncation_side)
            self.windowing[stride] = windowing
        return self.windowing[stride].encode_batch(texts)

    def run(
        self, texts: list[str], aggregation_strategy: str = interface.DEFAULT_AGGREGATION_STRATEGY, stride: int | None = None, **_: Any
    ) -> dict[str, np.ndarray]:
        from transformers.pipelines.token_classification import AggregationStrategy

        stride = self.default_stride if stride is None else stride
        self.check_options(aggregation_strategy, stride)
        strategy = AggregationStrategy(aggregation_strategy)
        encodings = self.tokenize(texts, stride)
        # every window of every text, in text order: one list the length buckets batch together
        windows = [[encoding, *(encoding.overflowing if stride != NO_STRIDE else ())] for encoding in encodings]
        flat = [window for text_windows in windows for window in text_windows]
        logits: list[Any] = [None] * len(flat)
        for positions, batch in self.batches(flat, flat):
            scores = self.tensors(batch)["logits"].cpu()
            for row, index in enumerate(positions):
                logits[index] = scores[row, : len(flat[index].ids)]
        answers, first = [], 0
        for text, text_windows in zip(texts, windows):
            window_logits = logits[first : first + len(text_windows)]
            first += len(text_windows)
            answers.append(entities_json(self.entities(text, text_windows, window_logits, strategy)))
        return {interface.ENTITIES: np.array([answer.encode("utf-8") for answer in answers], dtype=np.object_)}

    def entities(self, text: str, windows: list, logits: list, strategy) -> list[dict[str, Any]]:
        """The pipeline's postprocess over one text's windows (one without a stride), with the inputs its preprocess
        would have made; several windows' entities are merged there (aggregate_overlapping_entities)."""
        torch = self.torch
        outputs = [
            {
                "logits": scores[None],
                "input_ids": torch.tensor([window.ids]),
                "offset_mapping": torch.tensor([window.offsets]),
                "special_tokens_mask": torch.tensor([window.special_tokens_mask]),
                "sentence": text if index == 0 else None,
                "is_last": index == len(windows) - 1,
            }
            for index, (window, scores) in enumerate(zip(windows, logits))
        ]
        return self.pipeline.postprocess(outputs, aggregation_strategy=strategy)

    def head(self, logits, batch: dict[str, Any]) -> dict[str, Any]:
        return {"logits": logits.float()}
