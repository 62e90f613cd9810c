"""What a streaming request is to a batcher (the torch continuous batcher or vLLM's runtime): its decoding options
(`Sampling`), its state (`Sequence`), its last event (`Finish`), and `Busy` when no place is left. Standard library
only: copied next to model.py into every rendered model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PARTIAL_CHARACTER = "\ufffd"


class Busy(Exception):
    """The waiting queue is full: the request is refused at once (retry later)."""


@dataclass(frozen=True)
class Guided:
    """Constrained decoding (interface.GUIDED): `kind` one of interface.GUIDED_KINDS, `value` its JSON value (a schema,
    None, a regex, a list of choices, an EBNF grammar), checked by inputs.guided_option."""

    kind: str
    value: Any = None


@dataclass(frozen=True)
class Sampling:
    """Per-request decoding options (validated by the caller, which knows the model's defaults)."""

    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    presence_penalty: float = 0.0  # OpenAI's, on the answer's tokens (interface.PRESENCE_PENALTY); 0 = none
    frequency_penalty: float = 0.0
    ignore_eos: bool = False  # go on past the end token (interface.IGNORE_EOS)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    time_limit_s: float = 0.0  # 0 = none
    logprobs: int = -1  # alternatives reported per chosen token (interface.LOGPROBS); -1: no log-probabilities
    prompt_logprobs: bool = False  # the prompt's tokens' log-probabilities too (max_new_tokens may then be 0)
    guided: Guided | None = None  # the grammar every generated token must follow (None: free)

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs >= 0 or self.prompt_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """A token and its log-probability under the model's raw distribution (None: a prompt's first token), with the
    `top` alternatives (id, log-probability), most likely first."""

    id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


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
    text: str = ""  # decoded so far (complete characters only; cleaned up, where the tokenizer cleans up: text.Detokenizer)
    raw: str = ""  # where text.Detokenizer cleans up: the text before its clean-up
    clean_split: int = 0  # of `raw`: the characters before it are cleaned up for good (in `clean_head`)
    clean_head: str = ""
    decode_stream: Any = None  # its incremental decoder, where text.Detokenizer has one
    sent: int = 0  # characters of `text` already emitted
    started: float = field(default_factory=time.monotonic)
    generator: Any = None
    prefilled: int = 0  # prompt tokens in `past` (a long prompt prefilled in chunks)
    past: Any = None  # its KV cache until the whole prompt is in
    gone: bool = False  # its client left (set by the Responder, which asks Triton)
    pieces: list[str] = field(default_factory=list)  # text waiting for the Responder to send it
    finish: Finish | None = None  # the final event, waiting likewise
    queued: bool = False  # in the Responder's queue
    first_sent: bool = False  # its first response was taken (take_pending)
    prefix_offset: int = 0  # incremental detokenisation: `generated[prefix_offset:read_offset]` decodes to what
    read_offset: int = 0  # `text` already ends with (a few tokens of context, so joining spaces come out right)
    prompt_logprobs: list[TokenLogprob] | None = None  # set by the prefill when asked, until it is sent
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the chosen tokens' (EOS included), when asked
    logprobs_sent: int = 0  # of `logprobs`, those already in a response
    logprobs_cut: int | None = None  # of `logprobs`, those made with its first piece: where the next response's end
    # when that piece goes alone (take_pending)
    matcher: Any = None  # a guided sequence's xgrammar GrammarMatcher (torch batchers; batching/grammar.py)
    error: str = ""  # why it ends with finish reason "error", when the batcher ends it so (its grammar's dead end)

    def take_logprobs(self, decode: Callable[..., str]) -> str:
        """The next response's interface.TOKEN_LOGPROBS (JSON): the prompt's log-probabilities (once) and those of the
        tokens chosen since the previous response (the batcher may be a token ahead of the text, whose end can be held
        back); each token as the tokenizer's `decode` writes it alone, special ones too."""
        prompt, self.prompt_logprobs = self.prompt_logprobs, None
        end = len(self.logprobs) if self.logprobs_cut is None else self.logprobs_cut
        self.logprobs_cut = None
        chosen, self.logprobs_sent = self.logprobs[self.logprobs_sent : end], end

        def entry(item: TokenLogprob) -> dict[str, Any]:
            top = [{"id": i, "token": decode([i]), "logprob": logprob} for i, logprob in item.top]
            return {"id": item.id, "token": decode([item.id]), "logprob": item.logprob, "top": top}

        payload: dict[str, Any] = {"tokens": [entry(item) for item in chosen]}
        if prompt is not None:
            payload["prompt"] = [entry(item) for item in prompt]
            payload["prompt_text"] = decode(self.prompt_ids)
        return json.dumps(payload, ensure_ascii=False)


def add_pending(item: Any, text: str, finish: Finish | None) -> bool:
    """Add a piece of text (and, at the end, the finish) to what `item` (a Sequence, or vLLM's stream) waits to
    have sent; True when it must join the response threads' queue (it is neither there nor being sent). Pieces
    added while it waits or while its last response is being sent go out together as one response. The caller
    holds its lock."""
    if text:
        if not item.pieces and not item.first_sent:  # its first piece: the log-probabilities it goes with
            sequence = getattr(item, "sequence", item)  # a Sequence, or vLLM's stream of one
            sequence.logprobs_cut = len(sequence.logprobs)
        item.pieces.append(text)
    if finish is not None:
        item.finish = finish
    if item.queued or (not item.pieces and item.finish is None):
        return False
    item.queued = True
    return True


def take_pending(item: Any) -> tuple[str, Finish | None]:
    """What `item` waits to have sent, taken by the response thread that sends it; it stays `queued` (in flight: no
    other thread sends for it) until `after_send`. The first response carries the first piece alone (the rest, and the
    finish, follow at once): a client's time to first token is that piece's, and an answer is never one response
    because the response thread was slow to start (2 loaded cores: a tiny model's 24 tokens came as one response and
    validation's stream check failed). The caller holds its lock."""
    first, item.first_sent = not item.first_sent, True
    if first and len(item.pieces) > 1:
        return item.pieces.pop(0), None  # with the log-probabilities made with it (Sequence.logprobs_cut)
    if first:
        getattr(item, "sequence", item).logprobs_cut = None  # the whole text so far: all its log-probabilities
    text = "".join(item.pieces)
    item.pieces.clear()
    return text, item.finish


def client_gone(ask: Callable[[], bool]) -> bool:
    """`ask()` (a request's is_cancelled), a request Triton no longer knows counting as gone."""
    try:
        return bool(ask())
    except Exception:  # noqa: BLE001 - a request Triton no longer knows is gone as well
        return True


def ask_if_gone(item: Any, lock: Any, ask: Callable[[], bool], requeue: Callable[[Any], None]) -> bool:
    """Ask Triton (`ask`: the request's is_cancelled) whether `item`'s client is gone, holding the item as a send
    does: never while one of its responses is in flight, never after its final one. python_backend deletes a
    request's response factory with its final response and answers is_cancelled through that factory's address, so
    asking then makes tritonserver read freed memory: with 4 response threads and 32 short streams the server died
    within seconds (2 cores, a tiny model; on the H200 every request failed). False when it was not asked (queued,
    being sent or finished: its sends answer for it). Pieces added while it was asked go out next (`requeue`, called
    under `lock`)."""
    with lock:
        if item.queued or item.finish is not None:
            return False
        item.queued = True
    try:
        return client_gone(ask)
    finally:
        with lock:
            if after_send(item, False):
                requeue(item)


def after_send(item: Any, sent_final: bool) -> bool:
    """Its response went out: True when more arrived meanwhile (it goes back to the queue, still `queued`), else it
    leaves the queue. The caller holds its lock."""
    item.queued = not sent_final and bool(item.pieces or item.finish is not None)
    return item.queued
