"""The torch batcher's own 4-D attention masks (continuous.causal_mask): transformers builds its SDPA mask with a vmap
over its mask functions, ~1.9 ms per pass on 2 CPU cores, as much as a small model's pass. The batcher builds the
same mask itself where every layer attends causally to all earlier tokens, and its probe agrees; sliding-window
layers, ALiBi's eager attention and the like keep transformers' own. Either way every architecture decodes the
tokens it decodes with transformers' masks, for rows that join a running batch (left padding, a growing cache). A
windowed model also keeps the dynamic cache where a GPU would take the preallocated slots, whose mask is full."""

from __future__ import annotations

import pytest

from hf2triton.serving.batching.continuous import ContinuousBatcher
from hf2triton.serving.batching.sequences import Sampling, Sequence
from tests.helpers import smollm2_gguf

LAYERS = {"num_hidden_layers": 2, "num_attention_heads": 2}
DECODER = {"hidden_size": 32, "intermediate_size": 64, "num_key_value_heads": 1, **LAYERS}
# architecture: (config class, model class, its config, whether the batcher builds its masks)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", DECODER, True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", DECODER, True),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 32, "n_layer": 2, "n_head": 2}, True),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"hidden_size": 32, "intermediate_size": 64, **LAYERS}, True),
    "mistral-sliding-window": ("MistralConfig", "MistralForCausalLM", {**DECODER, "sliding_window": 8}, False),
    "gemma2-sliding-layers": ("Gemma2Config", "Gemma2ForCausalLM", {**DECODER, "head_dim": 16, "sliding_window": 8}, False),
    "bloom-alibi": ("BloomConfig", "BloomForCausalLM", {"hidden_size": 32, "n_layer": 2, "n_head": 2}, False),
}
PROMPTS = ["The capital of France is", "Hi", "Tell me a very long story about a dragon and a knight who"]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf().parent, gguf_file=smollm2_gguf().name)


def decode(model, tokenizer, own_masks: bool) -> tuple[bool, list[list[int]]]:
    """(the batcher's choice, the greedy tokens of PROMPTS joining one per step) with its masks or transformers'."""
    batcher = ContinuousBatcher(model, tokenizer, "cpu", max_sequences=4, max_queue=8, context=128)
    chosen = batcher.own_masks
    batcher.own_masks = chosen and own_masks
    sequences = [
        Sequence(tokenizer(p, add_special_tokens=False)["input_ids"], Sampling(max_new_tokens=12), lambda *a: None) for p in PROMPTS
    ]
    for sequence in sequences:
        batcher.submit(sequence)
        batcher.step()
    while not batcher.idle:
        batcher.step()
    return chosen, [sequence.generated for sequence in sequences]


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_own_masks_where_attention_is_full_and_causal_and_the_same_tokens_everywhere(tokenizer, architecture):
    import torch
    import transformers

    config_class, model_class, settings, builds = ARCHITECTURES[architecture]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), **settings)
    model = getattr(transformers, model_class)(config).eval()
    chosen, ours = decode(model, tokenizer, own_masks=True)
    assert chosen == builds, f"{architecture}: own masks {chosen}"
    assert ours == decode(model, tokenizer, own_masks=False)[1]


def test_a_windowed_model_keeps_the_dynamic_cache_where_a_gpu_would_take_the_slots(tokenizer):
    """The preallocated slots' decoding mask sees every earlier token, and the load-time probe's short prompts fit any
    window: a model with sliding-window layers keeps the dynamic KV cache (its own masks), and the log says why."""
    import torch
    import transformers

    from hf2triton.serving.batching.slots import SlotBatcher, new_batcher

    config_class, model_class, settings, _ = ARCHITECTURES["mistral-sliding-window"]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(vocab_size=len(tokenizer), **settings)).eval()
    lines: list[str] = []
    limits = {"max_sequences": 4, "max_queue": 4, "context": 128}
    batcher = new_batcher(model, tokenizer, "cpu", cuda_graphs=True, log=lines.append, slots=True, **limits)
    assert type(batcher) is ContinuousBatcher and not isinstance(batcher, SlotBatcher)
    assert "sliding-window or chunked attention layers" in lines[-1], lines
