"""fill-mask (masked language models): per text the top_k candidates for its one mask token, exactly as
`transformers.pipeline("fill-mask")` returns them -- `score`, `token`, `token_str`, `sequence` (the text with the mask
filled) -- as one JSON string per text.

The network runs batched (length buckets, CUDA graphs, as the other encoder tasks); only the mask position's logits
leave the device. They then go through transformers' own post-processing (`FillMaskPipeline.postprocess`: softmax,
top-k, the filled sequence decoded without special tokens), so the answer equals the pipeline's by construction.
Any mask token the tokenizer defines (`[MASK]`, `<mask>`, ...). A text must hold exactly one: the pipeline's
several-mask answer (experimental; each mask scored on its own, not jointly, a list per mask) is refused per request.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import interface
from ..inputs import RequestError
from .base import Engine
from .token_classification import entities_json as answer_json
from .token_classification import postprocessor


class FillMaskEngine(Engine):
    """fill-mask: the logits at the mask token, then the pipeline's top_k candidates (request option, default 5)."""

    outputs = (interface.CANDIDATES,)
    auto_class = interface.AUTO_CLASSES[interface.FILL_MASK]
    onnx_output = "logits"

    def __init__(self, model_dir: str, **kwargs: Any):
        super().__init__(model_dir, **kwargs)
        # The LM head is position-wise, and its vocabulary-wide projection is most of a masked LM's work (MiniLM: 384 x
        # 30,522 per token, 4x its whole encoder): the encoder's output is cut to each text's mask position before the
        # head, so it scores one position per text instead of every one (the pipeline scores them all). Torch only: an
        # ONNX export (or a TensorRT engine) is a fixed graph that returns every position's logits (`head` gathers).
        self.cut_in_model = self.backend == "python"
        if self.cut_in_model:
            self.model.base_model.register_forward_hook(self.keep_mask_positions, with_kwargs=True)

    def keep_mask_positions(self, module, args: tuple, kwargs: dict[str, Any], output):
        """The base model's last_hidden_state at each row's first mask token only ([rows, 1, hidden]; padding rows of
        a CUDA graph: position 0). `input_ids` comes positionally (BERT) or by name (DistilBERT)."""
        ids = kwargs["input_ids"] if kwargs.get("input_ids") is not None else args[0]
        output["last_hidden_state"] = self.at_mask(output[0], ids)[:, None, :]
        return output

    def at_mask(self, values, ids):
        """Each row of `values` ([rows, length, ...]) at its first mask token in `ids` (none: position 0)."""
        position = (ids == self.mask_id).int().argmax(dim=1)
        return values[self.torch.arange(ids.shape[0], device=ids.device), position]

    def setup(self, model_dir: str) -> None:
        """The tokenizer's mask token, and the pipeline's post-processing (it reads no model config)."""
        from transformers import FillMaskPipeline

        self.mask_id = self.tokenizer.mask_token_id
        tokenizer = type(self.tokenizer).__name__
        if self.mask_id is None or not self.tokenizer.is_fast or self.tokenizer.pad_token_id is None:
            raise ValueError(f"fill-mask needs a fast (Rust) tokenizer with a mask token and a pad token: {model_dir} has {tokenizer}")
        self.pipeline = postprocessor(self.tokenizer, None, FillMaskPipeline)

    def mask_problem(self, ids: list[int]) -> str | None:
        """Why a text's token ids are no fill-mask input (None: exactly one mask token)."""
        count = ids.count(self.mask_id)
        mask = self.tokenizer.mask_token
        if count == 0:
            cut = ""
            if len(ids) >= self.max_length:
                cut = f" within its first {self.max_length} tokens (the model's context; the rest is cut off)"
            return f"text holds no mask token{cut}: put {mask} (this model's mask token) where the word to fill goes"
        if count > 1:
            return (
                f"text holds {count} mask tokens {mask}: send exactly one per text (transformers' fill-mask pipeline scores "
                "several masks each on its own, not jointly -- experimental -- which is not served: one text per mask)"
            )
        return None

    def check_masks(self, texts: list[str]) -> list:
        """The texts' encodings; RequestError unless every text holds exactly one mask token and fits the context
        (model.py: per request)."""
        encodings = self.tokenize(texts)
        for encoding in encodings:
            problem = self.mask_problem(encoding.ids)
            if problem is None and encoding.overflowing:  # the answer's `sequence` would be the cut text
                problem = (
                    f"text is longer than this model's context of {self.max_length} tokens: shorten it around the mask "
                    "(transformers' fill-mask pipeline refuses it too)"
                )
            if problem:
                raise RequestError(problem)
        return encodings

    def run(self, texts: list[str], top_k: int = interface.DEFAULT_FILL_MASK_TOP_K, **_: Any) -> dict[str, np.ndarray]:
        encodings = self.check_masks(texts)
        rows: list[Any] = [None] * len(texts)
        for positions, batch in self.batches(texts, encodings):
            logits = self.tensors(batch)["logits"].cpu()
            for row, index in enumerate(positions):
                rows[index] = logits[row]
        answers = [answer_json(self.candidates(encoding.ids, row, top_k)) for encoding, row in zip(encodings, rows)]
        return {interface.CANDIDATES: np.array([answer.encode("utf-8") for answer in answers], dtype=np.object_)}

    def candidates(self, ids: list[int], logits, top_k: int) -> list[dict[str, Any]]:
        """The pipeline's postprocess over one text: its ids, and the mask's logits standing at every position (a
        view, no copy: postprocess reads only the mask's row)."""
        outputs = {"input_ids": self.torch.tensor([ids]), "logits": logits[None, None, :].expand(1, len(ids), -1)}
        return self.pipeline.postprocess(outputs, top_k=top_k)

    def head(self, logits, batch: dict[str, Any]) -> dict[str, Any]:
        """The mask position's logits per row: torch's are the only position the LM head scored (keep_mask_positions),
        an export's every position's, gathered here."""
        row = logits[:, 0] if self.cut_in_model else self.at_mask(logits, batch["input_ids"])
        return {"logits": row.float()}
