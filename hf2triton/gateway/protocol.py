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

from hf2triton.gateway import structured
from hf2triton.gateway.errors import ApiError
from hf2triton.serving import interface

UNSUPPORTED_CHAT = ("logit_bias", "audio")  # tools: gateway/tools.py
# vLLM's extra sampling parameters this server does not apply: refused unless neutral (a client sending its defaults
# must not fail; one asking for the effect must not silently get plain sampling)
NEUTRAL_VALUES = {"repetition_penalty": 1, "min_p": 0, "min_tokens": 0}
INT64_RANGE = (-(2**63), 2**63 - 1)
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
    max_n: int = interface.DEFAULTS.max_n  # generation: samples one request may ask for (`n`)
    tool_parser: str = interface.DEFAULT_TOOL_PARSER  # generation: how tool calls are read from its answers
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


COMPLETIONS_MAX_TOKENS = 16  # /v1/completions without max_tokens (OpenAI's documented default, vLLM's too)


def generation_options(body: dict[str, Any], max_new_tokens: int = interface.MAX_NEW_TOKENS_RANGE[1], chat: bool = True) -> dict[str, Any]:
    """OpenAI sampling parameters -> the model's request inputs (checked here: a bad value never reaches Triton);
    `max_new_tokens`: the model's cap, the range max_tokens is checked against. Log-probabilities: chat's `logprobs`
    (true/false) with `top_logprobs` (0..20), completions' `logprobs` (0..20 alternatives) and `echo` (the prompt's
    tokens too; max_tokens may then be 0). Structured output: gateway/structured.py."""
    flag(body, "stream")
    for key in UNSUPPORTED_CHAT:
        if body.get(key) not in (None, False, [], {}):
            raise ApiError(400, f"'{key}' is not supported by this server", param=key)
    if body.get("modalities") not in (None, [], ["text"]):
        raise ApiError(400, "'modalities' may only be [\"text\"] here (no audio output)", param="modalities")
    for key, neutral in NEUTRAL_VALUES.items():
        if body.get(key) is not None and (body[key] != neutral or isinstance(body[key], bool)):
            raise ApiError(400, f"'{key}' is not supported by this server (only {neutral})", param=key)
    options = _logprobs_options(body, chat)
    guided = structured.guided_option(body)  # response_format / guided_* / structured_outputs: constrained decoding
    if guided is not None:
        options[interface.GUIDED] = guided
    least = 0 if options.get(interface.PROMPT_LOGPROBS) else 1  # an echo may generate nothing (lm-eval's loglikelihood)
    tokens = _number(body, "max_completion_tokens", int, least, max_new_tokens)
    tokens = tokens if tokens is not None else _number(body, "max_tokens", int, least, max_new_tokens)
    if tokens is not None:
        options[interface.MAX_NEW_TOKENS] = tokens
    elif chat:  # OpenAI's and vLLM's unset max_tokens on chat: what the context leaves (up to max_new_tokens_limit)
        options[interface.OPEN_ENDED] = True
    else:  # the legacy completions' default, OpenAI's and vLLM's
        options[interface.MAX_NEW_TOKENS] = min(COMPLETIONS_MAX_TOKENS, max_new_tokens)
    temperature = _number(body, "temperature", float, 0.0, 2.0)
    if temperature is not None:
        options[interface.TEMPERATURE] = 0.0 if temperature < interface.MIN_TEMPERATURE else temperature
    top_p = _number(body, "top_p", float, *interface.TOP_P_RANGE)
    if top_p is not None and top_p < 1.0:
        options[interface.TOP_P] = top_p
    top_k = _number(body, "top_k", int, -1, interface.TOP_K_RANGE[1])  # vLLM's extra parameter; -1 and 0: off
    if top_k is not None and top_k > 0:
        options[interface.TOP_K] = top_k
    for key in (interface.PRESENCE_PENALTY, interface.FREQUENCY_PENALTY):
        penalty = _number(body, key, float, *interface.PENALTY_RANGE)
        if penalty:
            options[key] = penalty
    if flag(body, interface.IGNORE_EOS):  # vLLM's extra (guidellm, vllm bench): a fixed answer length
        options[interface.IGNORE_EOS] = True
    seed = _number(body, "seed", int, *INT64_RANGE)  # any 64-bit integer, as vLLM takes it; the model's are >= 0
    if seed is not None:
        options[interface.SEED] = seed % (interface.SEED_RANGE[1] + 1)
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > interface.MAX_STOPS:
            raise ApiError(400, f"'stop' must be a string or a list of up to {interface.MAX_STOPS} non-empty strings", param="stop")
        if stops:
            options[interface.STOP] = [_text(s, "stop") for s in stops]
    return options


def _logprobs_options(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The model's LOGPROBS (alternatives per token) and PROMPT_LOGPROBS inputs, from chat's `logprobs` +
    `top_logprobs` or completions' `logprobs` + `echo`."""
    top = _number(body, "top_logprobs" if chat else "logprobs", int, 0, interface.MAX_LOGPROBS)
    options: dict[str, Any] = {}
    if chat:
        if top and not flag(body, "logprobs"):  # 0 asks for nothing: taken without logprobs, as vLLM does
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if flag(body, "logprobs"):
            options[interface.LOGPROBS] = top or 0
    else:
        if top is not None:
            options[interface.LOGPROBS] = top
        if flag(body, "echo"):
            options[interface.PROMPT_LOGPROBS] = True
    return options


def sample_count(body: dict[str, Any], served: ServedModel) -> int:
    """`n`: distinct samples of each prompt, 1..the model's generation.max_n."""
    return _number(body, "n", int, 1, served.max_n) or 1


TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}  # part type -> its field


def _content(content: Any, param: str) -> Any:
    """A message's content: a string, or its text parts joined by newlines as vLLM joins them (anything else is
    returned for the caller to refuse)."""
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and isinstance(p.get(TEXT_PARTS.get(p.get("type"), "")), str) for p in content):
            raise ApiError(400, f"{param}: only text parts are supported ({', '.join(TEXT_PARTS)})", param=param)
        return "\n".join(p[TEXT_PARTS[p["type"]]] for p in content)
    return content


def _tool_calls(calls: Any, index: int) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` as OpenAI sends them back: [{id, type: function, function: {name,
    arguments: JSON text}}] (the model side hands templates the arguments parsed)."""
    param = f"messages[{index}].tool_calls"
    shape = '[{"id": ..., "type": "function", "function": {"name": ..., "arguments": "{...}"}}]'
    if not isinstance(calls, list) or not calls:
        raise ApiError(400, f"{param} must be a non-empty list {shape}", param=param)
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or call.get("type", "function") != "function"
            or not isinstance(call.get("id", ""), str)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments", ""), str)
        ):
            raise ApiError(400, f"{param} must be {shape}, got {json.dumps(call)[:80]}", param=param)
    return [
        {
            "id": call.get("id", ""),
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": call["function"].get("arguments", "{}")},
        }
        for call in calls
    ]


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`messages`: {role, content} each (developer is system), an assistant's `tool_calls` (its content may then be
    null) and a tool result's `tool_call_id` (role tool)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = _content(message.get("content"), f"messages[{index}].content") if isinstance(message, dict) else None
        calls = (message.get("tool_calls") or None) if role == "assistant" else None  # [] from some clients: none
        if role == "developer":
            role = "system"
        if content is None:  # null (an assistant's with tool_calls, or any): "", as vLLM takes it
            content = ""
        if role not in interface.CHAT_ROLES or not isinstance(content, str):
            raise ApiError(
                400,
                f"messages[{index}] must have a role ({', '.join((*interface.CHAT_ROLES, 'developer'))}) and text content",
                param=f"messages[{index}]",
            )
        item: dict[str, Any] = {"role": role, "content": _text(content, f"messages[{index}].content")}
        if calls is not None:
            item["tool_calls"] = _tool_calls(calls, index)
        if role == "tool":
            call = message.get("tool_call_id")
            if not isinstance(call, str) or not call:
                raise ApiError(
                    400,
                    f"messages[{index}] (role tool) needs 'tool_call_id': the id of the call it answers",
                    param=f"messages[{index}].tool_call_id",
                )
            item["tool_call_id"] = call
        if isinstance(message.get("name"), str) and role == "tool":
            item["name"] = message["name"]
        out.append(item)
    return out


def embedding_inputs(body: dict[str, Any]) -> list[str]:
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        message = "'input' must be a string or a non-empty list of strings"
        if isinstance(texts, list) and texts and all(isinstance(t, (int, list)) for t in texts):  # tiktoken ids
            message += (
                ": token ids are not taken (another tokenizer's ids mean nothing to this model); LangChain's"
                " OpenAIEmbeddings sends them unless check_embedding_ctx_length=False"
            )
        raise ApiError(400, message, param="input")
    if any(not t.strip() for t in texts):
        raise ApiError(400, "'input' contains an empty string", param="input")
    return [_text(t, "input") for t in texts]


def _texts(body: dict[str, Any], key: str, one: bool = True) -> list[str]:
    """A field of texts: a non-empty list of non-empty strings (`one`: a lone string too)."""
    value = body.get(key)
    texts = [value] if one and isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, f"'{key}' must be {'a string or ' if one else ''}a non-empty list of strings", param=key)
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ApiError(400, f"'{key}' contains an empty string ({key}[{empty[0]}])", param=key)
    return [_text(t, key) for t in texts]


@dataclass(frozen=True)
class Ranking:
    """A rerank request: the query, its documents, how many results to answer (0: all), whether with their text."""

    query: str
    documents: list[str]
    top_n: int = 0
    return_documents: bool = True


def rerank_request(body: dict[str, Any]) -> Ranking:
    """POST /v1/rerank's body (Cohere / Jina, as vLLM serves it): `query`, `documents` (strings, or `{"text": ...}`
    objects as Cohere's v1 takes them), optional `top_n`
    (0 or absent: every document) and `return_documents` (default true)."""
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ApiError(400, "'query' must be a non-empty string", param="query")
    documents = body.get("documents")
    if isinstance(documents, list):  # Cohere's v1 shape too: {"text": ...} per document
        documents = [d["text"] if isinstance(d, dict) and isinstance(d.get("text"), str) and len(d) == 1 else d for d in documents]
    documents = _texts({"documents": documents}, "documents", one=False)
    top_n = _number(body, "top_n", int, 0, 2**31 - 1) or 0
    return_documents = flag(body, "return_documents") if body.get("return_documents") is not None else True
    return Ranking(_text(query, "query"), documents, top_n, return_documents)


def score_pairs(body: dict[str, Any]) -> list[tuple[str, str]]:
    """POST /v1/score's body (vLLM's): `text_1` and `text_2`, each a string or a list; one text_1 is paired with every
    text_2 (1 -> N), else the lists pair up by position (N -> N) and must be as long."""
    firsts, seconds = _texts(body, "text_1"), _texts(body, "text_2")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        message = f"'text_1' has {len(firsts)} texts and 'text_2' {len(seconds)}: give one text_1, or as many as text_2"
        raise ApiError(400, message, param="text_1")
    return list(zip(firsts, seconds))


PREDICT_OPTIONS = {  # the request options each task's :predict takes (named as the model's inputs)
    interface.AGGREGATION_STRATEGY: interface.TOKEN_CLASSIFICATION,
    interface.STRIDE: interface.TOKEN_CLASSIFICATION,
    interface.TOP_K: interface.FILL_MASK,
}
# transformers' pipeline options this server does not serve: refused by name, never silently ignored
UNSERVED_PIPELINE_OPTIONS = ("targets", "function_to_apply", "ignore_labels", "multi_label", "candidate_labels", "hypothesis_template")


def predict_request(body: dict[str, Any], task: str) -> tuple[list[str], dict[str, Any]]:
    """POST /v1/models/{model}:predict's body (KServe's V1 protocol): `instances`, the texts; the task's options as
    fields of their own or in `parameters` (as the Inference API sends them) -- token-classification:
    `aggregation_strategy`, `stride` (-1: no windows); fill-mask: `top_k`. Another task's option is a 400, and so is a
    pipeline option this server does not serve."""
    texts = _texts(body, "instances", one=False)
    parameters = body.get("parameters")
    parameters = {} if parameters is None else parameters
    if not isinstance(parameters, dict):
        raise ApiError(400, "'parameters' must be an object of options", param="parameters")
    unknown = sorted(set(parameters) - set(PREDICT_OPTIONS))
    if unknown or (unserved := [key for key in UNSERVED_PIPELINE_OPTIONS if key in body]):
        key = unknown[0] if unknown else unserved[0]
        served = ", ".join(name for name, owner in PREDICT_OPTIONS.items() if owner == task) or "none"
        raise ApiError(400, f"'{key}' is not an option this server takes for {task} (it takes: {served})", param=key)
    fields = {**parameters, **{key: body[key] for key in PREDICT_OPTIONS if body.get(key) is not None}}
    for key, option_task in PREDICT_OPTIONS.items():
        if fields.get(key) is not None and option_task != task:
            raise ApiError(400, f"'{key}' applies to {option_task} models, not {task}", param=key)
    options: dict[str, Any] = {}
    strategy = fields.get(interface.AGGREGATION_STRATEGY)
    if strategy is not None:
        if not isinstance(strategy, str) or strategy.lower() not in interface.AGGREGATION_STRATEGIES:
            allowed = ", ".join(interface.AGGREGATION_STRATEGIES)
            message = f"'aggregation_strategy' must be one of {allowed}, got {json.dumps(strategy)[:40]}"
            raise ApiError(400, message, param=interface.AGGREGATION_STRATEGY)
        options[interface.AGGREGATION_STRATEGY] = strategy.lower()
    stride = _number(fields, interface.STRIDE, int, interface.NO_STRIDE, 2**31 - 1)  # the model checks it against its window
    if stride is not None:
        options[interface.STRIDE] = stride
    top_k = _number(fields, interface.TOP_K, int, *interface.FILL_MASK_TOP_K_RANGE)
    if top_k is not None:
        options[interface.TOP_K] = top_k
    return texts, options


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in value)


def completion_prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """/v1/completions' `prompt`: a string, token ids (taken as they are, no chat template), or a list of either --
    one choice per prompt, in order (lm-eval's local-completions sends lists of token ids)."""
    # accepted by OpenAI's /v1/completions, not done here: refused, never silently ignored
    if body.get("best_of") not in (None, 1):
        raise ApiError(400, "'best_of' is not supported by this server (only 1)", param="best_of")
    if body.get("suffix") not in (None, ""):
        raise ApiError(400, "'suffix' is not supported by this server", param="suffix")
    raw = body.get("prompt")
    prompts = [raw] if isinstance(raw, str) or _token_ids(raw) else raw
    shape = "a non-empty string, a list of token ids, or a list of either"
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p.strip() or _token_ids(p) for p in prompts):
        raise ApiError(400, f"'prompt' must be {shape}", param="prompt")
    return [_text(p, "prompt") if isinstance(p, str) else p for p in prompts]


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


def total_usage(finals: list[dict[str, Any]], samples: int) -> dict[str, int]:
    """A request's usage over its choices (`samples` per prompt, in order): each prompt counted once, as vLLM does."""
    prompt = sum(final.get("prompt_tokens", 0) for final in finals[::samples])
    return usage({"prompt_tokens": prompt, "completion_tokens": sum(final.get("completion_tokens", 0) for final in finals)})


def completion_answer(
    head: dict[str, Any], chat: bool, choices: list[tuple[str | dict, dict, dict | None]], samples: int = 1
) -> dict[str, Any]:
    """The whole answer: `choices` = (text -- or, chat, the message's fields: content and tool_calls --, final info,
    logprobs object or None) in index order."""
    out = []
    for index, (answer, final, logprobs) in enumerate(choices):
        ending = {"finish_reason": final.get("finish_reason"), "logprobs": logprobs}
        fields = answer if isinstance(answer, dict) else {"content": answer}
        content = {"message": {"role": "assistant", **fields}} if chat else {"text": answer}
        out.append({"index": index, **content, **ending})
    return {**head, "choices": out, "usage": total_usage([final for _, final, _ in choices], samples)}


def completion_chunk(
    head: dict[str, Any], chat: bool, piece: str | dict, info: dict | None, role: bool = False, index: int = 0, logprobs: dict | None = None
) -> dict[str, Any]:
    """One streamed event of choice `index`: a piece of text (chat: or a delta's fields, e.g. its tool_calls), with
    its tokens' log-probabilities when asked, the finish reason on the last one."""
    if chat:
        fields = piece if isinstance(piece, dict) else ({"content": piece} if piece or role else {})
        delta = {"role": "assistant", **fields} if role else fields
        choice = {"index": index, "delta": delta, "finish_reason": info and info["finish_reason"], "logprobs": logprobs}
    else:
        choice = {"index": index, "text": piece, "finish_reason": info and info["finish_reason"], "logprobs": logprobs}
    return {**head, "object": f"{head['object']}.chunk" if chat else head["object"], "choices": [choice]}


def usage_chunk(head: dict[str, Any], chat: bool, finals: list[dict[str, Any]], samples: int = 1) -> dict[str, Any]:
    return {**completion_chunk(head, chat, "", None), "choices": [], "usage": total_usage(finals, samples)}


class ChoiceLogprobs:
    """One choice's text and log-probabilities in OpenAI's shapes, piece by piece, from the model's TOKEN_LOGPROBS
    (interface.py): chat's `{"content": [{token, logprob, bytes, top_logprobs}]}` (`top` alternatives each);
    completions' `{tokens, token_logprobs, top_logprobs, text_offset}` where an echo starts with the prompt's tokens
    (the first's logprob and alternatives null) and each token's `top_logprobs` maps the alternatives and the token
    itself to their log-probabilities (vLLM's shape; lm-eval's local-completions reads it)."""

    def __init__(self, chat: bool, reported: bool):
        self.chat, self.reported = chat, reported
        self.offset = 0  # completions: characters before the next token (its text_offset)

    def piece(self, text: str, logprobs: dict | None) -> tuple[str, dict | None]:
        """A piece's text (an echo's first: after the prompt's text) and its tokens' log-probabilities object."""
        if logprobs is None:
            return text, None
        text = logprobs.get("prompt_text", "") + text
        entries = [*logprobs.get("prompt", ()), *logprobs["tokens"]]
        if not self.reported:
            return text, None
        if self.chat:
            return text, {"content": [self._chat_entry(entry, True) for entry in entries]}
        offsets = []
        for entry in entries:
            offsets.append(self.offset)
            self.offset += len(entry["token"])
        tops = [None if entry["logprob"] is None else self._completion_top(entry) for entry in entries]
        found = {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries], "top_logprobs": tops}
        return text, {**found, "text_offset": offsets}

    @staticmethod
    def _completion_top(entry: dict) -> dict[str, float]:
        top = {alternative["token"]: alternative["logprob"] for alternative in entry["top"]}
        top.setdefault(entry["token"], entry["logprob"])
        return top

    @classmethod
    def _chat_entry(cls, entry: dict, with_top: bool) -> dict[str, Any]:
        token = {"token": entry["token"], "logprob": entry["logprob"], "bytes": list(entry["token"].encode("utf-8"))}
        return {**token, "top_logprobs": [cls._chat_entry(t, False) for t in entry["top"]]} if with_top else token

    def merged(self, objects: list[dict | None]) -> dict | None:
        """The log-probabilities objects of a choice's pieces as one (a whole answer)."""
        found = [item for item in objects if item is not None]
        if not found:
            return None
        return {key: [value for item in found for value in item[key]] for key in found[0]}


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


def score_answer(answer_id: str, model: str, scores: np.ndarray, tokens: int) -> dict[str, Any]:
    """vLLM's score answer: one score per pair, in the pairs' order."""
    data = [{"index": i, "object": "score", "score": float(score)} for i, score in enumerate(scores)]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
    return {"id": answer_id, "object": "list", "created": int(time.time()), "model": model, "data": data, "usage": usage}


def model_card(model: ServedModel, created: int) -> dict[str, Any]:
    card = {"id": model.name, "object": "model", "created": created, "owned_by": "hf2triton", "task": model.task}
    if model.task in interface.GENERATIVE_TASKS:
        card["max_tokens"] = model.max_new_tokens  # the range max_tokens is checked against (the playground's field)
    return card


def model_status(model: ServedModel) -> dict[str, Any]:
    """hf2triton's own: what /v1/status says of a model."""
    return {
        "id": model.name, "task": model.task, "backend": model.backend, "device": model.device, "instances": model.instances,
        "max_batch_size": None if model.streaming else model.max_batch_size, "streaming": model.streaming,
        "max_sequences": model.max_sequences or None,
    }  # fmt: skip
