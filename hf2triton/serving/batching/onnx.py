"""The continuous batcher over an ONNX Runtime decoder (backend onnx, text-generation): the torch batcher's
scheduling, sampling, stop strings, grammars, log-probabilities and cancellation, with each model pass run by
the export's own session (runtimes/onnxruntime.py OrtDecoder).

Both exporters' graphs take the running batch with per-row masks, each in its own layout:
- optimum's (`past_key_values.N.key` in, `present.N.key` = past + new out, explicit position ids): the torch
  batcher's left-padded cache as it is;
- ONNX Runtime GenAI's builder (GroupQueryAttention): a row's length is its mask's sum, its tokens from column 0
  and its new key/value written at its own column (rotary positions come from that length), so the batch is
  right-padded (ContinuousBatcher.right_padded) and a decoding step's mask marks each row's own next column.

The KV cache is torch tensors on the instance's device, bound to the session by address (I/O binding) in and
out: nothing is copied between steps but what ONNX Runtime itself writes, and on a GPU the cache never leaves
it (a plain Run would copy every present key/value to the host). On a GPU the builder's graph decodes on a
preallocated cache (OnnxSlotBatcher): GroupQueryAttention given one buffer as past and present writes each row's
new key/value in place, where the dynamic layout's Run copies the whole past into a new present at every step;
with cuda_graphs its decoding steps replay ONNX Runtime's CUDA graphs, one per (rows, columns) bucket.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .continuous import ContinuousBatcher
from .slots import SlotBatcher, slots_agree

ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64"}


class OnnxBatcher(ContinuousBatcher):
    """The running batch over `decoder` (an OrtDecoder); `device` is where its cache lives (the session's GPU, or
    the CPU)."""

    def __init__(self, decoder, tokenizer, device: str, **limits: Any):
        super().__init__(decoder, tokenizer, device, **limits)
        import numpy as np

        self.np, self.session = np, decoder.session
        self.right_padded = decoder.right_padded
        self.inputs = decoder.input_names
        self.layers = len(decoder.past) // 2
        _, self.kv_heads, self.head_size, cache_type = decoder.past[0]
        self.cache_dtype = getattr(self.torch, np.dtype(cache_type).name)
        (logits,) = [o for o in self.session.get_outputs() if o.name == "logits"]
        self.logits_dtype = getattr(self.torch, ORT_TYPES[logits.type])
        self.vocabulary = logits.shape[-1] if isinstance(logits.shape[-1], int) else decoder.config.vocab_size
        self.place = ("cuda", decoder.device_id) if decoder.device_id is not None else ("cpu", 0)
        self.eager_options = decoder.eager_options  # a graph-capable session captures no run without a graph id

    def _bind(self, binding, name: str, tensor, output: bool = False) -> None:
        """Bind a contiguous torch tensor by its address (the tensor must outlive the Run)."""
        if not tensor.is_contiguous():  # a .contiguous() copy made here would be freed before the Run reads it
            raise ValueError(f"{name}: bind a contiguous tensor, held until the Run ends")
        kind = self.np.dtype(str(tensor.dtype).removeprefix("torch."))
        bind = binding.bind_output if output else binding.bind_input
        bind(name, *self.place, kind, tuple(tensor.shape), tensor.data_ptr())

    def _run(self, binding, options: Any = None) -> None:
        if self.place[0] == "cuda":  # ONNX Runtime runs on its own stream: what torch wrote must be there first
            self.torch.cuda.current_stream(self.device).synchronize()
        self.session.run_with_iobinding(binding, options or self.eager_options)

    def _forward(self, input_ids, mask, positions, cache: list | None, every_position: bool = False):
        """One session run; the last position's logits of every row (`every_position`: all) and the grown cache
        ((keys, values) per layer, [rows, kv_heads, mask width, head_size]). `cache` is consumed (emptied)."""
        torch = self.torch
        rows, length = input_ids.shape
        total = mask.shape[1]
        if cache is None:  # a prefill: no past
            empty = torch.zeros((rows, self.kv_heads, 0, self.head_size), dtype=self.cache_dtype, device=self.device)
            cache = [(empty, empty)] * self.layers
        binding = self.session.io_binding()
        feeds = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions}
        keep = [value.to(torch.int64).contiguous() for name, value in feeds.items() if name in self.inputs]
        for name, tensor in zip((n for n in feeds if n in self.inputs), keep):
            self._bind(binding, name, tensor)
        # held until the Run is done: a retired row's trim leaves strided views, bound as contiguous copies
        past, cache[:] = [(keys.contiguous(), values.contiguous()) for keys, values in cache], []
        for layer, (keys, values) in enumerate(past):
            self._bind(binding, f"past_key_values.{layer}.key", keys)
            self._bind(binding, f"past_key_values.{layer}.value", values)
        logits = torch.empty((rows, length, self.vocabulary), dtype=self.logits_dtype, device=self.device)
        self._bind(binding, "logits", logits, output=True)
        shape = (rows, self.kv_heads, total, self.head_size)
        present = [tuple(torch.empty(shape, dtype=self.cache_dtype, device=self.device) for _ in "kv") for _ in past]
        for layer, (keys, values) in enumerate(present):
            self._bind(binding, f"present.{layer}.key", keys, output=True)
            self._bind(binding, f"present.{layer}.value", values, output=True)
        self._run(binding)
        del past, keep  # the old cache goes as soon as the new one is written
        if every_position:
            return logits.float(), present
        if self.right_padded:  # a row's last token: its mask's last one within this pass's input
            last = (mask.sum(-1) - 1 - (total - length)).clamp(min=0)
            return logits[torch.arange(rows, device=self.device), last].float(), present
        return logits[:, -1].float(), present


class OnnxSlotBatcher(SlotBatcher, OnnxBatcher):
    """The builder's graph on the SlotBatcher's preallocated cache ([max_sequences, kv_heads, context, head_size] per
    layer, a row's tokens at their positions): prompts are prefilled as in OnnxBatcher and copied into slots; a
    decoding step binds each layer's first `rows` slots as both past and present, so GroupQueryAttention appends in
    place.

    `graphs` (a session able to capture them, on a GPU): the steps run in the SlotBatcher's (rows, columns) buckets,
    each replaying ONNX Runtime's CUDA graph of that shape -- one launch where a step launched the kernels of every
    layer -- over buffers bound once: the ids are SlotBatcher.tokens, the mask one buffer per bucket (a padded row's
    mask is its column 0, a free slot's), the logits another. Without: a step's mask is as wide as the furthest
    row's next column and no row is padded."""

    def __init__(self, decoder, tokenizer, device: str, graphs: bool = False, **limits: Any):
        super().__init__(decoder, tokenizer, device, cuda_graphs=False, **limits)
        self.bindings: dict[tuple[int, int], Any] = {}  # (rows, the slots' address): the cache bound, reused every step
        self.graphed = graphs
        self.new_graph_options = decoder.new_graph_options
        # (rows, columns, the slots' address) -> the bucket's binding, mask, logits and run options (its graph id)
        self.graph_steps: dict[tuple[int, int, int], tuple[Any, Any, Any, Any]] = {}

    def bucket(self, rows: int) -> tuple[int, int]:
        if self.graphed:
            return super().bucket(rows)
        return rows, max(self.lengths) + 1

    def _bind_cache(self, binding, rows: int) -> None:
        """The first `rows` slots of every layer bound as past and present. They stay where they are for the
        batcher's life, so a binding made once per shape is reused at every step (4 x layers binds of ~2.5 us each
        were a step's host work: 120 for SmolLM2's 30 layers)."""
        for layer, (keys, values) in enumerate(self.slots):
            for kind, slots in (("key", keys[:rows]), ("value", values[:rows])):
                self._bind(binding, f"past_key_values.{layer}.{kind}", slots)
                self._bind(binding, f"present.{layer}.{kind}", slots, output=True)

    def _cache_bound(self, rows: int):
        """An I/O binding with the cache bound, made once per row count."""
        key = (rows, self.slots[0][0].data_ptr())
        binding = self.bindings.get(key)
        if binding is None:
            binding = self.bindings[key] = self.session.io_binding()
            self._bind_cache(binding, rows)
        return binding

    def _graph_step(self, rows: int, columns: int) -> tuple[Any, Any, Any, Any]:
        """A bucket's binding over buffers that never move (a graph replays the addresses it captured), made at its
        first step: ONNX Runtime's first runs of its new graph id warm up and capture, later ones replay."""
        key = (rows, columns, self.slots[0][0].data_ptr())
        step = self.graph_steps.get(key)
        if step is None:
            torch, binding = self.torch, self.session.io_binding()
            self._bind_cache(binding, rows)
            mask = torch.zeros((rows, columns), dtype=torch.int64, device=self.device)
            logits = self._bind_step(binding, rows, mask)
            step = self.graph_steps[key] = (binding, mask, logits, self.new_graph_options())
        return step

    def _bind_step(self, binding, rows: int, mask):
        """Bind a decoding step's ids (the first `rows` of SlotBatcher.tokens), `mask` and a new logits buffer
        ([rows, 1, vocabulary], returned)."""
        logits = self.torch.empty((rows, 1, self.vocabulary), dtype=self.logits_dtype, device=self.device)
        self._bind(binding, "input_ids", self.tokens[:rows, None])
        self._bind(binding, "attention_mask", mask)
        self._bind(binding, "logits", logits, output=True)
        return logits

    def _captures(self) -> bool:
        return self.graphed

    def _capture(self, rows: int, columns: int) -> bool:
        for _ in range(2):  # ONNX Runtime runs a new graph id once, then captures it (and replays) on the next run
            self._pass(rows, columns)
        return True

    def _pass(self, rows: int, columns: int):
        torch = self.torch
        visible = self.columns[None, :columns] <= self.positions[:rows, None]  # a row's sum: its position + 1
        if self.graphed:
            binding, mask, logits, options = self._graph_step(rows, columns)
            mask.copy_(visible)
            self._run(binding, options)
            return logits[:, -1].float()
        binding = self._cache_bound(rows)
        mask = visible.to(torch.int64)  # held until the Run is done
        logits = self._bind_step(binding, rows, mask)
        self._run(binding)
        return logits[:, -1].float()


def new_batcher(
    decoder, tokenizer, device: str, *, cuda_graphs: bool, log: Callable[[str], None] = print, slots: bool | None = None, **limits: Any
) -> OnnxBatcher:
    """The served batcher of a backend onnx text-generation model. Its cache lives where the session runs (the
    engine's `device` is the host's for the ONNX decoder, which reads numpy). The builder's graph on a GPU: the
    preallocated cache, once it has reproduced the dynamic one's greedy tokens (slots.slots_agree); on the CPU the
    dynamic cache, which holds only the tokens written (`slots` forces the choice)."""
    place = f"cuda:{decoder.device_id}" if decoder.device_id is not None else "cpu"
    dynamic = functools.partial(OnnxBatcher, decoder, tokenizer, place)
    batcher = None
    if decoder.right_padded and (place != "cpu" if slots is None else slots):
        graphs = cuda_graphs and place != "cpu" and decoder.graph_capable
        for graphed in dict.fromkeys((graphs, False)):  # with graphs first; a capture that fails: the same cache eagerly
            slotted = functools.partial(OnnxSlotBatcher, decoder, tokenizer, place, graphs=graphed)
            if slots_agree(dynamic, slotted, tokenizer, limits["context"], log):
                batcher = slotted(**limits)
                batcher.capture_buckets(log)
                break
    batcher = batcher or dynamic(**limits)
    layout = "GenAI builder graph, right-padded" if batcher.right_padded else "optimum graph, left-padded"
    cache = f"preallocated, {limits['max_sequences']} slots x {limits['context']} tokens" if isinstance(batcher, SlotBatcher) else "dynamic"
    replayed = "; decoding steps replay CUDA graphs per batch bucket" if getattr(batcher, "graphed", False) else ""
    if cuda_graphs and place != "cpu" and not replayed:  # the log above says why, where a probe failed
        replayed = "; no CUDA graphs" + ("" if decoder.graph_capable else ": ONNX Runtime cannot capture this graph")
    log(f"hf2triton: generation streams on ONNX Runtime ({layout}; {cache} KV cache on {place}{replayed})")
    return batcher
