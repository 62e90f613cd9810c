"""Streaming generation on torch: continuous (iteration-level) batching for a transformers causal LM, without
Triton. sequences.py: a request's options, state and events (also vLLM's runtime speaks them); responder.py: the
thread that sends responses; continuous.py: the batcher on a dynamic KV cache; slots.py: on a preallocated one
with CUDA graphs, and which of the two serves (`new_batcher`); text.py: next tokens, text and stop strings.
"""
