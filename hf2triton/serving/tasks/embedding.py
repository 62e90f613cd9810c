"""feature-extraction: the sentence embedding of each text."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from .. import interface
from .base import Engine


class EmbeddingEngine(Engine):
    """feature-extraction: pooled (mean / cls / max, from the sentence-transformers config), L2-normalised FP32."""

    outputs = (interface.EMBEDDING, interface.PROMPT_TOKENS)
    auto_class = interface.AUTO_CLASSES[interface.FEATURE_EXTRACTION]
    onnx_output = "last_hidden_state"

    def setup(self, model_dir: str) -> None:
        pooling_file = os.path.join(model_dir, "1_Pooling", "config.json")
        self.pooling = "mean"
        if os.path.isfile(pooling_file):
            with open(pooling_file) as handle:
                pooling = json.load(handle)
            for mode in ("cls_token", "max_tokens", "mean_tokens"):
                if pooling.get(f"pooling_mode_{mode}"):
                    self.pooling = mode.split("_")[0]
                    break

    def run(self, texts: list[str], **_: Any) -> dict[str, np.ndarray]:
        return self.run_buckets(texts, self.forward)

    def head(self, hidden, batch: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "max":
            pooled = hidden.masked_fill(mask == 0, -1e4).max(dim=1).values
        else:
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return {
            interface.EMBEDDING: torch.nn.functional.normalize(pooled.float(), p=2, dim=1),
            interface.PROMPT_TOKENS: batch["attention_mask"].sum(dim=1).to(torch.int32),
        }

    def forward(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        out = self.tensors(batch)
        return {
            interface.EMBEDDING: out[interface.EMBEDDING].cpu().numpy().astype(np.float32),
            interface.PROMPT_TOKENS: out[interface.PROMPT_TOKENS].cpu().numpy().astype(np.int32),
        }
