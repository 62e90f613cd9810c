"""Continuous batching for an encoder-decoder model (T5, BART, Marian): the encoder runs once per request, when it
joins, and the decoding steps of every running request are one batch.

The running batch is the causal batcher's (continuous.py: a left-padded self-attention cache, rows joining and
leaving at any step, the same sampling, stop strings and responses) plus, per row, what the decoder attends to
across: the encoder's states and mask (right-padded to the longest input in the batch) and the cross-attention
keys/values the first decoding step computed from them (the model's own EncoderDecoderCache then skips them).

Rows decode at different positions. T5's relative position bias only sees column differences, which left
padding keeps; a decoder with absolute position embeddings (BART, Marian, Pegasus) reads them from one
`cache_position` shared by the batch, so its `embed_positions` is wrapped to take each row's own position.

Standard library + torch (imported when a batcher starts): copied next to model.py into streaming text2text models.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from .continuous import ContinuousBatcher, dynamic_cache
from .sequences import Sequence
from .settings import StepSettings


def _row_positions_type(torch):
    class RowPositions(torch.nn.Module):
        """A decoder's absolute position embedding that, while `rows` is set ([batch, 1] positions), embeds each
        row at its own position; otherwise it is the model's own (the in-process generate() uses it so)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.rows = None

        def forward(self, *args, **kwargs):
            if self.rows is None:
                return self.inner(*args, **kwargs)
            # BART's table starts `offset` rows in (its padding hack); Marian's and Pegasus' sinusoids at 0
            return torch.nn.functional.embedding(self.rows + getattr(self.inner, "offset", 0), self.inner.weight)

    return RowPositions


def row_positions(model):
    """The decoder's position embedding wrapped once (RowPositions), or None: the decoder has none (T5)."""
    decoder = model.get_decoder()
    inner = getattr(decoder, "embed_positions", None)
    if inner is None:
        return None
    if not hasattr(inner, "rows"):
        import torch

        decoder.embed_positions = _row_positions_type(torch)(inner)
    return decoder.embed_positions


def decoder_start_id(model) -> int:
    """The token every answer's decoding starts from (generate()'s decoder_start_token_id)."""
    for config in (getattr(model, "generation_config", None), model.config):
        start = getattr(config, "decoder_start_token_id", None)
        if start is not None:
            return int(start)
    raise ValueError(f"{type(model).__name__} names no decoder_start_token_id in its config or generation config")


class Seq2SeqBatcher(ContinuousBatcher):
    """ContinuousBatcher for AutoModelForSeq2SeqLM models. A joining request's prompt goes through the encoder whole
    (a long one alone, where the causal batcher feeds it in chunks) and its first decoding step with it; from
    then on every step decodes all running rows together."""

    def __init__(
        self,
        model,
        tokenizer,
        device: str,
        max_sequences: int,
        max_queue: int,
        context: int,
        settings: StepSettings | None = None,
        **kwargs,
    ):
        super().__init__(model, tokenizer, device, max_sequences, max_queue, context, settings=settings, **kwargs)
        # the answer starts the decoder's own text (its prompt is the encoder's input): no leading space, as the pipeline
        self.detokenizer = dataclasses.replace(self.detokenizer, primed=False)
        # the request check bounds the answer (engine.check_length); a prompt takes no decoder position
        self.context = sys.maxsize
        self.last_logits = {}
        self.start_id = decoder_start_id(model)
        self.positions_embedding = row_positions(model)
        self.encoder = model.get_encoder()
        self.cross: list = []  # per layer (keys, values) [batch, heads, input, dim] of the cross-attention
        self.encoder_states = None  # [batch, input, hidden], right-padded
        self.encoder_mask = None  # [batch, input] 1 = real token

    # ------------------------------------------------------------------ model passes

    def _decoder_pass(self, input_ids, mask, positions, cache: list, cross: list, states, encoder_mask):
        """One decoding step: the last logits, the grown self-attention cache and the cross-attention cache
        (computed by this pass where `cross` is empty). Both caches are consumed as in the causal _forward."""
        if self.positions_embedding is not None:
            self.positions_embedding.rows = positions
        try:
            inputs = {"attention_mask": encoder_mask, "decoder_input_ids": input_ids, "decoder_attention_mask": mask}
            return decoder_pass(self.model, cache, cross, states, **inputs)
        finally:
            if self.positions_embedding is not None:
                self.positions_embedding.rows = None

    def _decoder_ids(self, sequence: Sequence) -> tuple[list[int], int]:
        """The decoder's input so far: the start token, then the answer (the prompt went to the encoder)."""
        return [self.start_id, *sequence.generated], 1

    def _forward(self, input_ids, mask, positions, cache: list | None):
        """The running batch's decoding step (the causal batcher's `_decode` calls it)."""
        logits, cache, self.cross = self._decoder_pass(
            input_ids, mask, positions, cache or [], self.cross, self.encoder_states, self.encoder_mask
        )
        return logits, cache

    def _prefill(self, joining: list[Sequence]) -> None:
        """The joining prompts through the encoder together (right-padded, masked), then their first decoding step
        from the start token; they join the running batch with their first token taken."""
        torch = self.torch
        width = max(len(s.prompt_ids) for s in joining)
        ids = torch.full((len(joining), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(joining), width), dtype=torch.long)
        for row, sequence in enumerate(joining):
            ids[row, : len(sequence.prompt_ids)] = torch.tensor(sequence.prompt_ids)
            mask[row, : len(sequence.prompt_ids)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        states = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        start = torch.full((len(joining), 1), self.start_id, dtype=torch.long, device=self.device)
        decoder_mask = torch.ones((len(joining), 1), dtype=torch.long, device=self.device)
        positions = torch.zeros((len(joining), 1), dtype=torch.long, device=self.device)
        logits, cache, cross = self._decoder_pass(start, decoder_mask, positions, [], [], states, mask)
        self._merge_encoder(cross, states, mask)
        self._merge(joining, cache, decoder_mask, positions[:, 0] + 1)
        self._advance(joining, logits, offset=len(self.running) - len(joining))

    def _prefill_chunk(self, count: int) -> None:
        """A long prompt is encoded whole (an encoder cannot take it in chunks): it joins at once."""
        sequence, self.partial = self.partial, None
        self._prefill([sequence])

    # ------------------------------------------------------------------ the encoder side of the batch

    def _merge_encoder(self, cross: list, states, mask) -> None:
        """Append the joining rows' encoder states, mask and cross-attention cache (before `_merge` adds the rows)."""
        if not self.running:
            self.cross, self.encoder_states, self.encoder_mask = cross, states, mask
            return
        width = max(self.encoder_mask.shape[1], mask.shape[1])
        torch = self.torch

        def join(old, new, dim: int):
            return torch.cat([_pad_right(torch, old, width, dim), _pad_right(torch, new, width, dim)])

        self.encoder_states = join(self.encoder_states, states, 1)
        self.encoder_mask = join(self.encoder_mask, mask, 1)
        self.cross = [(join(k0, k1, 2), join(v0, v1, 2)) for (k0, v0), (k1, v1) in zip(self.cross, cross)]

    def _retire(self, done: dict[int, str]) -> None:
        keep = [row for row in range(len(self.running)) if row not in done]
        super()._retire(done)
        if not keep:
            return
        index = self.torch.tensor(keep, device=self.device)
        mask = self.encoder_mask[index]
        width = int(mask.sum(-1).max())  # right-padded: columns past the longest kept input are padding in every row
        self.encoder_mask, self.encoder_states = mask[:, :width], self.encoder_states[index][:, :width]
        self.cross = [(k[index][:, :, :width], v[index][:, :, :width]) for k, v in self.cross]

    def _reset(self) -> None:
        super()._reset()
        self.cross, self.encoder_states, self.encoder_mask = [], None, None


def decoder_pass(model, cache: list, cross: list, states, **inputs) -> tuple:
    """One pass of an encoder-decoder's decoder over `states` (the encoder's) and the caches (per layer (keys, values),
    consumed as in the causal _forward; `cross` empty: computed by this pass): the last position's logits, the grown
    self-attention cache and the cross-attention cache."""
    from transformers import EncoderDecoderCache
    from transformers.modeling_outputs import BaseModelOutput

    past = EncoderDecoderCache(dynamic_cache(cache), dynamic_cache(cross))
    out = model(encoder_outputs=BaseModelOutput(last_hidden_state=states), past_key_values=past, use_cache=True, **inputs)
    caches = out.past_key_values
    layers = [(layer.keys, layer.values) for layer in caches.self_attention_cache.layers]
    return out.logits[:, -1, :].float(), layers, [(layer.keys, layer.values) for layer in caches.cross_attention_cache.layers]


def _pad_right(torch, tensor, width: int, dim: int):
    """`tensor` with zeros appended along `dim` up to `width`."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)


def new_batcher(model, tokenizer, device: str, *, cuda_graphs: bool, log: Callable[[str], None] = print, **limits) -> Seq2SeqBatcher:
    """The batcher for a served text2text model (no preallocated cache or CUDA graphs for encoder-decoders yet)."""
    log(f"hf2triton: text2text generation with continuous batching ({limits['max_sequences']} sequences, dynamic KV cache)")
    return Seq2SeqBatcher(model, tokenizer, device, **limits)
