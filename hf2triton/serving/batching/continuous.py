"""Continuous (iteration-level) batching for a transformers causal LM, without Triton: sequences join the
running batch at the next decoding step and leave the moment they finish or their client is gone.

The model.py of a text-generation model runs one batcher per instance on a background thread (this one, or on a
GPU its preallocated-cache subclass: slots.py);
`execute()` only parses requests and submits `Sequence`s (vllm_backend's shape). Like text-generation-
inference's Python server for plain transformers models, the running batch is one left-padded KV cache:
a joining prefill is padded to the batch's length, a leaving row is dropped, and columns no row needs any
more are trimmed. Attention masks and explicit position ids make every row compute what it would alone.

Prefill is bounded per step (`max_prefill_tokens`, vLLM's max_num_batched_tokens): prompts that fit are
prefilled together, a longer one alone in chunks with its KV cache growing per chunk (chunked prefill), and
every step still decodes the running batch. Unbounded, three 8,000-token prompts joining at once took a CPU
stub from 2.1 to 9.8 GB and froze running streams for 30 s (issue 24 #11).

Standard library + torch (imported when a batcher starts): copied next to model.py into every streaming torch model.
"""

from __future__ import annotations

import collections
import ctypes
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import interface
from .grammar import Grammars
from .responder import Responder
from .sequences import Busy, Finish, Sequence, TokenLogprob
from .settings import StepSettings
from .text import append_token, detokenizer, eos_token_ids, penalized, sample_tokens, token_logprobs


def _malloc_trim() -> Callable[[], Any] | None:
    """glibc's malloc_trim(0), which hands freed heap pages back to the system (None elsewhere)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def windowed_attention(config: Any) -> bool:
    """Whether some layer attends to a window of recent tokens only (sliding-window or chunked layers: Mistral's,
    Gemma's, Llama 4's), whose masks differ from the full causal one."""
    if getattr(config, "use_sliding_window", True) and getattr(config, "sliding_window", None):
        return True
    if getattr(config, "attention_chunk_size", None):
        return True
    return any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ())


def full_causal_attention(config: Any) -> bool:
    """Whether every layer of the model attends, through SDPA, to all the real tokens up to its own: the mask
    ContinuousBatcher builds itself. Not windowed layers, not another attention implementation (eager adds a float
    mask, flash attention takes the 2-D one)."""
    return getattr(config, "_attn_implementation", None) == "sdpa" and not windowed_attention(config)


def causal_mask(torch: Any, mask: Any, length: int) -> Any:
    """The 4-D boolean mask transformers builds for SDPA from a 2-D one (`mask` [rows, columns], 1 = a real token)
    for the last `length` columns' tokens: [rows, 1, length, columns], a token sees the real columns up to its own."""
    columns = mask.shape[1]
    keys = torch.arange(columns, device=mask.device)
    return (keys[None, :] <= keys[columns - length :, None])[None, None] & mask[:, None, None, :].bool()


def dynamic_cache(layers: list | None):
    """transformers' DynamicCache holding `layers` ((keys, values) per layer) as they are, without a copy; the list
    is emptied, so the caller holds no second reference to a layer the model replaces."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    past = DynamicCache()
    for keys, values in layers or ():
        layer = DynamicLayer()
        layer.lazy_initialization(keys)
        layer.keys, layer.values = keys, values
        past.layers.append(layer)
    if layers:
        layers.clear()
    return past


def _vocabulary(model, tokenizer) -> int:
    """The width of the model's logits (the output embedding's rows; at least the tokenizer's tokens)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    rows = output.weight.shape[0] if output is not None and hasattr(output, "weight") else 0
    if not rows:  # a runtime without torch modules (ONNX Runtime): its config's vocabulary
        rows = getattr(getattr(model, "config", None), "vocab_size", 0) or 0
    return max(int(rows), len(tokenizer))


class ContinuousBatcher:
    """A running batch over one model. Thread-safe `submit`; `step()` does one decoding iteration (the
    background loop calls it while there is work; tests call it directly). `max_prefill_tokens`: prompt tokens
    prefilled per step, padding included (None: no bound; the served model passes generation.max_prefill_tokens).

    `right_padded`: where a row's tokens sit in the batch's columns. Left-padded (the default), every row ends at
    the last column, so a step appends one column for all. Right-padded, every row starts at column 0 and a
    row's new token goes to its own column (its position): what ONNX Runtime's GroupQueryAttention reads from a
    mask (batching/onnx.py)."""

    right_padded = False

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
        settings: StepSettings | None = None,
    ):
        import torch

        self.torch, self.model, self.tokenizer, self.device = torch, model, tokenizer, device
        self.max_sequences, self.max_queue, self.context = max_sequences, max_queue, context
        self.max_prefill_tokens = max_prefill_tokens or sys.maxsize
        # the last position's logits only, as generate() asks: a prompt's full logits are tokens x vocabulary floats
        # (8,000 tokens of SmolLM2: 1.6 GB)
        forward = getattr(model, "forward", None)  # none: ONNX Runtime (batching/onnx.py)
        keeps = forward is not None and "logits_to_keep" in inspect.signature(forward).parameters
        self.last_logits = {"logits_to_keep": 1} if keeps else {}
        self.trim = _malloc_trim() if device == "cpu" else None
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.detokenizer = detokenizer(tokenizer)  # tokens to text, a stream's pieces adding up to the whole answer's
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
        self.grammars = Grammars(tokenizer, _vocabulary(model, tokenizer), self.eos_ids)  # constrained decoding
        # the checkpoint's per-step settings (repetition penalty, n-gram blocking, forced tokens...) as generate() applies them
        self.settings = settings
        # a padded batch's 4-D mask built here (causal_mask) instead of by transformers' builder, a vmap over its mask
        # functions: ~1.9 ms per pass on 2 CPU cores (SmolLM2, 8 rows: 1.06x the tokens/s, benchmarks/probes/own_masks.py)
        # probed only where this class's _forward, the one that reads it, runs the passes (not seq2seq's, not ONNX's)
        self.own_masks = type(self)._forward is ContinuousBatcher._forward and self._own_masks_agree()

    # ------------------------------------------------------------------ requests in

    def submit(self, sequence: Sequence) -> None:
        """Queue a sequence (Busy: the queue is full; RequestError: its grammar does not compile)."""
        if sequence.sampling.guided is not None and sequence.matcher is None:
            sequence.matcher = self.grammars.matcher(sequence.sampling.guided)
        with self.lock:
            if len(self.waiting) >= self.max_queue:
                self._purge_waiting(ask=True)  # clients that gave up do not hold places
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

    def _purge_waiting(self, ask: bool = False) -> None:
        """Finish waiting sequences whose client is gone (caller holds the lock). `ask`: ask Triton about each now
        rather than read the flag the Responder sets every POLL_S (a full queue refuses the next request on it)."""
        if ask and self.responder is not None:
            for sequence in self.waiting:
                sequence.gone = sequence.gone or self.responder.ask(sequence)
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
        with self.torch.inference_mode():  # a preallocated cache (slots.py) is moved in place: inference tensors
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

    def _forward(self, input_ids, mask, positions, cache: list | None, every_position: bool = False):
        """The last position's logits (`every_position`: every position's, for a prompt's log-probabilities) and the
        grown cache. `cache` is consumed (emptied): its tensors move into
        the model's cache as they are, so a layer's old keys and values are freed as soon as the step has appended
        to them. DynamicCache.from_legacy_cache copies every layer, and a cache still held here would stay until
        the step ends: each a second KV cache at every step's peak (transformers 4.57's layer API)."""
        past = dynamic_cache(cache)
        keep = {} if every_position else self.last_logits
        # without padding transformers passes SDPA no mask at all (is_causal), which is faster: its own check, cheap
        attention = causal_mask(self.torch, mask, input_ids.shape[1]) if self.own_masks and not bool(mask.all()) else mask
        inputs = {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions}
        out = self.model(**inputs, past_key_values=past, use_cache=True, **keep)
        logits = out.logits.float() if every_position else out.logits[:, -1, :].float()
        return logits, [(layer.keys, layer.values) for layer in out.past_key_values.layers]

    def _own_masks_agree(self) -> bool:
        """Whether the model answers a left-padded probe batch the same with causal_mask's 4-D mask as with its own
        (a model of full causal SDPA attention only; any error or difference: its own)."""
        torch, model = self.torch, self.model
        if not full_causal_attention(getattr(model, "config", None)):
            return False
        try:
            ids = self.tokenizer("The capital of France is a city", add_special_tokens=False)["input_ids"][:6]
            rows = torch.tensor([ids, [self.pad_id] * 2 + ids[:-2]], device=self.device)
            mask = torch.tensor([[1] * len(ids), [0] * 2 + [1] * (len(ids) - 2)], device=self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            with torch.inference_mode():
                theirs, ours = (
                    model(input_ids=rows, attention_mask=m, position_ids=positions, use_cache=False).logits.float()[mask.bool()]
                    for m in (mask, causal_mask(torch, mask, len(ids)))
                )
            tolerance = 1e-4 if getattr(model, "dtype", None) == torch.float32 else 2e-2
            return bool(torch.allclose(ours, theirs, rtol=tolerance, atol=tolerance))
        except Exception:  # noqa: BLE001 - a model this probe cannot drive builds its own masks
            return False

    def _prefill(self, joining: list[Sequence]) -> None:
        """Prefill the joining prompts together (left-padded), merge them into the running batch and take their
        first token (the decode of the same step then advances every row, old and new). Identical prompts (an OpenAI
        request's `n` samples arrive as n sequences of one prompt) are prefilled once: their rows of the cache and
        logits are copies of that one row."""
        torch = self.torch
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(s.prompt_ids), len(distinct)) for s in joining]  # each sequence's prefilled row
        prompts = list(distinct)
        width = max(len(prompt) for prompt in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        starts = [0 if self.right_padded else width - len(prompt) for prompt in prompts]  # each row's first column
        for row, (prompt, start) in enumerate(zip(prompts, starts)):
            ids[row, start : start + len(prompt)] = torch.tensor(prompt)
            mask[row, start : start + len(prompt)] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        echo = any(s.sampling.prompt_logprobs for s in joining)  # only then every position's logits (tokens x vocabulary)
        logits, cache = self._forward(ids.to(self.device), mask.to(self.device), positions.to(self.device), None, every_position=echo)
        if echo:
            for row, s in zip(rows, joining):
                if s.sampling.prompt_logprobs:
                    self._record_prompt_logprobs(s, logits[row, starts[row] : starts[row] + len(s.prompt_ids)], 0)
            ends = [start + len(prompt) - 1 for prompt, start in zip(prompts, starts)]
            logits = logits[torch.arange(len(prompts)), torch.tensor(ends)]
        mask = mask.to(self.device)
        if len(prompts) < len(joining):  # one row per sequence again
            index = torch.tensor(rows, device=self.device)
            logits, mask = logits[index], mask[index]
            cache = [(keys[index], values[index]) for keys, values in cache]
        self._merge(joining, cache, mask, mask.sum(-1))
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
        echo = sequence.sampling.prompt_logprobs
        logits, sequence.past = self._forward(ids, mask, positions, sequence.past, every_position=echo)
        if echo:
            self._record_prompt_logprobs(sequence, logits[0], start)
            logits = logits[:, -1]
        sequence.prefilled = end
        if end < len(sequence.prompt_ids):
            return
        cache, sequence.past, self.partial = sequence.past, None, None
        self._merge([sequence], cache, mask, torch.tensor([end], device=self.device))
        self._advance([sequence], logits, offset=len(self.running) - 1)

    def _decode(self) -> None:
        torch = self.torch
        column = (torch.zeros if self.right_padded else torch.ones)((len(self.running), 1), dtype=self.mask.dtype, device=self.device)
        mask = torch.cat([self.mask, column], dim=1)
        if self.right_padded:  # each row's new token at its own position
            mask[torch.arange(len(self.running), device=self.device), self.positions] = 1
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

        def pad(tensor, length):  # pad dim 2 (cache) / dim 1 (mask) with zeros, on the left (or right) of the tokens
            if length == width:
                return tensor
            shape = list(tensor.shape)
            shape[-2 if tensor.dim() == 4 else -1] = width - length
            parts = [tensor, tensor.new_zeros(shape)] if self.right_padded else [tensor.new_zeros(shape), tensor]
            return torch.cat(parts, dim=-2 if tensor.dim() == 4 else -1)

        for index, (k1, v1) in enumerate(cache):  # layer by layer: one old layer at a time next to the merged cache
            k0, v0 = self.cache[index]
            self.cache[index] = (torch.cat([pad(k0, old), pad(k1, new)]), torch.cat([pad(v0, old), pad(v1, new)]))
        self.mask = torch.cat([pad(self.mask, old), pad(mask, new)])
        self.positions = torch.cat([self.positions, positions])
        self.last = torch.cat([self.last, torch.zeros(len(joining), dtype=torch.long, device=self.device)])
        self.running += joining

    def _record_prompt_logprobs(self, sequence: Sequence, logits, start: int) -> None:
        """The log-probabilities of the prompt's tokens that `logits` (those of prompt positions start.., each
        predicting the next token) predict; the first token has none."""
        ids = sequence.prompt_ids
        targets = ids[start + 1 : start + 1 + logits.shape[0]]
        known = [TokenLogprob(ids[0], None)] if start == 0 else []
        tops = [max(sequence.sampling.logprobs, 0)] * len(targets)
        found = token_logprobs(self.torch, logits[: len(targets)], targets, tops) if targets else []
        sequence.prompt_logprobs = (sequence.prompt_logprobs or []) + known + found

    def _advance(self, rows: list[Sequence], logits, offset: int) -> None:
        """Pick each row's next token (a guided row's within its grammar; log-probabilities, for rows that asked, from
        the raw logits), emit new text, and retire the rows that are done."""
        chosen_from = logits if self.settings is None else self.settings.apply(self.torch, rows, logits, self._decoder_ids)
        chosen_from = penalized(self.torch, rows, chosen_from)
        asked = [index for index, sequence in enumerate(rows) if sequence.sampling.logprobs >= 0]
        copy = chosen_from is logits and bool(asked)  # the raw logits kept for the log-probabilities
        tokens = sample_tokens(self.torch, rows, self.grammars.mask(self.torch, rows, chosen_from, copy))
        self._set_last(offset, tokens)
        if asked:  # the other rows cost nothing: no log-softmax over their vocabulary
            chosen = [tokens[index] for index in asked]
            found = token_logprobs(self.torch, logits[asked], chosen, [rows[index].sampling.logprobs for index in asked])
            for index, item in zip(asked, found):
                if rows[index].sampling.max_new_tokens:
                    rows[index].logprobs.append(item)
        done: dict[int, str] = {}
        pieces: list[tuple[Sequence, str]] = []  # the step's new text, posted at once (Responder.post_many)

        def collect(sequence: Sequence, text: str) -> None:
            pieces.append((sequence, text))

        for index, (sequence, token) in enumerate(zip(rows, tokens)):
            if not sequence.sampling.max_new_tokens:  # the prompt's log-probabilities only (an echo): nothing generated
                done[offset + index] = "length"
                continue
            try:
                reason = self.grammars.advance(sequence, token)  # a guided row's grammar takes the token first
                if reason != "error":
                    reason = append_token(sequence, token, self.eos_ids, self.context, self.detokenizer, collect) or reason
            except Exception as err:  # noqa: BLE001 - this row's text or grammar failed: it ends, the batch goes on
                sequence.error, reason = f"{interface.INTERNAL_ERROR}generation failed: {type(err).__name__}: {err}", "error"
                print(f"hf2triton: {sequence.error}", file=sys.stderr, flush=True)  # the server log
            if reason:
                done[offset + index] = reason
        if self.responder is not None:
            self.responder.post_many(pieces)
        else:
            for sequence, text in pieces:
                sequence.emit(text, None)
        if done:
            self._retire(done)

    def _decoder_ids(self, sequence: Sequence) -> tuple[list[int], int]:
        """What generate()'s logits processors see of a row: its tokens so far and how many were the prompt."""
        return [*sequence.prompt_ids, *sequence.generated], len(sequence.prompt_ids)

    def _set_last(self, offset: int, tokens: list[int]) -> None:
        """The next step's input tokens of rows offset.. (one copy to the device, not one per row)."""
        self.last[offset : offset + len(tokens)] = self.torch.tensor(tokens, dtype=self.last.dtype).to(self.device)

    # ------------------------------------------------------------------ the end of a sequence

    def _finish(self, sequence: Sequence, reason: str, message: str = "") -> None:
        sequence.past = None  # a long prompt's cache (the client may hold the sequence a while longer)
        rest = sequence.text[sequence.sent :]
        sequence.sent = len(sequence.text)
        message = message or sequence.error
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
        used = (mask.sum(0) > 0).nonzero()  # columns outside first..end are padding in every remaining row
        first, end = (0, int(used[-1]) + 1) if self.right_padded else (int(used[0]), mask.shape[1])
        self.mask = mask[:, first:end]
        for layer, (k, v) in enumerate(self.cache):  # in place: one old layer at a time next to the kept rows
            self.cache[layer] = (k[index][:, :, first:end], v[index][:, :, first:end])
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
