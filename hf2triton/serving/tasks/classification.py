"""text-classification: each text's top label and its probability."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import interface
from .base import Engine


def score_function(config: Any) -> str:
    """What the text-classification pipeline applies to the logits (its `function_to_apply` default): none for a
    regression head, sigmoid for multi-label or one-label heads (softmax of one logit would always be 1.0), else softmax."""
    problem_type = getattr(config, "problem_type", None)
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification" or getattr(config, "num_labels", 2) == 1:
        return "sigmoid"
    return "softmax"


class ClassificationEngine(Engine):
    """text-classification: top label (from the model config's id2label) and its probability."""

    outputs = (interface.LABEL, interface.SCORE)
    auto_class = interface.AUTO_CLASSES[interface.CLASSIFICATION]
    onnx_output = "logits"

    def run(self, texts: list[str], **_: Any) -> dict[str, np.ndarray]:
        scored = self.run_buckets(texts, self.forward)
        id2label = self.model.config.id2label
        labels = [str(id2label.get(int(i), int(i))).encode("utf-8") for i in scored["label_id"].tolist()]
        return {interface.LABEL: np.array(labels, dtype=np.object_), interface.SCORE: scored[interface.SCORE]}

    def head(self, logits, batch: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        logits = logits.float()
        function = score_function(self.model.config)
        if function == "sigmoid":
            probs = torch.sigmoid(logits)
        elif function == "softmax":
            probs = torch.softmax(logits, dim=-1)
        else:
            probs = logits
        scores, ids = probs.max(dim=-1)
        return {"label_id": ids, interface.SCORE: scores}

    def forward(self, batch: dict[str, Any]) -> dict[str, np.ndarray]:
        out = self.tensors(batch)
        return {"label_id": out["label_id"].cpu().numpy(), interface.SCORE: out[interface.SCORE].cpu().numpy().astype(np.float32)}
