"""The continuous batcher on a preallocated KV cache with CUDA graphs (GPUs), and which batcher serves a model."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

from .continuous import ContinuousBatcher, windowed_attention
from .sequences import Sampling, Sequence


def _slot_cache_types():
    """transformers' Cache over slot views (imported when a SlotBatcher starts: this module stays torch-only)."""
    from transformers.cache_utils import Cache, CacheLayerMixin

    class SlotLayer(CacheLayerMixin):
        """One layer's keys/values for a decoding step: views [rows, kv_heads, columns, head_dim] of the slot
        buffers; the step's one new key/value per row goes to that row's own column (its position)."""

        is_compileable = True
        is_sliding = False

        def __init__(self, keys, values, rows, columns):
            super().__init__()
            self.keys, self.values, self.rows, self.columns = keys, values, rows, columns
            self.is_initialized = True

        def lazy_initialization(self, key_states) -> None:
            """Allocated by the batcher."""

        def update(self, key_states, value_states, cache_kwargs=None):
            self.keys[self.rows, :, self.columns] = key_states[:, :, 0]
            self.values[self.rows, :, self.columns] = value_states[:, :, 0]
            return self.keys, self.values

        def get_mask_sizes(self, cache_position) -> tuple[int, int]:
            return self.keys.shape[2], 0

        def get_seq_length(self) -> int:
            return self.keys.shape[2]

        def get_max_cache_shape(self) -> int:
            return self.keys.shape[2]

    return Cache, SlotLayer


class SlotBatcher(ContinuousBatcher):
    """The continuous batcher on a preallocated KV cache, for GPUs (issue 25 #3). Every running sequence owns a
    slot: row `i` of one [max_sequences, kv_heads, context, head_dim] buffer per layer for keys and values, its
    tokens at their own positions (column = position). A decoding step writes one column per row in place,
    where the dynamic cache concatenates the whole cache at every step; a joining prompt is prefilled as before
    and copied into the next free slots; a leaving row's slot takes the last row (one row copied, nothing
    trimmed or padded). With per-row positions no row is ever left-padded, so a step's input is a fixed shape:
    on a GPU the steps replay CUDA graphs captured per (rows, columns) bucket -- one launch instead of ~15 kernel
    launches per layer, which is what a small model's decoding step is made of in eager mode."""

    ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    MIN_COLUMNS = 128
    CAPTURED_COLUMNS = 256  # the column buckets captured at load (capture_buckets): prompts and answers this long

    def __init__(self, *args, cuda_graphs: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        torch = self.torch
        self.use_graphs = cuda_graphs and self.device.startswith("cuda")
        self.slots: list[tuple[Any, Any]] = []  # per layer (keys, values), allocated by the first prefill
        self.tokens = torch.zeros(self.max_sequences, dtype=torch.long, device=self.device)  # each row's next input
        self.positions = torch.zeros(self.max_sequences, dtype=torch.long, device=self.device)  # = its column
        self.lengths: list[int] = []  # the same positions on the host (buckets are chosen without a sync)
        self.rows = torch.arange(self.max_sequences, device=self.device)
        self.columns = torch.arange(self.context, device=self.device)
        self.graphs: dict[tuple[int, int], tuple[Any, Any]] = {}
        self.pool = None
        self.graph_failure = ""

    # ------------------------------------------------------------------ buckets and the decoding pass

    def bucket(self, rows: int) -> tuple[int, int]:
        """(rows, columns) of the pass for `rows` running rows: rows rounded up to ROWS (within max_sequences),
        columns to a power of two above the furthest position (within the context)."""
        padded = next((r for r in self.ROWS if r >= rows), rows)
        columns = self.MIN_COLUMNS
        while columns <= max(self.lengths):
            columns *= 2
        return min(padded, self.max_sequences), min(columns, self.context)

    def _pass(self, rows: int, columns: int):
        """One decoding step of the first `rows` slots over `columns` columns (logits [rows, vocabulary]). The
        4-D boolean mask (a row sees its own columns up to its position) goes to the model as it is: transformers'
        2-D mask path asks the GPU whether the mask is all ones, a host sync a graph capture forbids."""
        cache_type, layer_type = _slot_cache_types()
        index, positions = self.rows[:rows], self.positions[:rows]
        cache = cache_type(layers=[layer_type(k[:rows, :, :columns], v[:rows, :, :columns], index, positions) for k, v in self.slots])
        mask = (self.columns[None, :columns] <= positions[:, None])[:, None, None, :]
        out = self.model(
            input_ids=self.tokens[:rows, None],
            attention_mask=mask,
            position_ids=positions[:, None],
            past_key_values=cache,
            cache_position=positions[:1],
            use_cache=True,
            **self.last_logits,
        )
        return out.logits[:, -1, :].float()

    def _graph(self, shape: tuple[int, int]):
        """The captured pass for `shape` (captured on first use), or None: eager."""
        if not self.use_graphs or self.graph_failure:
            return None
        if shape in self.graphs:
            return self.graphs[shape]
        torch = self.torch
        try:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up: writes what the step itself writes (same tokens, same columns)
                self._pass(*shape)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                logits = self._pass(*shape)
        except Exception as err:  # noqa: BLE001 - an architecture that cannot be captured still serves, eagerly
            self.graph_failure = f"{type(err).__name__}: {err}"
            sys.stderr.write(f"hf2triton: CUDA graphs off for generation (capture failed: {self.graph_failure})\n")
            return None
        self.graphs[shape] = (graph, logits)
        return self.graphs[shape]

    def _captures(self) -> bool:
        """Whether decoding steps replay captured graphs."""
        return self.use_graphs and not self.graph_failure

    def _capture(self, rows: int, columns: int) -> bool:
        """Capture the (rows, columns) bucket's step; False: capture failed (eager from now on)."""
        return self._graph((rows, columns)) is not None

    def capture_buckets(self, log: Callable[[str], None] = print) -> None:
        """Capture every row bucket's decoding step, for columns up to CAPTURED_COLUMNS, before anything is served: a
        bucket captured on first use holds every running stream up for its capture, and ONNX Runtime also compiles
        kernels then (8 % of a fresh server's first loaded half-minute on the H100, benchmarks/h200/README.md). The
        largest first, as vLLM does: the smaller ones reuse its memory pool."""
        if not self._captures():
            return
        started = time.perf_counter()
        responder, self.responder = self.responder, None  # the probe's one token goes nowhere
        try:
            _greedy_ids(self, [[self.pad_id]], 1)  # its prefill allocates the slots
        finally:
            self.responder = responder
        rows = sorted({min(r, self.max_sequences) for r in self.ROWS}, reverse=True)
        widths, width = set(), self.MIN_COLUMNS
        while width <= self.CAPTURED_COLUMNS:  # bucket()'s column buckets, within the context
            widths.add(min(width, self.context))
            width *= 2
        columns = sorted(widths, reverse=True)
        shapes = [(r, c) for r in rows for c in columns]
        with self.torch.inference_mode():  # as step() runs them: the slots are inference tensors
            try:
                captured = all(self._capture(*shape) for shape in shapes)  # a torch capture's failure is logged: eager
            except Exception as err:  # noqa: BLE001 - the buckets are captured on first use instead
                log(f"hf2triton: decoding steps captured on first use (capturing them at load failed: {type(err).__name__}: {err})")
                captured = False
            self._reset()  # the passes wrote column 0 of free slots only
        if not captured:
            return
        log(
            f"hf2triton: captured {len(shapes)} decoding steps (rows {rows[-1]}-{rows[0]} x columns {columns[-1]}-{columns[0]}) "
            f"in {time.perf_counter() - started:.1f} s"
        )

    def _decode(self) -> None:
        count = len(self.running)
        rows, columns = self.bucket(count)
        captured = self._graph((rows, columns))
        if captured is None:  # eager: the same padded shape (the CPU tests run what a graph replays)
            logits = self._pass(rows, columns)
        else:
            graph, logits = captured
            graph.replay()
        self.positions[:count] += 1
        self.lengths = [length + 1 for length in self.lengths]
        self._advance(list(self.running), logits[:count], offset=0)

    # ------------------------------------------------------------------ slots

    def _allocate(self, cache) -> None:
        torch = self.torch
        for keys, _ in cache:
            shape = (self.max_sequences, keys.shape[1], self.context, keys.shape[3])
            self.slots.append(
                (torch.zeros(shape, dtype=keys.dtype, device=self.device), torch.zeros(shape, dtype=keys.dtype, device=self.device))
            )

    def _merge(self, joining: list[Sequence], cache, mask, positions) -> None:
        """Copy the prefilled rows (padded to the batch's longest prompt, on the left unless right_padded) into the next
        free slots."""
        if not self.slots:
            self._allocate(cache)
        first, lengths = len(self.running), [int(p) for p in positions.tolist()]
        width = cache[0][0].shape[2]
        if self.right_padded or len(set(lengths)) == 1:
            # every row starts at column 0 (or all are as long): one copy per layer for all the rows; a shorter row's
            # padding columns land past its position, which its mask hides and its own decoding steps overwrite
            length = max(lengths)
            copies = [(slice(first, first + len(lengths)), slice(None), 0 if self.right_padded else width - length, length)]
        else:  # (slot, prefilled row, its first column, its length)
            copies = [(first + index, index, width - length, length) for index, length in enumerate(lengths)]
        for slot, row, start, length in copies:
            for (keys, values), (new_keys, new_values) in zip(self.slots, cache):
                keys[slot, :, :length] = new_keys[row, :, start : start + length]
                values[slot, :, :length] = new_values[row, :, start : start + length]
        cache.clear()
        self.positions[first : first + len(lengths)] = positions.to(self.positions.dtype)
        self.lengths += lengths
        self.running += joining

    def _set_last(self, offset: int, tokens: list[int]) -> None:
        self.tokens[offset : offset + len(tokens)] = self.torch.tensor(tokens, dtype=self.tokens.dtype).to(self.device)

    def _retire(self, done: dict[int, str]) -> None:
        """Finish rows `done`; the last rows move into the freed slots (their columns in use copied)."""
        for row, reason in done.items():
            self._finish(self.running[row], reason)
        count, kept = len(self.running), len(self.running) - len(done)
        holes = [row for row in range(kept) if row in done]
        movers = [row for row in range(kept, count) if row not in done]
        if movers:
            torch = self.torch
            source, target = torch.tensor(movers, device=self.device), torch.tensor(holes, device=self.device)
            width = max(self.lengths[row] for row in movers) + 1
            for keys, values in self.slots:
                keys[target, :, :width] = keys[source, :, :width]
                values[target, :, :width] = values[source, :, :width]
            self.positions[target] = self.positions[source]
            self.tokens[target] = self.tokens[source]
        self.positions[kept:count] = 0  # free slots: a padded graph row writes there, within every bucket's columns
        order = list(range(kept))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        self.running = [self.running[row] for row in order]
        self.lengths = [self.lengths[row] for row in order]

    def _reset(self) -> None:
        self.lengths = []
        self.positions.zero_()


def _greedy_ids(batcher: ContinuousBatcher, prompts: list[list[int]], count: int) -> list[list[int]]:
    """Each prompt's first `count` greedy tokens, the prompts decoded together."""
    sequences = [Sequence(ids, Sampling(max_new_tokens=count), lambda text, finish: None) for ids in prompts]
    for sequence in sequences:
        batcher.submit(sequence)
    while not batcher.idle:
        batcher.step()
    return [sequence.generated for sequence in sequences]


def slots_agree(dynamic: Callable[..., Any], slotted: Callable[..., Any], tokenizer, context: int, log: Callable[[str], None]) -> bool:
    """Whether a preallocated-cache batcher (`slotted(**limits)`) produces the dynamic cache's (`dynamic(**limits)`)
    greedy tokens for two probe prompts decoded together (a padded bucket and a second slot are used); if not, or
    if it fails, the log says why and the dynamic cache serves."""
    probe = {"max_sequences": 4, "max_queue": 4, "context": min(context, 256)}
    prompts = [
        tokenizer("The capital of France is", add_special_tokens=False)["input_ids"],
        tokenizer("1, 2, 3,", add_special_tokens=False)["input_ids"],
    ]
    try:
        expected, got = _greedy_ids(dynamic(**probe), prompts, 6), _greedy_ids(slotted(**probe), prompts, 6)
        if got != expected:
            raise ValueError(f"greedy tokens {got} differ from the dynamic cache's {expected}")
    except Exception as err:  # noqa: BLE001 - the dynamic cache still serves
        log(f"hf2triton: generation keeps the dynamic KV cache (the preallocated one failed its probe: {type(err).__name__}: {err})")
        return False
    return True


def new_batcher(
    model, tokenizer, device: str, *, cuda_graphs: bool, log: Callable[[str], None] = print, slots: bool | None = None, **limits
) -> ContinuousBatcher:
    """The batcher for a served model. On a GPU the SlotBatcher (CUDA graphs unless `cuda_graphs` is off), once it
    has produced the dynamic cache's greedy tokens for a probe prompt -- two rows, so a padded bucket and a
    second slot are used; an architecture it cannot drive (another cache or mask layout) keeps the dynamic cache
    and the log says why. On the CPU the dynamic cache: it holds only the tokens written, not the whole context
    (`slots` forces the choice)."""
    if not (device.startswith("cuda") if slots is None else slots):
        return ContinuousBatcher(model, tokenizer, device, **limits)
    if windowed_attention(getattr(model, "config", None)):  # a short probe cannot tell: its prompts fit any window
        log(
            "hf2triton: generation keeps the dynamic KV cache (the model has sliding-window or chunked attention layers; "
            "the slots' mask sees every earlier token)"
        )
        return ContinuousBatcher(model, tokenizer, device, **limits)
    dynamic = functools.partial(ContinuousBatcher, model, tokenizer, device)
    slotted = functools.partial(SlotBatcher, model, tokenizer, device, cuda_graphs=cuda_graphs)
    if not slots_agree(dynamic, slotted, tokenizer, limits["context"], log):
        return dynamic(**limits)
    batcher = slotted(**limits)
    batcher.capture_buckets(log)
    graphs = "on" if batcher.use_graphs else "off"
    size = f"{limits['max_sequences']} slots x {limits['context']} tokens"
    log(f"hf2triton: generation on a preallocated KV cache ({size}), CUDA graphs {graphs}")
    return batcher
