"""Constrained decoding for the torch batchers (interface.GUIDED) with xgrammar: a request's kind and value become an
xgrammar Grammar (`grammar_of`, also the gateway's check that a schema or grammar compiles), compiled once per distinct
grammar against the model's vocabulary (`Grammars`); every guided sequence gets a GrammarMatcher of its own (`n`
samples too), whose token bitmask masks that row's logits before sampling and which takes each chosen token.

Only sampling sees the mask: log-probabilities are still reported from the raw logits (text.token_logprobs).
Standard library at import (xgrammar is imported at the first guided request): copied next to model.py into every
streaming torch model; a model whose Python lacks xgrammar refuses guided requests with a message saying so.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

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
            return xgr.GrammarMatcher(self.compiler.compile_grammar(grammar))
        except (RuntimeError, ValueError) as err:
            raise RequestError(f"the {guided.kind} cannot be used for constrained decoding: {_reason(err)}") from None

    def mask(self, torch: Any, rows: list[Sequence], logits: Any) -> Any:
        """`logits` ([rows, vocabulary]) with every token a guided row's grammar forbids next at -inf (a copy: the
        raw logits stay for log-probabilities); `logits` itself when no row is guided."""
        guided = [index for index, sequence in enumerate(rows) if sequence.matcher is not None]
        if not guided:
            return logits
        xgr = xgrammar()
        bitmask = xgr.allocate_token_bitmask(len(guided), self.vocabulary)  # int32 [rows, words]: bit i = token i allowed
        for slot, index in enumerate(guided):
            rows[index].matcher.fill_next_token_bitmask(bitmask, slot)
        bitmask = bitmask.to(logits.device, non_blocking=True)
        shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
        allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().reshape(len(guided), -1)
        width = logits.shape[-1]
        if allowed.shape[1] < width:  # logits wider than the vocabulary xgrammar knows: the padding is never allowed
            allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[1]))
        index = torch.tensor(guided, device=logits.device)
        scores = logits.clone()
        scores[index] = scores[index].masked_fill(~allowed[:, :width], float("-inf"))
        return scores

    @staticmethod
    def advance(sequence: Sequence, token: int) -> str | None:
        """The matcher takes the chosen token (one of those the mask allowed); "stop" once the grammar is done."""
        matcher = sequence.matcher
        if matcher is None:
            return None
        if not matcher.accept_token(token) or matcher.is_terminated():
            return "stop"
        return None
