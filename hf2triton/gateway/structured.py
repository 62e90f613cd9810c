"""Structured output (constrained decoding) on /v1/chat/completions and /v1/completions: OpenAI's `response_format`
(json_object, json_schema), vLLM's extras `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` and its
newer `structured_outputs` {json, regex, choice, grammar, json_object} become the model's interface.GUIDED input
({"kind", "value"}). What xgrammar cannot compile is a 400 naming it here, before anything reaches Triton (the model
checks again: a gateway without xgrammar leaves the check to it)."""

from __future__ import annotations

import json
from typing import Any

from hf2triton.gateway.errors import ApiError
from hf2triton.serving.batching.sequences import Guided
from hf2triton.serving.inputs import RequestError

GUIDED_EXTRAS = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
STRUCTURED_OUTPUTS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar", "json_object": "json_object"}
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def _value(kind: str, value: Any, param: str) -> Any:
    """A kind's value checked (interface.GUIDED): a schema (an object, or its JSON text as vLLM takes it), a regex or
    grammar (a non-empty string), choices (a non-empty list of strings)."""
    if kind == "json_schema" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as err:
            raise ApiError(400, f"'{param}' is not valid JSON ({err})", param=param) from None
    if kind == "json_schema" and not isinstance(value, dict):
        raise ApiError(400, f"'{param}' must be a JSON schema (an object), got {json.dumps(value)[:60]}", param=param)
    if kind in ("regex", "grammar") and not (isinstance(value, str) and value):
        raise ApiError(400, f"'{param}' must be a non-empty string", param=param)
    if kind == "choice" and not (isinstance(value, list) and value and all(isinstance(choice, str) for choice in value)):
        raise ApiError(400, f"'{param}' must be a non-empty list of strings", param=param)
    return value


def _response_format(value: Any) -> dict[str, Any] | None:
    """OpenAI's response_format: {"type": "text"} (free), {"type": "json_object"} (any JSON object) or {"type":
    "json_schema", "json_schema": {"name", "schema", "strict", "description"}} (the schema, followed strictly)."""
    param = "response_format"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in RESPONSE_FORMATS:
        allowed = ", ".join(f'{{"type": "{name}"}}' for name in RESPONSE_FORMATS)
        raise ApiError(400, f"'{param}' must be one of {allowed}, got {json.dumps(value)[:80]}", param=param)
    if kind == "text":
        return None
    if kind == "json_object":
        return {"kind": "json_object", "value": None}
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        message = f'\'{param}\' of type json_schema needs "json_schema": {{"name": ..., "schema": {{a JSON schema}}}}'
        raise ApiError(400, message, param=param)
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise ApiError(400, f"'{param}.json_schema.strict' must be true or false", param=param)
    return {"kind": "json_schema", "value": spec["schema"]}


def _structured_outputs(value: Any) -> list[tuple[str, dict[str, Any]]]:
    """vLLM's structured_outputs object: one of json, regex, choice, grammar, json_object (true)."""
    param = "structured_outputs"
    if not isinstance(value, dict):
        raise ApiError(400, f"'{param}' must be an object with one of {', '.join(STRUCTURED_OUTPUTS)}", param=param)
    found = []
    for key, kind in STRUCTURED_OUTPUTS.items():
        given = value.get(key)
        if given is None or (key == "json_object" and given is False):
            continue
        if key == "json_object":
            if given is not True:
                raise ApiError(400, f"'{param}.json_object' must be true or false", param=param)
            found.append((param, {"kind": kind, "value": None}))
        else:
            found.append((param, {"kind": kind, "value": _value(kind, given, f"{param}.{key}")}))
    return found


def guided_option(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request's interface.GUIDED value ({"kind", "value"}), None when its output is free; 400 for a malformed
    or conflicting one, or one xgrammar refuses (naming what it refuses)."""
    found: list[tuple[str, dict[str, Any]]] = []
    if body.get("response_format") is not None:
        spec = _response_format(body["response_format"])
        if spec is not None:
            found.append(("response_format", spec))
    for key, kind in GUIDED_EXTRAS.items():
        if body.get(key) is not None:
            found.append((key, {"kind": kind, "value": _value(kind, body[key], key)}))
    if body.get("structured_outputs") is not None:
        found += _structured_outputs(body["structured_outputs"])
    if not found:
        return None
    if len(found) > 1:
        names = " and ".join(sorted({param for param, _ in found}))
        raise ApiError(400, f"the output can follow one constraint, got {names}: send one", param=found[1][0])
    param, spec = found[0]
    check(spec, param)
    return spec


def check(spec: dict[str, Any], param: str) -> None:
    """400 when xgrammar cannot compile `spec` (an interface.GUIDED value); nothing when the gateway's Python has no
    xgrammar (the model's check then answers). The tools work builds `spec` from tool_choice and checks it here too."""
    try:
        from hf2triton.serving.batching.grammar import check_guided, xgrammar

        xgrammar()
    except RequestError:
        return
    try:
        check_guided(Guided(spec["kind"], spec["value"]))
    except RequestError as err:
        raise ApiError(400, f"'{param}': {err}", param=param) from None
