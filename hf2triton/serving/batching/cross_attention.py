"""One cross-attention cache per audio for Whisper's running batch (batching/whisper.py): generate() keeps one per
beam, all equal (a Whisper of small's shape in float32: 110 MB a row, 17.7 GB at 32 audios x 5 beams, all read at
every decoding step). Here each decoder layer's cross-attention is patched once per model: during a pass of the
batcher's thread (`attending`) an audio's beams attend as query positions of that audio's one row of keys and values
-- each query attends on its own, unmasked, so it is the same arithmetic; on any other thread (execute()'s own
generate()) the layer is the model's own.

Standard library at import (torch when a pass runs): copied next to model.py with speech models.
"""

from __future__ import annotations

import contextlib
import threading

_SHARED = threading.local()  # .cross on the batcher's thread during its passes: (per layer (keys, values), beams, rows)


@contextlib.contextmanager
def attending(cross: list, beams: list[int]):
    """While it lasts, the patched cross-attentions of this thread's passes read `cross` (per layer (keys, values)
    [audios, heads, frames, dim]) for rows that are `beams` consecutive beams per audio. Beams that differ between
    audios: each row's audio, computed here once for every layer."""
    rows = None
    if len(set(beams)) > 1:
        import torch

        device = cross[0][0].device
        rows = torch.repeat_interleave(torch.arange(len(beams), device=device), torch.tensor(beams, device=device))
    _SHARED.cross = (cross, beams, rows)
    try:
        yield
    finally:
        _SHARED.cross = None


def shared_cross_attention(model) -> None:
    """Each decoder layer's cross-attention (once per model) attends, while the batcher's thread runs a pass, over the
    per-audio keys and values the batcher holds (`_SHARED.cross`: per layer [audios, heads, frames, dim], and the beams
    per audio) instead of its cache; on any other thread (execute()'s own generate()) it is the model's own."""
    for number, layer in enumerate(model.get_decoder().layers):
        attention = layer.encoder_attn
        if getattr(attention, "hf2triton_shared", False):
            continue
        own = attention.forward

        def forward(*args, _attention=attention, _own=own, _layer=number, **kwargs):
            shared = getattr(_SHARED, "cross", None)
            if shared is None:
                return _own(*args, **kwargs)
            layers, beams, rows = shared
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            return _attend(_attention, hidden, *layers[_layer], beams, rows), None

        attention.forward = forward
        attention.hf2triton_shared = True


def _attend(attention, hidden, keys, values, beams: list[int], audio_of_row):
    """WhisperAttention's cross-attention for rows whose audios' keys / values are one row each: an audio's `beams`
    consecutive rows become query positions of its row (beams equal for every audio: `audio_of_row` None), or the keys
    and values are indexed per row (beams that differ: searches with other num_beams in the batch)."""
    rows, length = hidden.shape[:2]
    heads, dim = attention.num_heads, attention.head_dim
    query = (attention.q_proj(hidden) * attention.scaling).view(rows, length, heads, dim).transpose(1, 2)  # [rows, heads, length, dim]
    if audio_of_row is None:
        audios, beam = len(beams), beams[0]
        query = query.reshape(audios, beam, heads, length, dim).transpose(1, 2).reshape(audios, heads, beam * length, dim)
        out = _attention(attention, query, keys, values).reshape(audios, heads, beam, length, dim).permute(0, 2, 3, 1, 4)
    else:
        out = _attention(attention, query, keys[audio_of_row], values[audio_of_row]).transpose(1, 2)
    return attention.out_proj(out.reshape(rows, length, heads * dim))


def _attention(attention, query, keys, values):
    """softmax(query keys^T) values as the model's own attention computes it (scaling is in the query): eager's
    matmuls, else PyTorch's scaled_dot_product_attention (sdpa)."""
    import torch

    if attention.config._attn_implementation == "eager":
        return torch.matmul(torch.nn.functional.softmax(torch.matmul(query, keys.transpose(2, 3)), dim=-1), values)
    return torch.nn.functional.scaled_dot_product_attention(query, keys, values, scale=1.0)


def cross_cache(model, states) -> list:
    """Per decoder layer, the cross-attention's (keys, values) [audios, heads, frames, dim] of encoder `states` (one row
    per audio), as WhisperAttention projects them."""
    cache = []
    rows = states.shape[0]
    for layer in model.get_decoder().layers:
        attention = layer.encoder_attn
        shape = (rows, -1, attention.num_heads, attention.head_dim)
        keys = attention.k_proj(states).view(shape).transpose(1, 2).contiguous()
        cache.append((keys, attention.v_proj(states).view(shape).transpose(1, 2).contiguous()))
    return cache
