"""Tool calling on /v1/chat/completions, the request side: `tools` and `tool_choice` read and checked (a mistake is a
400 naming its parameter), and for `tool_choice` "required" or a named function the constraint (interface.GUIDED)
that makes the model's answer a call in its parser's format, so the call is certain rather than hoped for.

tool_choice "none" follows vLLM: the tools are still rendered by the chat template, the answer is not parsed (it is
the message's content as it comes). "auto": parsed, the model decides. The answer side is tool_parsers.py."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from hf2triton.gateway.errors import ApiError
from hf2triton.gateway.protocol import ServedModel
from hf2triton.serving import interface

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
CHOICES = ("none", "auto", "required")
# the key a parser's call object carries its arguments under (vLLM's hermes and llama3_json parsers)
ARGUMENTS_KEY = {"hermes": "arguments", "llama3_json": "parameters"}
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
CALL_BLOCK, CALL_OBJECT = "hf2triton_tool_call", "hf2triton_call_object"  # a forced call's own grammar rules
_RULE_OR_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\broot\b')


@dataclass(frozen=True)
class ToolRequest:
    """A chat request's tools (as sent, checked), its tool_choice ("none" | "auto" | "required" | "function": the
    one named), and whether several calls may come at once (parallel_tool_calls, default true)."""

    tools: list[dict[str, Any]]
    choice: str
    name: str = ""
    parallel: bool = True

    @property
    def parses(self) -> bool:
        """Whether the answer is read for tool calls."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> list[dict[str, Any]]:
        """The functions the answer must call one of (required / named), else []."""
        if self.choice == "required":
            return [tool["function"] for tool in self.tools]
        if self.choice == "function":
            return [tool["function"] for tool in self.tools if tool["function"]["name"] == self.name]
        return []


def _tool(tool: Any, index: int) -> dict[str, Any]:
    param = f"tools[{index}]"
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or tool.get("type") != "function":
        shape = '{"type": "function", "function": {"name": ..., "parameters": {...}}}'
        raise ApiError(400, f"each of 'tools' must be {shape}: {param} is {json.dumps(tool)[:80]}", param=param)
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        message = f"{param}.function.name must be 1-64 letters, digits, underscores or dashes, got {json.dumps(name)[:70]}"
        raise ApiError(400, message, param=f"{param}.function.name")
    if not isinstance(function.get("description") or "", str):
        raise ApiError(400, f"{param}.function.description must be a string", param=f"{param}.function.description")
    parameters = function.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ApiError(400, f"{param}.function.parameters must be a JSON schema (an object)", param=f"{param}.function.parameters")
    # null description / parameters (pydantic clients send unset fields as null) are absent, as vLLM takes them
    return {"type": "function", "function": {key: value for key, value in function.items() if value is not None}}


def _choice(value: Any, names: list[str]) -> tuple[str, str]:
    if value is None:
        return ("auto" if names else "none"), ""
    if isinstance(value, str) and value in CHOICES:
        if value != "none" and not names:
            raise ApiError(400, f"'tool_choice' is {value!r} but the request has no 'tools'", param="tool_choice")
        return value, ""
    name = value.get("function", {}).get("name") if isinstance(value, dict) and isinstance(value.get("function"), dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(name, str):
        shape = '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
        raise ApiError(400, f"'tool_choice' must be {shape}, got {json.dumps(value)[:80]}", param="tool_choice")
    if name not in names:
        raise ApiError(
            400, f"'tool_choice' names function {name!r}, which is not one of 'tools' ({', '.join(names) or 'none'})", param="tool_choice"
        )
    return "function", name


def tool_request(body: dict[str, Any], served: ServedModel) -> ToolRequest:
    """`tools`, `tool_choice` and `parallel_tool_calls` checked against the model: tools need its
    generation.tool_parser (the chat template's tool support is checked when the model is rendered)."""
    for legacy, current in (("functions", "tools"), ("function_call", "tool_choice")):
        if body.get(legacy) not in (None, [], {}):
            raise ApiError(400, f"'{legacy}' (deprecated by OpenAI) is not supported: send '{current}'", param=legacy)
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise ApiError(400, "'tools' must be a list of function tools", param="tools")
    tools = [_tool(tool, index) for index, tool in enumerate(raw or [])]
    names = [tool["function"]["name"] for tool in tools]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice:
        raise ApiError(400, f"'tools' names function {twice!r} twice", param="tools")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    choice, name = _choice(body.get("tool_choice"), names)
    if tools and served.task != interface.GENERATION:
        raise ApiError(400, f"model {served.name!r} is a {served.task} model: tools need a chat model's template", param="tools")
    if tools and served.tool_parser == interface.DEFAULT_TOOL_PARSER:
        message = (
            f"model {served.name!r} does not take 'tools': set its generation.tool_parser in the config "
            f"({' or '.join(p for p in interface.TOOL_PARSERS if p != interface.DEFAULT_TOOL_PARSER)}, the format its chat template "
            "asks the model to call tools in) and render it again"
        )
        raise ApiError(400, message, param="tools")
    return ToolRequest(tools, choice, name, parallel is not False)


# ------------------------------------------------------------------ enforcement (tool_choice required / named)


def call_schema(function: dict[str, Any], parser: str) -> dict[str, Any]:
    """The JSON schema of one call of `function` in `parser`'s object: {"name": its name, <arguments key>: its
    parameters}."""
    key = ARGUMENTS_KEY[parser]
    parameters = function.get("parameters") or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, key: parameters},
        "required": ["name", key],
        "additionalProperties": False,
    }


def _calls_schema(functions: list[dict[str, Any]], parser: str) -> dict[str, Any]:
    schemas = [call_schema(function, parser) for function in functions]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _json_grammar(schema: dict[str, Any]) -> str:
    """xgrammar's EBNF of `schema` (compact JSON: no free whitespace a random-ish model could spin in), its root rule
    renamed CALL_OBJECT; a schema xgrammar cannot convert is the request's mistake (400 naming the tools)."""
    try:
        import xgrammar
    except ImportError:  # envs/requirements.txt installs it
        raise ApiError(500, "tool_choice required / named needs xgrammar, which is not installed here", "server_error") from None
    try:
        ebnf = str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))
    except RuntimeError as err:
        problem = str(err).strip().splitlines()[-1].split(": ", 1)[-1][:300]
        raise ApiError(
            400, f"a tool's parameters are a JSON schema the constraint cannot be built from: {problem}", param="tools"
        ) from None
    # the rule named root, not a literal or character class that holds the word (an enum value "root")
    return _RULE_OR_LITERAL.sub(lambda found: CALL_OBJECT if found.group(0) == "root" else found.group(0), ebnf)


def guided(request: ToolRequest, parser: str) -> dict[str, Any] | None:
    """interface.GUIDED's value for a forced call (None when the model chooses): hermes, a grammar of one (or, with
    parallel_tool_calls for "required", one or more) `<tool_call>\\n{json}\\n</tool_call>` blocks; llama3_json, the JSON
    schema of one `{"name", "parameters"}` object."""
    functions = request.forced
    if not functions:
        return None
    schema = _calls_schema(functions, parser)
    if parser == "llama3_json":
        _json_grammar(schema)  # checked here: a schema xgrammar refuses is a 400, not a model-side failure
        return {"kind": "json_schema", "value": schema}
    calls = f'{CALL_BLOCK} ("\\n" {CALL_BLOCK})*' if request.parallel and request.choice == "required" else CALL_BLOCK
    head = f'root ::= {calls}\n{CALL_BLOCK} ::= "{HERMES_OPEN}\\n" {CALL_OBJECT} "\\n{HERMES_CLOSE}"\n'
    return {"kind": "grammar", "value": head + _json_grammar(schema)}
