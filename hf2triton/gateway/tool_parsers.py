"""Tool calling, the answer side: tool calls read from a model's text in its generation.tool_parser's format, as
vLLM's parsers of the same names read them --

- hermes (Qwen2.5/3, Hermes): any number of `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks with
  text around them (the text outside the blocks is the message's content);
- llama3_json (Llama 3.1+): the answer is one JSON object `{"name": ..., "parameters": {...}}` (or several separated by
  `;`), optionally after `<|python_tag|>`.

A call's `arguments` is the model's own JSON text of them (streamed or not the same string). An answer whose call
blocks do not all parse is content as it is (vLLM's choice: nothing half-parsed). Streamed (`ToolStream`), text that
might still become a call is held back; a call goes out as OpenAI's deltas: first its index, id, type, name and
arguments "", then fragments of the arguments as they come."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from hf2triton.gateway.tools import HERMES_CLOSE, HERMES_OPEN

PYTHON_TAG = "<|python_tag|>"
ARGUMENT_KEYS = ("arguments", "parameters")  # vLLM's parsers take either
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
_NAME_FIRST = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)')


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # the arguments' JSON text (an object)

    def openai(self, call_id: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _members(text: str, start: int = 0) -> tuple[dict[str, tuple[Any, int, int]], int] | None:
    """The top-level members of the JSON object at `start` (after whitespace): {key: (value, its start, its end)},
    and where the object ends; None when no whole object is there."""
    at = _SPACE.match(text, start).end()
    if text[at : at + 1] != "{":
        return None
    at = _SPACE.match(text, at + 1).end()
    found: dict[str, tuple[Any, int, int]] = {}
    if text[at : at + 1] == "}":
        return found, at + 1
    while True:
        try:
            key, at = _DECODER.raw_decode(text, at)
            at = _SPACE.match(text, at).end()
            if not isinstance(key, str) or text[at : at + 1] != ":":
                return None
            begin = _SPACE.match(text, at + 1).end()
            value, at = _DECODER.raw_decode(text, begin)
        except ValueError:
            return None
        found[key] = (value, begin, at)
        at = _SPACE.match(text, at).end()
        if text[at : at + 1] == "}":
            return found, at + 1
        if text[at : at + 1] != ",":
            return None
        at = _SPACE.match(text, at + 1).end()


def parse_call(text: str, start: int = 0) -> tuple[Call, int] | None:
    """The call object at `start` -- {"name": a string, "arguments" or "parameters": an object} -- and its end."""
    scanned = _members(text, start)
    if scanned is None:
        return None
    members, end = scanned
    name = members.get("name", (None,))[0]
    key = next((k for k in ARGUMENT_KEYS if k in members), None)
    if not isinstance(name, str) or key is None or not isinstance(members[key][0], dict):
        return None
    _, begin, finish = members[key]
    return Call(name, text[begin:finish]), end


def _hermes(text: str) -> tuple[str | None, list[Call]] | None:
    calls, outside, at = [], [], 0
    while (opened := text.find(HERMES_OPEN, at)) >= 0:
        outside.append(text[at:opened])
        body_start = opened + len(HERMES_OPEN)
        closed = text.find(HERMES_CLOSE, body_start)
        body = text[body_start : closed if closed >= 0 else len(text)]
        found = parse_call(body)
        if found is None or body[found[1] :].strip():
            return None
        calls.append(found[0])
        at = closed + len(HERMES_CLOSE) if closed >= 0 else len(text)
    outside.append(text[at:])
    return "".join(outside).strip() or None, calls


def _llama3_json(text: str) -> tuple[str | None, list[Call]] | None:
    body = text.strip()
    body = body[len(PYTHON_TAG) :] if body.startswith(PYTHON_TAG) else body
    calls, at = [], 0
    while True:
        found = parse_call(body, at)
        if found is None:
            return None
        calls.append(found[0])
        at = _SPACE.match(body, found[1]).end()
        if at == len(body):
            return None, calls
        if body[at] != ";":
            return None
        at += 1


def parse_tool_calls(parser: str, text: str) -> tuple[str | None, list[Call]]:
    """A whole answer's (content, calls): no calls (the content the text as it is) when it holds none that parse."""
    if parser == "hermes" and HERMES_OPEN not in text:
        return text, []
    if parser == "llama3_json" and not text.strip().startswith(("{", PYTHON_TAG)):
        return text, []
    found = _hermes(text) if parser == "hermes" else _llama3_json(text)
    return found if found is not None and found[1] else (text, [])


def _held(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker` (held back while streaming)."""
    return next((n for n in range(min(len(text), len(marker) - 1), 0, -1) if marker.startswith(text[-n:])), 0)


class _CallDeltas:
    """One streamed call: its header once its name is known (the model writes it first), then its arguments' text as
    it grows; `close` with the whole body sends what is left (or, name not seen yet, everything at once)."""

    def __init__(self, index: int):
        self.index, self.id = index, call_id()
        self.named = False
        self.arguments_at = -1  # where the arguments' text starts in the body
        self.sent = 0  # characters of the arguments' text sent

    def _header(self, name: str) -> dict[str, Any]:
        self.named = True
        return {"index": self.index, "id": self.id, "type": "function", "function": {"name": name, "arguments": ""}}

    def _fragment(self, text: str) -> dict[str, Any] | None:
        piece, self.sent = text[self.sent :], len(text)
        return {"index": self.index, "function": {"arguments": piece}} if piece else None

    def advance(self, body: str) -> list[dict[str, Any]]:
        out = []
        if not self.named:
            match = _NAME_FIRST.match(body)
            if match is None:
                return []
            out.append(self._header(json.loads(match.group(1))))
            self.arguments_at = match.end()
        if self.arguments_at < 0:
            return out
        try:  # whole arguments: up to their end; else everything so far is part of them
            end = _DECODER.raw_decode(body, self.arguments_at)[1]
        except ValueError:
            end = len(body.rstrip())
        fragment = self._fragment(body[self.arguments_at : end])
        return out + ([fragment] if fragment else [])

    def close(self, body: str) -> tuple[list[dict[str, Any]], bool]:
        """The deltas left once the body is whole, and whether it was a call."""
        found = parse_call(body)
        if found is None:
            return [], False
        call, out = found[0], []
        if not self.named:
            out.append(self._header(call.name))
        if call.arguments.startswith(body[self.arguments_at : self.arguments_at + self.sent] if self.sent else ""):
            fragment = self._fragment(call.arguments)
            out += [fragment] if fragment else []
        return out, True


class ToolStream:
    """One streamed choice's deltas: `feed(text)` / `finish()` -> [{"content": ...} or {"tool_calls": [...]}, ...];
    `called`: whether any call went out (the finish reason is then "tool_calls")."""

    def __init__(self, parser: str):
        self.parser, self.text, self.done = parser, "", 0  # done: text handled (sent or part of a call)
        self.call: _CallDeltas | None = None
        self.body_at = self.open_from = 0  # where the open call's body starts, and its text with its marker
        self.calls = 0
        self.plain = False  # llama3_json: the answer is text, not a call

    @property
    def called(self) -> bool:
        return self.calls > 0

    def _content(self, end: int) -> list[dict[str, Any]]:
        piece, self.done = self.text[self.done : end], max(self.done, end)
        return [{"content": piece}] if piece.strip() or piece and not self.calls else []  # not the newlines between calls

    def _calls(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"tool_calls": [item]} for item in items]

    def _open(self, at: int) -> None:
        self.open_from = self.done  # where the call's text starts (its marker, a separator): content if it is none
        self.call, self.body_at, self.done = _CallDeltas(self.calls), at, at
        self.calls += 1

    def feed(self, text: str) -> list[dict[str, Any]]:
        self.text += text
        return self._step(final=False)

    def finish(self) -> list[dict[str, Any]]:
        return self._step(final=True)

    def _step(self, final: bool) -> list[dict[str, Any]]:
        return self._hermes(final) if self.parser == "hermes" else self._llama3_json(final)

    def _close(self, body: str, raw_end: int) -> list[dict[str, Any]]:
        """Ends the open call at `raw_end` of the text; a body that is no call goes out as content (unless its header
        went out already: then what was sent stands)."""
        assert self.call is not None
        items, ok = self.call.close(body)
        out = self._calls(items)
        if not ok and not self.call.named:
            self.calls -= 1
            out.append({"content": self.text[self.open_from : raw_end]})
        self.call, self.done = None, raw_end
        return out

    def _hermes(self, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            if self.call is None:
                opened = self.text.find(HERMES_OPEN, self.done)
                if opened < 0:
                    return out + self._content(len(self.text) if final else len(self.text) - _held(self.text, HERMES_OPEN))
                out += self._content(opened)
                self._open(opened + len(HERMES_OPEN))
            closed = self.text.find(HERMES_CLOSE, self.body_at)
            if closed < 0 and not final:
                return out + self._calls(self.call.advance(self.text[self.body_at :]))
            end = closed if closed >= 0 else len(self.text)
            out += self._close(self.text[self.body_at : end], end + len(HERMES_CLOSE) if closed >= 0 else end)

    def _llama3_json(self, final: bool) -> list[dict[str, Any]]:
        if self.plain:
            return self._content(len(self.text))
        out: list[dict[str, Any]] = []
        while True:
            if self.call is None:
                rest = self.text[self.done :].lstrip()
                if self.calls == 0 and rest.startswith(PYTHON_TAG):
                    rest = rest[len(PYTHON_TAG) :].lstrip()
                if self.calls and rest.startswith(";"):
                    rest = rest[1:].lstrip()
                undecided = not rest or (self.calls == 0 and PYTHON_TAG.startswith(rest))
                if undecided and not final:
                    return out
                if not rest.startswith("{"):  # not (or no more) calls: the rest is content
                    self.plain = self.calls == 0
                    return out + (self._content(len(self.text)) if final or self.plain else [])
                self._open(len(self.text) - len(rest))
            scanned = _members(self.text, self.body_at)
            if scanned is None and not final:
                return out + self._calls(self.call.advance(self.text[self.body_at :]))
            end = scanned[1] if scanned is not None else len(self.text)
            out += self._close(self.text[self.body_at : end], end)
            if scanned is None:
                return out


def tool_message(parser: str, text: str, final: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A whole chat answer's message fields and final info: with the calls found, content the text around them (None
    if none) and finish reason "tool_calls" (`called`); else the text as content."""
    content, calls = parse_tool_calls(parser, text)
    if not calls:
        return {"content": text}, final
    return {"content": content, "tool_calls": [call.openai(call_id()) for call in calls]}, called(final)


def called(final: dict[str, Any]) -> dict[str, Any]:
    """The final info of an answer that called tools: finish reason "tool_calls", unless it was cut ("length")."""
    return {**final, "finish_reason": "tool_calls"} if final.get("finish_reason") == "stop" else final
