"""Continuous (iteration-level) batching for a transformers causal LM, without Triton: sequences join the
running batch at the next decoding step and leave the moment they finish or their client is gone.

The model.py of a text-generation model runs one `ContinuousBatcher` per instance on a background thread;
`execute()` only parses requests and submits `Sequence`s (vllm_backend's shape). Like text-generation-
inference's Python server for plain transformers models, the running batch is one left-padded KV cache:
a joining prefill is padded to the batch's length, a leaving row is dropped, and columns no row needs any
more are trimmed. Attention masks and explicit position ids make every row compute what it would alone.

Prefill is bounded per step (`max_prefill_tokens`, vLLM's max_num_batched_tokens): prompts that fit are
prefilled together, a longer one alone in chunks with its KV cache growing per chunk (chunked prefill), and
every step still decodes the running batch. Unbounded, three 8,000-token prompts joining at once took a CPU
stub from 2.1 to 9.8 GB and froze running streams for 30 s (issue 24 #11).

Standard library + torch only: copied next to model.py into every rendered generation model.
"""

from __future__ import annotations

import collections
import ctypes
import inspect
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PARTIAL_CHARACTER = "\ufffd"


class Busy(Exception):
    """The waiting queue is full: the request is refused at once (retry later)."""


@dataclass(frozen=True)
class Sampling:
    """Per-request decoding options (validated by the caller, which knows the model's defaults)."""

    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    time_limit_s: float = 0.0  # 0 = none


@dataclass(frozen=True)
class Finish:
    """The last event of a sequence."""

    reason: str  # "stop" | "length" | "cancelled" | "time" | "error"
    prompt_tokens: int
    completion_tokens: int
    message: str = ""


@dataclass(eq=False)
class Sequence:
    """One request's generation. `emit(text, finish)` is called with each new piece of text (never a split
    character) and once with a `Finish`; `cancelled()` is polled before every step (with a Responder: by it,
    which sets `gone`)."""

    prompt_ids: list[int]
    sampling: Sampling
    emit: Callable[[str, Finish | None], None]
    cancelled: Callable[[], bool] = lambda: False
    generated: list[int] = field(default_factory=list)
    text: str = ""  # decoded so far (complete characters only)
    sent: int = 0  # characters of `text` already emitted
    started: float = field(default_factory=time.monotonic)
    generator: Any = None
    prefilled: int = 0  # prompt tokens in `past` (a long prompt prefilled in chunks)
    past: Any = None  # its KV cache until the whole prompt is in
    gone: bool = False  # its client left (set by the Responder, which asks Triton)
    pieces: list[str] = field(default_factory=list)  # text waiting for the Responder to send it
    finish: Finish | None = None  # the final event, waiting likewise
    queued: bool = False  # in the Responder's queue
    prefix_offset: int = 0  # incremental detokenisation: `generated[prefix_offset:read_offset]` decodes to what
    read_offset: int = 0  # `text` already ends with (a few tokens of context, so joining spaces come out right)


class Responder:
    """Sends every sequence's text on its own thread, so the batcher never waits for Triton: pieces produced
    while a sequence's previous response is still being sent go out together as one response (a slow send costs
    fewer sends, not a backlog). It also asks Triton whether clients are gone -- after each send, and every
    POLL_S for every open sequence (one waiting for a place gets nothing sent) -- and sets `sequence.gone`, so the
    batcher reads a flag instead of asking Triton for every row at every step. `emit` failing ends that sequence."""

    POLL_S = 0.1

    def __init__(self, log: Callable[[str], None] = print):
        self.log = log
        self.lock = threading.Lock()
        self.open: set[Sequence] = set()
        self.queue: collections.deque[Sequence | None] = collections.deque()
        self.ready = threading.Condition(self.lock)
        self.last_poll = 0.0
        self.thread = threading.Thread(target=self._run, name="hf2triton-responses", daemon=True)
        self.thread.start()

    def watch(self, sequence: Sequence) -> None:
        with self.lock:
            self.open.add(sequence)

    def post(self, sequence: Sequence, text: str, finish: Finish | None = None) -> None:
        with self.lock:
            if text:
                sequence.pieces.append(text)
            if finish is not None:
                sequence.finish = finish
            if sequence.queued or (not sequence.pieces and sequence.finish is None):
                return
            sequence.queued = True
            self.queue.append(sequence)
            self.ready.notify()

    def stop(self) -> None:
        with self.lock:
            self.queue.append(None)
            self.ready.notify()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    self.ready.wait(self.POLL_S)
                sequence = self.queue.popleft() if self.queue else False
                if sequence:
                    text, finish = "".join(sequence.pieces), sequence.finish
                    sequence.pieces.clear()
                    sequence.queued = False
                    if finish is not None:
                        self.open.discard(sequence)
            if sequence is None:
                return
            if sequence:
                self._send(sequence, text, finish)
            if time.monotonic() - self.last_poll > self.POLL_S:
                self._poll()

    def _send(self, sequence: Sequence, text: str, finish: Finish | None) -> None:
        try:
            sequence.emit(text, finish)
            if finish is None and not sequence.gone and sequence.cancelled():
                sequence.gone = True
        except Exception as err:  # noqa: BLE001 - a failed send ends that sequence, not the thread
            self.log(f"hf2triton: sending a response failed: {type(err).__name__}: {err}")
            sequence.gone = True

    def _poll(self) -> None:
        self.last_poll = time.monotonic()
        with self.lock:
            sequences = [s for s in self.open if not s.gone and s.finish is None]
        for sequence in sequences:
            try:
                sequence.gone = bool(sequence.cancelled())
            except Exception:  # noqa: BLE001 - a request Triton no longer knows is gone as well
                sequence.gone = True


def _malloc_trim() -> Callable[[], Any] | None:
    """glibc's malloc_trim(0), which hands freed heap pages back to the system (None elsewhere)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class ContinuousBatcher:
    """A running batch over one model. Thread-safe `submit`; `step()` does one decoding iteration (the
    background loop calls it while there is work; tests call it directly). `max_prefill_tokens`: prompt tokens
    prefilled per step, padding included (None: no bound; the served model passes generation.max_prefill_tokens)."""

    def __init__(
        self,
        model,
        tokenizer,
        device: str,
        max_sequences: int,
        max_queue: int,
        context: int,
        max_prefill_tokens: int | None = None,
        responder: Responder | None = None,
    ):
        import torch

        self.torch, self.model, self.tokenizer, self.device = torch, model, tokenizer, device
        self.max_sequences, self.max_queue, self.context = max_sequences, max_queue, context
        self.max_prefill_tokens = max_prefill_tokens or sys.maxsize
        # the last position's logits only, as generate() asks: a prompt's full logits are tokens x vocabulary floats
        # (8,000 tokens of SmolLM2: 1.6 GB)
        self.last_logits = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        self.trim = _malloc_trim() if device == "cpu" else None
        eos = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
        eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.eos_ids = {int(e) for e in [*eos, tokenizer.eos_token_id] if e is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (min(self.eos_ids) if self.eos_ids else 0)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.partial: Sequence | None = None  # the long prompt being prefilled in chunks (it holds a place)
        self.lock = threading.Condition()
        self.cache = None  # list of (keys, values) per layer, [batch, heads, length, dim], left-padded
        self.mask = None  # [batch, length] 1 = real token
        self.positions = None  # [batch] position id of each row's next token
        self.last = None  # [batch] each row's last token
        self.stopped = False
        self.steps = 0
        self.responder = responder  # None: emit on this thread and ask `cancelled()` directly (in-process use)

    # ------------------------------------------------------------------ requests in

    def submit(self, sequence: Sequence) -> None:
        with self.lock:
            if len(self.waiting) >= self.max_queue:
                self._purge_waiting()  # clients that gave up do not hold places
            if len(self.waiting) >= self.max_queue:
                raise Busy(f"busy: {len(self.waiting)} requests already wait (generation.max_queue = {self.max_queue}); retry later")
            if sequence.sampling.seed is not None:
                sequence.generator = self.torch.Generator(device="cpu").manual_seed(sequence.sampling.seed)
            self.waiting.append(sequence)
            self.lock.notify()
        if self.responder is not None:
            self.responder.watch(sequence)

    def _gone(self, sequence: Sequence) -> bool:
        return sequence.gone if self.responder is not None else sequence.cancelled()

    def _emit(self, sequence: Sequence, text: str, finish: Finish | None = None) -> None:
        if self.responder is not None:
            self.responder.post(sequence, text, finish)
        else:
            sequence.emit(text, finish)

    def _purge_waiting(self) -> None:
        """Finish waiting sequences whose client is gone (caller holds the lock)."""
        gone = [s for s in self.waiting if self._gone(s)]
        for sequence in gone:
            self.waiting.remove(sequence)
            self._finish(sequence, "cancelled")

    def load(self) -> tuple[int, int]:
        with self.lock:
            return len(self.running) + (self.partial is not None), len(self.waiting)

    @property
    def idle(self) -> bool:
        return not (self.running or self.waiting or self.partial)

    # ------------------------------------------------------------------ the loop

    def run_forever(self) -> None:
        """The background loop: wait for work, step while there is any."""
        while True:
            with self.lock:
                while not self.stopped and self.idle:
                    self.lock.wait()
                if self.stopped:
                    return
            self.step()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.lock.notify_all()

    def step(self) -> None:
        """Prefill under the token budget (prompts that fit together, the long one by one more chunk), then one
        decoding step for everyone running: a long prompt holds the running streams up for one chunk at most."""
        self._drop(self._gone, "cancelled")
        if self.partial is not None and self._cancelled_early(self.partial):
            self.partial = None
        with self.lock:
            self._purge_waiting()
            joining, chunk = self._schedule()
        joining = [s for s in joining if not self._cancelled_early(s)]
        with self.torch.inference_mode():
            if chunk:
                self._prefill_chunk(chunk)
            if joining:
                self._prefill(joining)
            if self.running:
                self._decode()
        self.steps += 1
        if self.trim is not None and self.idle:
            # freed caches and activations go back to the system, not just to the heap (SmolLM2, 3 x 1,000-token
            # prompts on the CPU: idle again at 1,185 MB without, 965 MB with, from ~950 MB before them)
            self.trim()

    def _schedule(self) -> tuple[list[Sequence], int]:
        """This step's prefill under `max_prefill_tokens` (caller holds the lock): the short prompts to prefill
        together (padded: a batch costs rows x its longest prompt) and how many tokens of the long one to feed.

        A prompt longer than half the budget is long: the oldest becomes `partial` and is fed alone, chunk by
        chunk, at least half the budget every step until it is in. Short prompts share the rest in arrival
        order (a shorter one before a longer one that does not fit): a short request never waits for a long
        prefill, and a long one is never starved by short ones."""
        budget, room = self.max_prefill_tokens, self.max_sequences - len(self.running)
        half = max(1, budget // 2)
        if self.partial is None and room > 0:
            self.partial = next((s for s in self.waiting if len(s.prompt_ids) > half), None)
            if self.partial is not None:
                self.waiting.remove(self.partial)
        left = len(self.partial.prompt_ids) - self.partial.prefilled if self.partial else 0
        room -= self.partial is not None
        joining: list[Sequence] = []
        width = 0
        for sequence in self.waiting:
            if len(joining) >= room:
                break
            wider = max(width, len(sequence.prompt_ids))
            if wider <= half and (len(joining) + 1) * wider <= budget - min(left, half):
                joining.append(sequence)
                width = wider
        for sequence in joining:
            self.waiting.remove(sequence)
        return joining, min(left, budget - len(joining) * width)

    # ------------------------------------------------------------------ model passes

    def _forward(self, input_ids, mask, positions, cache: list | None):
        """The last position's logits and the grown cache. `cache` is consumed (emptied): its tensors move into
        the model's cache as they are, so a layer's old keys and values are freed as soon as the step has appended
        to them. DynamicCache.from_legacy_cache copies every layer, and a cache still held here would stay until
        the step ends: each a second KV cache at every step's peak (transformers 4.57's layer API)."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        past = DynamicCache()
        for keys, values in cache or ():
            layer = DynamicLayer()
            layer.lazy_initialization(keys)
            layer.keys, layer.values = keys, values
            past.layers.append(layer)
        if cache:
            cache.clear()
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=past, use_cache=True, **self.last_logits
        )
        return out.logits[:, -1, :].float(), [(layer.keys, layer.values) for layer in out.past_key_values.layers]

    def _prefill(self, joining: list[Sequence]) -> None:
        """Prefill the joining prompts together (left-padded), merge them into the running batch and take their
        first token (the decode of the same step then advances every row, old and new)."""
        torch = self.torch
        width = max(len(s.prompt_ids) for s in joining)
        ids = torch.full((len(joining), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(joining), width), dtype=torch.long)
        for row, s in enumerate(joining):
            ids[row, width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids)
            mask[row, width - len(s.prompt_ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(ids.to(self.device), mask.to(self.device), positions.to(self.device), None)
        new_positions = mask.sum(-1).to(self.device)
        self._merge(joining, cache, mask.to(self.device), new_positions)
        self._advance(joining, logits, offset=len(self.running) - len(joining))

    def _prefill_chunk(self, count: int) -> None:
        """Feed the long prompt's next `count` tokens (its KV cache grows by them); with its last chunk it joins
        the running batch and takes its first token."""
        torch, sequence = self.torch, self.partial
        start = sequence.prefilled
        end = start + count
        ids = torch.tensor([sequence.prompt_ids[start:end]], dtype=torch.long, device=self.device)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        positions = torch.arange(start, end, device=self.device)[None]
        logits, sequence.past = self._forward(ids, mask, positions, sequence.past)
        sequence.prefilled = end
        if end < len(sequence.prompt_ids):
            return
        cache, sequence.past, self.partial = sequence.past, None, None
        self._merge([sequence], cache, mask, torch.tensor([end], device=self.device))
        self._advance([sequence], logits, offset=len(self.running) - 1)

    def _decode(self) -> None:
        torch = self.torch
        mask = torch.cat([self.mask, torch.ones((len(self.running), 1), dtype=self.mask.dtype, device=self.device)], dim=1)
        logits, cache = self._forward(self.last[:, None], mask, self.positions[:, None], self.cache)
        self.cache, self.mask, self.positions = cache, mask, self.positions + 1
        self._advance(list(self.running), logits, offset=0)

    def _merge(self, joining: list[Sequence], cache, mask, positions) -> None:
        """Append the prefilled rows to the running batch, left-padding the shorter side's cache."""
        torch = self.torch
        if not self.running:
            self.running, self.cache, self.mask, self.positions = list(joining), cache, mask, positions
            self.last = torch.zeros(len(joining), dtype=torch.long, device=self.device)
            return
        old, new = self.mask.shape[1], mask.shape[1]
        width = max(old, new)

        def pad(tensor, length):  # left-pad dim 2 (cache) / dim 1 (mask) with zeros
            if length == width:
                return tensor
            shape = list(tensor.shape)
            shape[-2 if tensor.dim() == 4 else -1] = width - length
            return torch.cat([tensor.new_zeros(shape), tensor], dim=-2 if tensor.dim() == 4 else -1)

        for index, (k1, v1) in enumerate(cache):  # layer by layer: one old layer at a time next to the merged cache
            k0, v0 = self.cache[index]
            self.cache[index] = (torch.cat([pad(k0, old), pad(k1, new)]), torch.cat([pad(v0, old), pad(v1, new)]))
        self.mask = torch.cat([pad(self.mask, old), pad(mask, new)])
        self.positions = torch.cat([self.positions, positions])
        self.last = torch.cat([self.last, torch.zeros(len(joining), dtype=torch.long, device=self.device)])
        self.running += joining

    def _advance(self, rows: list[Sequence], logits, offset: int) -> None:
        """Pick each row's next token, emit new text, and retire the rows that are done."""
        tokens = self._sample(rows, logits)
        self._set_last(offset, tokens)
        done: dict[int, str] = {}
        for index, (sequence, token) in enumerate(zip(rows, tokens)):
            reason = self._append(sequence, token)
            if reason:
                done[offset + index] = reason
        if done:
            self._retire(done)

    def _set_last(self, offset: int, tokens: list[int]) -> None:
        """The next step's input tokens of rows offset.. (one copy to the device, not one per row)."""
        self.last[offset : offset + len(tokens)] = self.torch.tensor(tokens, dtype=self.last.dtype).to(self.device)

    def _sample(self, rows: list[Sequence], logits) -> list[int]:
        torch = self.torch
        tokens = logits.argmax(-1).tolist()  # greedy rows: the same argmax generate() takes
        for index, sequence in enumerate(rows):
            options = sequence.sampling
            if options.temperature <= 0:
                continue
            scores = logits[index] / options.temperature
            if options.top_k > 0:
                kth = torch.topk(scores, min(options.top_k, scores.shape[-1])).values[-1]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            if options.top_p < 1.0:
                ordered, order = torch.sort(scores, descending=True)
                cumulative = ordered.softmax(-1).cumsum(-1)
                drop = cumulative - ordered.softmax(-1) > options.top_p  # keep the smallest prefix reaching top_p
                scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
            probs = scores.softmax(-1).cpu()
            tokens[index] = int(torch.multinomial(probs, 1, generator=sequence.generator).item())
        return tokens

    # ------------------------------------------------------------------ text out

    def _append(self, sequence: Sequence, token: int) -> str | None:
        """Record a token; emit the complete new text; the finish reason when the sequence is done."""
        options = sequence.sampling
        if token in self.eos_ids:
            return "stop"
        sequence.generated.append(token)
        complete = sequence.text + self._new_text(sequence)
        for stop in options.stop:
            at = complete.find(stop, max(0, sequence.sent - len(stop)))
            if at >= 0:
                sequence.text = complete[:at]
                return "stop"
        sequence.text = complete
        held = max((len(s) - 1 for s in options.stop), default=0)  # a stop string may be arriving
        visible = len(sequence.text) - held
        if visible > sequence.sent:
            self._emit(sequence, sequence.text[sequence.sent : visible])
            sequence.sent = visible
        if len(sequence.generated) >= options.max_new_tokens:
            return "length"
        if len(sequence.prompt_ids) + len(sequence.generated) >= self.context:
            return "length"
        if options.time_limit_s and time.monotonic() - sequence.started > options.time_limit_s:
            return "time"
        return None

    def _new_text(self, sequence: Sequence) -> str:
        """The complete characters the newest tokens add, decoding only the last few tokens (text-generation-
        inference's and vLLM's incremental detokenisation) rather than the whole answer at every token. A split
        multi-byte character waits for its next token."""
        decode, generated = self.tokenizer.decode, sequence.generated
        known = decode(generated[sequence.prefix_offset : sequence.read_offset], skip_special_tokens=True)
        text = decode(generated[sequence.prefix_offset :], skip_special_tokens=True)
        if len(text) <= len(known) or text.endswith(PARTIAL_CHARACTER):
            return ""
        sequence.prefix_offset, sequence.read_offset = sequence.read_offset, len(generated)
        return text[len(known) :]

    def _finish(self, sequence: Sequence, reason: str, message: str = "") -> None:
        sequence.past = None  # a long prompt's cache (the client may hold the sequence a while longer)
        rest = sequence.text[sequence.sent :]
        sequence.sent = len(sequence.text)
        self._emit(sequence, rest, Finish(reason, len(sequence.prompt_ids), len(sequence.generated), message))

    def _cancelled_early(self, sequence: Sequence) -> bool:
        if self._gone(sequence):
            self._finish(sequence, "cancelled")
            return True
        return False

    def _drop(self, predicate: Callable[[Sequence], bool], reason: str) -> None:
        done = {row: reason for row, sequence in enumerate(self.running) if predicate(sequence)}
        if done:
            self._retire(done)

    def _retire(self, done: dict[int, str]) -> None:
        """Finish rows `done` ({row: reason}) and remove them from the batch at once."""
        torch = self.torch
        for row, reason in done.items():
            self._finish(self.running[row], reason)
        keep = [row for row in range(len(self.running)) if row not in done]
        self.running = [self.running[row] for row in keep]
        if not keep:
            self._reset()
            return
        index = torch.tensor(keep, device=self.device)
        mask = self.mask[index]
        first = int((mask.sum(0) > 0).nonzero()[0])  # columns before this are padding in every remaining row
        self.mask = mask[:, first:]
        for layer, (k, v) in enumerate(self.cache):  # in place: one old layer at a time next to the kept rows
            self.cache[layer] = (k[index][:, :, first:], v[index][:, :, first:])
        self.positions, self.last = self.positions[index], self.last[index]

    def fail_all(self, message: str) -> None:
        """A model pass failed: every running and waiting sequence ends with the error (the loop goes on)."""
        with self.lock:
            waiting, self.waiting = list(self.waiting), collections.deque()
        partial = [self.partial] if self.partial is not None else []
        for sequence in [*self.running, *partial, *waiting]:
            self._finish(sequence, "error", message)
        self.running, self.partial = [], None
        self._reset()

    def _reset(self) -> None:
        """The running batch's state, once no row is left."""
        self.cache = self.mask = self.positions = self.last = None


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
        """Copy the prefilled rows (left-padded to the batch's longest prompt) into the next free slots."""
        if not self.slots:
            self._allocate(cache)
        first, lengths = len(self.running), [int(p) for p in positions.tolist()]
        width = cache[0][0].shape[2]
        for index, length in enumerate(lengths):
            slot = first + index
            for (keys, values), (new_keys, new_values) in zip(self.slots, cache):
                keys[slot, :, :length] = new_keys[index, :, width - length :]
                values[slot, :, :length] = new_values[index, :, width - length :]
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
    probe = {"max_sequences": 4, "max_queue": 4, "context": min(limits["context"], 256)}
    prompts = [
        tokenizer("The capital of France is", add_special_tokens=False)["input_ids"],
        tokenizer("1, 2, 3,", add_special_tokens=False)["input_ids"],
    ]
    try:
        expected = _greedy_ids(ContinuousBatcher(model, tokenizer, device, **probe), prompts, 6)
        got = _greedy_ids(SlotBatcher(model, tokenizer, device, cuda_graphs=cuda_graphs, **probe), prompts, 6)
        if got != expected:
            raise ValueError(f"greedy tokens {got} differ from the dynamic cache's {expected}")
    except Exception as err:  # noqa: BLE001 - the dynamic cache still serves
        log(f"hf2triton: generation keeps the dynamic KV cache (the preallocated one failed its probe: {type(err).__name__}: {err})")
        return ContinuousBatcher(model, tokenizer, device, **limits)
    batcher = SlotBatcher(model, tokenizer, device, cuda_graphs=cuda_graphs, **limits)
    graphs = "on" if batcher.use_graphs else "off"
    size = f"{limits['max_sequences']} slots x {limits['context']} tokens"
    log(f"hf2triton: generation on a preallocated KV cache ({size}), CUDA graphs {graphs}")
    return batcher
