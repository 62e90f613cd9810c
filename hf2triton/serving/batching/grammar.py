"""Constrained decoding for the torch batchers (interface.GUIDED) with xgrammar: a request's kind and value become an
xgrammar Grammar (`grammar_of`, also the gateway's check that a schema or grammar compiles), compiled once per distinct
grammar against the model's vocabulary (`Grammars`); every guided sequence gets a GrammarMatcher of its own (`n`
samples too), whose token bitmask masks that row's logits before sampling and which takes each chosen token.

Only sampling sees the mask: log-probabilities are still reported from the raw logits (text.token_logprobs). numpy
and the standard library at import (xgrammar at the first guided request): copied next to model.py into every
streaming torch model; a model whose Python lacks xgrammar refuses guided requests with a message saying so.
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from typing import Any

import numpy as np

from ..inputs import RequestError
from .sequences import Guided, Sequence

# Whitespace characters allowed between JSON tokens (xgrammar's max_whitespace_cnt): enough for pretty-printed JSON,
# while an unbounded run of spaces or newlines is how a small model fails to finish an object.
MAX_WHITESPACE = 16
XGRAMMAR_INSTALL = "pip install --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2"


def xgrammar() -> Any:
    """The xgrammar module, or a RequestError saying how to install it."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise RequestError(f"structured output needs the xgrammar package, which this server's Python lacks ({XGRAMMAR_INSTALL})") from None
    return xgr


def _reason(err: Exception) -> str:
    """xgrammar's message without its '[hh:mm:ss] /project/cpp/file.cc:123: ' prefix."""
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(err).strip()).strip()


def grammar_of(kind: str, value: Any) -> Any:
    """The xgrammar Grammar of a guided request (interface.GUIDED); RequestError naming what xgrammar refuses. JSON
    follows the schema strictly (no properties it does not name, as vLLM's xgrammar backend), json_object is any
    object, a choice is exactly one of its strings."""
    xgr = xgrammar()
    try:
        if kind == "json_schema":
            return xgr.Grammar.from_json_schema(json.dumps(value), max_whitespace_cnt=MAX_WHITESPACE)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', max_whitespace_cnt=MAX_WHITESPACE)
        if kind == "regex":
            return xgr.Grammar.from_regex(value)
        if kind == "choice":  # JSON string literals are EBNF's (\" \\ \n \uXXXX)
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in value))
        return xgr.Grammar.from_ebnf(value)
    except (RuntimeError, ValueError, TypeError) as err:
        raise RequestError(f"the {kind} cannot be used for constrained decoding: {_reason(err)}") from None


def check_guided(guided: Guided) -> None:
    """RequestError when xgrammar cannot compile `guided` (the gateway's check before anything reaches the model)."""
    grammar_of(guided.kind, guided.value)


class Grammars:
    """One batcher's grammars: xgrammar's view of the tokenizer and its compiler (built at the first guided request;
    the compiler caches what it compiled), a matcher per guided sequence, and the mask applied to their logits."""

    def __init__(self, tokenizer: Any, vocabulary: int, stop_ids: set[int]):
        self.tokenizer, self.vocabulary, self.stop_ids = tokenizer, vocabulary, stop_ids
        self.compiler: Any = None
        self.bitmask: Any = None  # the host bitmask every step reuses (_host_bitmask)
        self.kernel: str | None = None  # xgrammar's kernel applying bitmasks to a GPU's logits (the first guided step's)
        self.lock = threading.Lock()

    def matcher(self, guided: Guided) -> Any:
        """A new GrammarMatcher for one sequence (RequestError: the grammar does not compile)."""
        xgr = xgrammar()
        with self.lock:
            if self.compiler is None:
                # the model's end tokens end a complete answer (the batcher finishes the sequence on them)
                stops = sorted(self.stop_ids) or None
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocabulary, stop_token_ids=stops)
                self.compiler = xgr.GrammarCompiler(info, max_threads=2)
        grammar = grammar_of(guided.kind, guided.value)
        try:
            matcher = xgr.GrammarMatcher(self.compiler.compile_grammar(grammar))
        except (RuntimeError, ValueError) as err:
            raise RequestError(f"the {guided.kind} cannot be used for constrained decoding: {_reason(err)}") from None
        bitmask = xgr.allocate_token_bitmask(1, self.vocabulary)
        matcher.fill_next_token_bitmask(bitmask, 0)
        if not bitmask.any():  # e.g. a JSON schema for T5, whose vocabulary has no "{"
            raise RequestError(f"the {guided.kind} cannot start with any token of this model's vocabulary: it cannot write that")
        return matcher

    def mask(self, torch: Any, rows: list[Sequence], logits: Any, copy: bool = True) -> Any:
        """`logits` ([rows, vocabulary]) with every token a guided row's grammar forbids next at -inf; a copy when
        `copy` (the raw logits kept for log-probabilities), else masked in place; `logits` itself when no row is guided.

        The guided rows' bitmasks are filled one by one (an H100 host's 16 cores filled 32 rows in 0.05 ms so, where
        xgrammar's BatchGrammarMatcher took 0.34 ms waking its thread pool) and applied in one pass: numpy's unpacking
        and one masked_fill on the CPU, one xgrammar kernel on a GPU."""
        guided = [index for index, sequence in enumerate(rows) if sequence.matcher is not None]
        if not guided:
            return logits
        xgr = xgrammar()
        on_gpu = logits.device.type != "cpu"
        bitmask = self._host_bitmask(len(rows), pinned=logits.device.type == "cuda")
        for index in guided:  # a guided row's fill writes its whole row; the others' rows are never read
            rows[index].matcher.fill_next_token_bitmask(bitmask, index)
        # a grammar that allows no token of this vocabulary here leaves its row unmasked: `advance` then refuses the
        # token and ends that sequence with an error (an all -inf row cannot be sampled and would fail the batch)
        dead = ~bitmask.any(-1)
        if dead.any():
            bitmask[dead] = -1
        scores = logits.clone() if copy else logits
        width = min(scores.shape[-1], self.vocabulary)
        if not on_gpu:
            _mask_on_cpu(torch, scores, bitmask, guided, width)
        else:  # one xgrammar kernel (Triton's where the triton package is installed, as vLLM applies it)
            if self.kernel is None:  # looked up once: not a search of sys.path at every step
                self.kernel = "triton" if scores.device.type == "cuda" and importlib.util.find_spec("triton") else "torch_native"
            # every row guided: no row indices (a list becomes a tensor copied up at every step)
            indices = None if len(guided) == len(rows) else guided
            # the copy up is asynchronous from pinned memory; the buffer is written again only after this step's
            # sampling has waited for the GPU (argmax().tolist()), so the copy has long been done
            device_bitmask = bitmask.to(scores.device, non_blocking=True)
            xgr.apply_token_bitmask_inplace(scores, device_bitmask, vocab_size=width, indices=indices, backend=self.kernel)
        if scores.shape[-1] > width:  # logits wider than the vocabulary xgrammar knows: the padding is never allowed
            scores[guided, width:] = float("-inf")
        return scores

    def _host_bitmask(self, rows: int, pinned: bool) -> Any:
        """xgrammar's int32 [rows, words] bitmask (bit i = token i allowed), one buffer reused at every step: a new
        tensor per step (196 KB for 32 rows of SmolLM2's vocabulary, beyond malloc's mmap threshold) was an mmap and
        a munmap each; `pinned` (a GPU's logits): page-locked, so the copy up is a DMA the kernel waits for."""
        if self.bitmask is None or self.bitmask.shape[0] < rows:
            size = max(rows, 2 * (0 if self.bitmask is None else self.bitmask.shape[0]))
            bitmask = xgrammar().allocate_token_bitmask(size, self.vocabulary)
            self.bitmask = bitmask.pin_memory() if pinned else bitmask
        return self.bitmask[:rows]

    @staticmethod
    def advance(sequence: Sequence, token: int) -> str | None:
        """The matcher takes the chosen token, before its text is recorded: "stop" once the grammar is done (the model's
        end token), "error" when the grammar allowed no token at all (`sequence.error` says so)."""
        matcher = sequence.matcher
        if matcher is None:
            return None
        if not matcher.accept_token(token):
            kind = sequence.sampling.guided.kind
            sequence.error = f"the {kind} allows no token of this model's vocabulary after {sequence.text[-40:]!r}: it cannot write that"
            return "error"
        return "stop" if matcher.is_terminated() else None


def _mask_on_cpu(torch: Any, scores: Any, bitmask: Any, guided: list[int], width: int) -> None:
    """The bitmask applied to CPU logits in place: unpacked by numpy (bit i of a little-endian int32 word is token
    32 * word + i), then one masked_fill -- 32 rows x SmolLM2's 49,152 tokens in ~1.5 ms on 2 cores, where xgrammar's
    own CPU kernel takes ~7 ms."""
    allowed = torch.from_numpy(np.unpackbits(bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")[:, :width].view(bool))
    if len(guided) == scores.shape[0]:
        scores[:, :width].masked_fill_(~allowed, float("-inf"))
        return
    index = torch.tensor(guided)
    scores[index, :width] = scores[index, :width].masked_fill(~allowed[index], float("-inf"))
