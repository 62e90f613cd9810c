"""feature-extraction: the sentence embedding of each text, as sentence-transformers' own modules make it (pooling.py:
which modes, Normalize only where the model lists it, its prompts), for encoders and decoder-based embedders alike.

A request may name one of the model's prompts (`prompt_name`; none: the model's default_prompt_name, else no
prompt): its text is prepended to every text, and with include_prompt false its tokens are left out of the pooling.
Batches are padded on the right whatever the tokenizer's padding side: masked, with positions from 0, each text
answers as it would alone (decoder embedders such as Qwen3-Embedding pad left in sentence-transformers; their rotary
positions give the same states either way).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import interface, pooling
from .base import Engine


class EmbeddingEngine(Engine):
    """feature-extraction: pooled as the model's Pooling config says (cls, max, mean, mean_sqrt_len_tokens,
    weightedmean, lasttoken), L2-normalised where it lists Normalize; FP32."""

    outputs = (interface.EMBEDDING, interface.PROMPT_TOKENS)
    auto_class = interface.AUTO_CLASSES[interface.FEATURE_EXTRACTION]
    onnx_output = "last_hidden_state"
    any_padding_side = True

    def setup(self, model_dir: str) -> None:
        self.embedding = pooling.read(model_dir)
        self.prompt_names = tuple(self.embedding.prompts)
        self._prompt_lengths: dict[str, int] = {}

    def graphs_allowed(self) -> bool:
        """torch CUDA graphs give the model a square mask (rows x length x length), which decoders' causal masking
        does not take: a decoder embedder runs eagerly (ONNX Runtime's graphs take the plain mask)."""
        return self.backend != "python" or not is_decoder(self.model.config)

    def run(self, texts: list[str], prompt_name: str | None = None, **_: Any) -> dict[str, np.ndarray]:
        prompt = self.embedding.prompt(prompt_name)
        prepared = [self.embedding.prepare(prompt + text) for text in texts]
        skip = self.prompt_length(prompt) if prompt and not self.embedding.include_prompt else 0
        return self.run_buckets(prepared, lambda batch: self.forward(batch, skip))

    def prompt_length(self, prompt: str) -> int:
        """The prompt's tokens in a text it starts, as sentence-transformers counts them: the prompt tokenised alone,
        without its last token when that is a special one (a [SEP] / EOS the tokenizer appends)."""
        if prompt not in self._prompt_lengths:
            ids = self.tokenizer(self.embedding.prepare(prompt), truncation=True, max_length=self.max_length)["input_ids"]
            self._prompt_lengths[prompt] = len(ids) - (1 if ids and ids[-1] in self.tokenizer.all_special_ids else 0)
        return self._prompt_lengths[prompt]

    def head(self, hidden, batch: dict[str, Any], skip: int = 0) -> dict[str, Any]:
        torch = self.torch
        mask = batch["attention_mask"]
        pooled = pooling.pool(torch, hidden, mask, self.embedding.modes, skip)
        if self.embedding.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return {interface.EMBEDDING: pooled, interface.PROMPT_TOKENS: mask.sum(dim=1).to(torch.int32)}

    def forward(self, batch: dict[str, Any], skip: int = 0) -> dict[str, np.ndarray]:
        if skip:  # the prompt left out of the pooling: eager (a graph's head has no place for it)
            with self.torch.inference_mode():
                out = self.head(getattr(self.model_outputs(batch, False), self.onnx_output), batch, skip)
        else:
            out = self.tensors(batch)
        return {
            interface.EMBEDDING: out[interface.EMBEDDING].cpu().numpy().astype(np.float32),
            interface.PROMPT_TOKENS: out[interface.PROMPT_TOKENS].cpu().numpy().astype(np.int32),
        }


def is_decoder(config: Any) -> bool:
    """A causal (decoder-only) network: a model type transformers knows as a causal LM and not as a masked one (BERT
    and RoBERTa are both), or a config that says so."""
    from transformers.models.auto import modeling_auto

    kind = getattr(config, "model_type", "")
    causal, masked = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return bool(getattr(config, "is_decoder", False)) or (kind in causal and kind not in masked)
