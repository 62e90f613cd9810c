"""The OpenAI API's shapes in one place: what a request may carry (read and checked here: a bad value is a 400
naming its parameter and never reaches Triton) and what each answer looks like. The endpoints (api/) read
requests and write answers only through these functions; a new endpoint adds its own here."""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Request

from hf2triton.gateway.errors import ApiError
from hf2triton.serving import interface

UNSUPPORTED_CHAT = ("tools", "functions", "tool_choice", "function_call", "logprobs", "top_logprobs", "logit_bias", "audio", "modalities")
FINISH_REASONS = {"stop": "stop", "length": "length", "time": "length", "cancelled": "stop"}  # the model's -> OpenAI's


@dataclass(frozen=True)
class ServedModel:
    """A served model as its Triton config describes it (GET /v1/models, /v1/status; which endpoint takes it)."""

    name: str
    task: str
    streaming: bool
    max_batch_size: int
    max_texts: int = interface.DEFAULTS.max_texts_per_request
    backend: str = ""
    device: str = ""  # "gpu" / "cpu": the instance groups' kind
    instances: int = 0
    max_new_tokens: int = interface.MAX_NEW_TOKENS_RANGE[1]  # generation: the model's per-request cap (max_new_tokens_limit)
    max_sequences: int = 0  # streaming generation: sequences decoded together (its Triton max_batch_size is 0)
    # feature-extraction: its prompt names, its embedding's width, whether it normalises, its Matryoshka widths
    # (interface.ModelParameters: "" none, "any", or "768,512,...")
    prompt_names: tuple[str, ...] = ()
    width: int = 0
    normalized: bool = True
    matryoshka: str = ""


# ------------------------------------------------------------------ requests


async def read_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (its size and time bounded by the Boundary while it is read)."""
    raw = await request.body()
    try:
        body = json.loads(raw or b"{}")
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply") from None
    except ValueError as err:
        raise ApiError(400, f"the body is not valid JSON ({err})") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _text(value: str, param: str) -> str:
    """A text field that can become UTF-8 (JSON's "\\ud800" escape decodes to a lone surrogate, which cannot)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, f"'{param}' contains a lone UTF-16 surrogate (not valid Unicode text)", param=param) from None
    return value


def _number(body: dict[str, Any], key: str, kind: type, low: float, high: float) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise ApiError(400, f"'{key}' must be a {'whole number' if kind is int else 'number'}, got {json.dumps(value)[:40]}", param=key)
    if not low <= value <= high:
        raise ApiError(400, f"'{key}' = {value} is out of range ({low}..{high})", param=key)
    return kind(value)


def flag(body: dict[str, Any], key: str) -> bool:
    """A boolean field: true, false or absent ("yes" or 1 is a mistake, not true)."""
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {json.dumps(value)[:40]}", param=key)
    return bool(value)


def generation_options(body: dict[str, Any], max_new_tokens: int = interface.MAX_NEW_TOKENS_RANGE[1]) -> dict[str, Any]:
    """OpenAI sampling parameters -> the model's request inputs (checked here: a bad value never reaches Triton);
    `max_new_tokens`: the model's cap, the range max_tokens is checked against."""
    flag(body, "stream")
    if body.get("n", 1) != 1:
        raise ApiError(400, "only n = 1 is supported", param="n")
    for key in UNSUPPORTED_CHAT:
        if body.get(key) not in (None, False, [], {}):
            raise ApiError(400, f"'{key}' is not supported by this server", param=key)
    # refused rather than silently ignored: a client asking for JSON or penalties must not get plain sampling
    if body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError(400, '\'response_format\' is not supported by this server (only {"type": "text"})', param="response_format")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0) or isinstance(body.get(key), bool):
            raise ApiError(400, f"'{key}' is not supported by this server (only 0)", param=key)
    options: dict[str, Any] = {}
    tokens = _number(body, "max_completion_tokens", int, 1, max_new_tokens)
    tokens = tokens if tokens is not None else _number(body, "max_tokens", int, 1, max_new_tokens)
    if tokens is not None:
        options[interface.MAX_NEW_TOKENS] = tokens
    temperature = _number(body, "temperature", float, 0.0, 2.0)
    if temperature is not None:
        options[interface.TEMPERATURE] = 0.0 if temperature < interface.MIN_TEMPERATURE else temperature
    top_p = _number(body, "top_p", float, *interface.TOP_P_RANGE)
    if top_p is not None and top_p < 1.0:
        options[interface.TOP_P] = top_p
    seed = _number(body, "seed", int, *interface.SEED_RANGE)
    if seed is not None:
        options[interface.SEED] = seed
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
            raise ApiError(400, "'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
        if stops:
            options[interface.STOP] = [_text(s, "stop") for s in stops]
    return options


def chat_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role == "developer":
            role = "system"
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported", param=f"messages[{index}].content")
            content = "".join(p["text"] for p in content)
        if role not in interface.CHAT_ROLES or not isinstance(content, str):
            raise ApiError(
                400,
                f"messages[{index}] must have a role ({', '.join((*interface.CHAT_ROLES, 'developer'))}) and text content",
                param=f"messages[{index}]",
            )
        out.append({"role": role, "content": _text(content, f"messages[{index}].content")})
    return out


def embedding_inputs(body: dict[str, Any]) -> list[str]:
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "'input' must be a string or a non-empty list of strings (token arrays are not supported)", param="input")
    if any(not t.strip() for t in texts):
        raise ApiError(400, "'input' contains an empty string", param="input")
    return [_text(t, "input") for t in texts]


@dataclass(frozen=True)
class Ranking:
    """A rerank request: the query, its documents, how many results to answer (0: all), whether with their text."""

    query: str
    documents: list[str]
    top_n: int = 0
    return_documents: bool = True


def rerank_request(body: dict[str, Any]) -> Ranking:
    """POST /v1/rerank's body (Cohere / Jina, as vLLM serves it): `query`, `documents` (strings), optional `top_n`
    (0 or absent: every document) and `return_documents` (default true)."""
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ApiError(400, "'query' must be a non-empty string", param="query")
    documents = body.get("documents")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise ApiError(400, "'documents' must be a non-empty list of strings", param="documents")
    empty = [i for i, d in enumerate(documents) if not d.strip()]
    if empty:
        raise ApiError(400, f"'documents' contains an empty string (documents[{empty[0]}])", param="documents")
    top_n = _number(body, "top_n", int, 0, 2**31 - 1) or 0
    return_documents = flag(body, "return_documents") if body.get("return_documents") is not None else True
    return Ranking(_text(query, "query"), [_text(d, "documents") for d in documents], top_n, return_documents)


def completion_prompt(body: dict[str, Any]) -> str:
    # accepted by OpenAI's /v1/completions, not done here: refused, never silently ignored
    if body.get("best_of") not in (None, 1):
        raise ApiError(400, "'best_of' is not supported by this server (only 1)", param="best_of")
    if body.get("suffix") not in (None, ""):
        raise ApiError(400, "'suffix' is not supported by this server", param="suffix")
    if flag(body, "echo"):
        raise ApiError(400, "'echo' is not supported by this server", param="echo")
    raw = body.get("prompt")
    raw = raw[0] if isinstance(raw, list) and len(raw) == 1 else raw
    if not isinstance(raw, str) or not raw.strip():
        raise ApiError(400, "'prompt' must be a non-empty string (one prompt per request)", param="prompt")
    return _text(raw, "prompt")


def include_usage(body: dict[str, Any]) -> bool:
    """stream_options.include_usage: a last event with the token counts."""
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    return flag(stream_options, "include_usage")


def embedding_format(body: dict[str, Any]) -> str:
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise ApiError(400, "'encoding_format' must be float or base64", param="encoding_format")
    return encoding


def embedding_prompt(body: dict[str, Any], model: ServedModel) -> str | None:
    """`prompt_name` (an extra field, as sentence-transformers' encode takes it): one of the model's prompts, or None
    (the model's default_prompt_name applies)."""
    name = body.get("prompt_name")
    if name is None:
        return None
    if not isinstance(name, str) or name not in model.prompt_names:
        names = ", ".join(model.prompt_names) or "(none: it was rendered before prompts were served)"
        raise ApiError(
            400, f"'prompt_name' {json.dumps(name)[:60]} is not one of model {model.name!r}'s prompts: {names}", param="prompt_name"
        )
    return name


def embedding_dimensions(body: dict[str, Any], model: ServedModel) -> int | None:
    """`dimensions` (OpenAI's; as vLLM takes it): a width a Matryoshka model declares (config.json's
    matryoshka_dimensions, or any up to its embedding's with is_matryoshka); refused for any other model."""
    value = body.get("dimensions")
    if value is None:
        return None
    if not model.matryoshka:
        message = (
            f"model {model.name!r} does not support matryoshka representation: 'dimensions' needs a model whose config.json "
            "declares is_matryoshka or matryoshka_dimensions (changing the width of any other would give poor embeddings)"
        )
        raise ApiError(400, message, param="dimensions")
    dimensions = _number(body, "dimensions", int, 1, model.width or 2**31 - 1)
    allowed = [int(w) for w in model.matryoshka.split(",")] if model.matryoshka != "any" else []
    if allowed and dimensions not in allowed:
        raise ApiError(
            400,
            f"'dimensions' = {dimensions}: model {model.name!r} only supports {allowed} (its matryoshka_dimensions)",
            param="dimensions",
        )
    return dimensions


def matryoshka(vectors: np.ndarray, dimensions: int | None, normalized: bool) -> np.ndarray:
    """The first `dimensions` values of each vector, L2-normalised again when the model normalises (as vLLM: the
    pooled vector cut, then normalised)."""
    if dimensions is None:
        return vectors
    cut = vectors[:, :dimensions]
    if not normalized:
        return np.ascontiguousarray(cut)
    return (cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)).astype(np.float32)


# ------------------------------------------------------------------ answers


def completion_head(chat: bool, model: str) -> dict[str, Any]:
    """The fields every answer and chunk of one completion share."""
    kind = "chat.completion" if chat else "text_completion"
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()), "model": model}


def usage(final: dict[str, Any]) -> dict[str, int]:
    prompt, completion = final.get("prompt_tokens", 0), final.get("completion_tokens", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_answer(head: dict[str, Any], chat: bool, answer: str, final: dict[str, Any]) -> dict[str, Any]:
    ending = {"finish_reason": final.get("finish_reason"), "logprobs": None}
    choice = {"index": 0, "message": {"role": "assistant", "content": answer}, **ending} if chat else {"index": 0, "text": answer, **ending}
    return {**head, "choices": [choice], "usage": usage(final)}


def completion_chunk(head: dict[str, Any], chat: bool, piece: str, info: dict | None, role: bool = False) -> dict[str, Any]:
    """One streamed event: a piece of text, the finish reason on the last one."""
    if chat:
        delta = {"role": "assistant", "content": piece} if role else ({"content": piece} if piece else {})
        choice = {"index": 0, "delta": delta, "finish_reason": info and info["finish_reason"], "logprobs": None}
    else:
        choice = {"index": 0, "text": piece, "finish_reason": info and info["finish_reason"], "logprobs": None}
    return {**head, "object": f"{head['object']}.chunk" if chat else head["object"], "choices": [choice]}


def usage_chunk(head: dict[str, Any], chat: bool, final: dict[str, Any]) -> dict[str, Any]:
    return {**completion_chunk(head, chat, "", None), "choices": [], "usage": usage(final)}


def embedding_answer(model: str, vectors: np.ndarray, tokens: int, encoding: str) -> dict[str, Any]:
    """Vectors stay numpy arrays: ArrayJSONResponse writes them."""
    data = [
        {"object": "embedding", "index": i, "embedding": base64.b64encode(v.tobytes()).decode() if encoding == "base64" else v}
        for i, v in enumerate(vectors)
    ]
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def rerank_answer(answer_id: str, model: str, ranking: Ranking, scores: np.ndarray, tokens: int) -> dict[str, Any]:
    """The documents best first (ties: in request order), top_n of them (0: all), with their text unless not asked."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))[: ranking.top_n or None]
    results = []
    for index in order:
        result: dict[str, Any] = {"index": index, "relevance_score": float(scores[index])}
        if ranking.return_documents:
            result["document"] = {"text": ranking.documents[index]}
        results.append(result)
    return {"id": answer_id, "model": model, "results": results, "usage": {"total_tokens": tokens}}


def model_card(model: ServedModel, created: int) -> dict[str, Any]:
    card = {"id": model.name, "object": "model", "created": created, "owned_by": "hf2triton", "task": model.task}
    if model.task == interface.GENERATION:
        card["max_tokens"] = model.max_new_tokens  # the range max_tokens is checked against (the playground's field)
    return card


def model_status(model: ServedModel) -> dict[str, Any]:
    """hf2triton's own: what /v1/status says of a model."""
    return {
        "id": model.name, "task": model.task, "backend": model.backend, "device": model.device, "instances": model.instances,
        "max_batch_size": None if model.streaming else model.max_batch_size, "streaming": model.streaming,
        "max_sequences": model.max_sequences or None,
    }  # fmt: skip
