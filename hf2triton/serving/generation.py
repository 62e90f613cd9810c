"""Continuous (iteration-level) batching for a transformers causal LM, without Triton: sequences join the
running batch at the next decoding step and leave the moment they finish or their client is gone.

The model.py of a text-generation model runs one `ContinuousBatcher` per instance on a background thread;
`execute()` only parses requests and submits `Sequence`s (vllm_backend's shape). Like text-generation-
inference's Python server for plain transformers models, the running batch is one left-padded KV cache:
a joining prefill is padded to the batch's length, a leaving row is dropped, and columns no row needs any
more are trimmed. Attention masks and explicit position ids make every row compute what it would alone.

Standard library + torch only: copied next to model.py into every rendered generation model.
"""

from __future__ import annotations

import collections
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
    character) and once with a `Finish`; `cancelled()` is polled before every step."""

    prompt_ids: list[int]
    sampling: Sampling
    emit: Callable[[str, Finish | None], None]
    cancelled: Callable[[], bool] = lambda: False
    generated: list[int] = field(default_factory=list)
    text: str = ""  # decoded so far (complete characters only)
    sent: int = 0  # characters of `text` already emitted
    started: float = field(default_factory=time.monotonic)
    generator: Any = None


class ContinuousBatcher:
    """A running batch over one model. Thread-safe `submit`; `step()` does one decoding iteration (the
    background loop calls it while there is work; tests call it directly)."""

    def __init__(self, model, tokenizer, device: str, max_sequences: int, max_queue: int, context: int):
        import torch

        self.torch, self.model, self.tokenizer, self.device = torch, model, tokenizer, device
        self.max_sequences, self.max_queue, self.context = max_sequences, max_queue, context
        eos = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
        eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.eos_ids = {int(e) for e in [*eos, tokenizer.eos_token_id] if e is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (min(self.eos_ids) if self.eos_ids else 0)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.lock = threading.Condition()
        self.cache = None  # legacy tuple of (keys, values) per layer, [batch, heads, length, dim], left-padded
        self.mask = None  # [batch, length] 1 = real token
        self.positions = None  # [batch] position id of each row's next token
        self.last = None  # [batch] each row's last token
        self.stopped = False
        self.steps = 0

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

    def _purge_waiting(self) -> None:
        """Finish waiting sequences whose client is gone (caller holds the lock)."""
        gone = [s for s in self.waiting if s.cancelled()]
        for sequence in gone:
            self.waiting.remove(sequence)
            self._finish(sequence, "cancelled")

    def load(self) -> tuple[int, int]:
        with self.lock:
            return len(self.running), len(self.waiting)

    # ------------------------------------------------------------------ the loop

    def run_forever(self) -> None:
        """The background loop: wait for work, step while there is any."""
        while True:
            with self.lock:
                while not self.stopped and not self.waiting and not self.running:
                    self.lock.wait()
                if self.stopped:
                    return
            self.step()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.lock.notify_all()

    def step(self) -> None:
        """Admit waiting sequences (one batched prefill), then one decoding step for everyone running."""
        self._drop(lambda s: s.cancelled(), "cancelled")
        with self.lock:
            self._purge_waiting()
            room = self.max_sequences - len(self.running)
            joining = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        joining = [s for s in joining if not self._cancelled_early(s)]
        with self.torch.inference_mode():
            if joining:
                self._prefill(joining)
            if self.running:
                self._decode()
        self.steps += 1

    # ------------------------------------------------------------------ model passes

    def _forward(self, input_ids, mask, positions, cache):
        from transformers import DynamicCache

        past = DynamicCache.from_legacy_cache(cache) if cache is not None else DynamicCache()
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=past, use_cache=True)
        return out.logits[:, -1, :].float(), out.past_key_values.to_legacy_cache()

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

        self.cache = tuple(
            (torch.cat([pad(k0, old), pad(k1, new)]), torch.cat([pad(v0, old), pad(v1, new)]))
            for (k0, v0), (k1, v1) in zip(self.cache, cache)
        )
        self.mask = torch.cat([pad(self.mask, old), pad(mask, new)])
        self.positions = torch.cat([self.positions, positions])
        self.last = torch.cat([self.last, torch.zeros(len(joining), dtype=torch.long, device=self.device)])
        self.running += joining

    def _advance(self, rows: list[Sequence], logits, offset: int) -> None:
        """Pick each row's next token, emit new text, and retire the rows that are done."""
        tokens = self._sample(rows, logits)
        done: dict[int, str] = {}
        for index, (sequence, token) in enumerate(zip(rows, tokens)):
            row = offset + index
            self.last[row] = token
            reason = self._append(sequence, token)
            if reason:
                done[row] = reason
        if done:
            self._retire(done)

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
        text = self.tokenizer.decode(sequence.generated, skip_special_tokens=True)
        complete = text.rstrip(PARTIAL_CHARACTER)  # a split multi-byte character waits for its next token
        for stop in options.stop:
            at = complete.find(stop, max(0, sequence.sent - len(stop)))
            if at >= 0:
                sequence.text = complete[:at]
                return "stop"
        sequence.text = complete
        held = max((len(s) - 1 for s in options.stop), default=0)  # a stop string may be arriving
        visible = len(sequence.text) - held
        if visible > sequence.sent:
            sequence.emit(sequence.text[sequence.sent : visible], None)
            sequence.sent = visible
        if len(sequence.generated) >= options.max_new_tokens:
            return "length"
        if len(sequence.prompt_ids) + len(sequence.generated) >= self.context:
            return "length"
        if options.time_limit_s and time.monotonic() - sequence.started > options.time_limit_s:
            return "time"
        return None

    def _finish(self, sequence: Sequence, reason: str, message: str = "") -> None:
        rest = sequence.text[sequence.sent :]
        sequence.sent = len(sequence.text)
        sequence.emit(rest, Finish(reason, len(sequence.prompt_ids), len(sequence.generated), message))

    def _cancelled_early(self, sequence: Sequence) -> bool:
        if sequence.cancelled():
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
            self.cache = self.mask = self.positions = self.last = None
            return
        index = torch.tensor(keep, device=self.device)
        mask = self.mask[index]
        first = int((mask.sum(0) > 0).nonzero()[0])  # columns before this are padding in every remaining row
        self.mask = mask[:, first:]
        self.cache = tuple((k[index][:, :, first:], v[index][:, :, first:]) for k, v in self.cache)
        self.positions, self.last = self.positions[index], self.last[index]

    def fail_all(self, message: str) -> None:
        """A model pass failed: every running and waiting sequence ends with the error (the loop goes on)."""
        with self.lock:
            waiting, self.waiting = list(self.waiting), collections.deque()
        for sequence in [*self.running, *waiting]:
            self._finish(sequence, "error", message)
        self.running = []
        self.cache = self.mask = self.positions = self.last = None
