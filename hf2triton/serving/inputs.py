"""A request's inputs decoded and checked, shared by every task and engine: texts (strict UTF-8, not empty),
stop strings, per-request generation options, chat messages and a streaming prompt's token ids. A problem with
one request raises `RequestError`: that request gets an error response of its own, the rest of the batch is
unaffected. Copied next to model.py into every rendered model (numpy + the standard library).
"""

from __future__ import annotations

import json
import math
import unicodedata
from typing import Any

import numpy as np

from . import interface
from .batching.sequences import Guided


class RequestError(ValueError):
    """A problem with one request; it gets an error response, the rest of the batch is unaffected."""


def _utf8(item: Any, name: str, what: str, max_bytes: int, limit: str) -> str:
    """One string of a BYTES tensor (Triton hands them over as bytes objects): size checked, strict UTF-8."""
    raw = item.encode("utf-8") if isinstance(item, str) else item
    if not isinstance(raw, (bytes, np.bytes_)):
        raise RequestError(f"input '{name}' must be BYTES (UTF-8 text), got {type(item).__name__}")
    if len(raw) > max_bytes:
        raise RequestError(f"{what} of {len(raw)} bytes exceeds {limit}")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(f"{what} is not valid UTF-8 (byte {err.start})") from None


def check_request_size(values: np.ndarray, params: Any, what: str = "text") -> None:
    """A request's texts (images, audios: `what`) within max_texts_per_request and max_request_bytes, checked before
    decoding anything."""
    if values.size > params.max_texts_per_request:
        raise RequestError(f"{values.size} {what}s exceed max_texts_per_request={params.max_texts_per_request}; split the request")
    total = sum(len(item) for item in values.reshape(-1))
    if total > params.max_request_bytes:
        raise RequestError(f"{total} bytes of {what} exceed max_request_bytes={params.max_request_bytes}; split the request")


def decode_texts(values: np.ndarray, max_bytes: int) -> list[str]:
    """The texts of a request, refusing empty ones (empty: nothing left once whitespace and control/format
    characters -- NUL, zero-width space/joiners, BOM, soft hyphen -- are removed: tokenizers drop or ignore
    them, so there would be no text to embed)."""

    def _visible(text: str) -> bool:
        return any(not c.isspace() and unicodedata.category(c) not in ("Cc", "Cf") for c in text)

    texts = []
    for item in values.reshape(-1):
        text = _utf8(item, interface.TEXT, "text", max_bytes, f"max_input_bytes={max_bytes}")
        if not _visible(text):
            raise RequestError("text is empty")
        texts.append(text)
    if not texts:
        raise RequestError("request holds no text")
    return texts


MAX_STOP_BYTES = 1024


def stop_strings(values: np.ndarray) -> tuple[str, ...]:
    """The `stop` strings: any text but the empty one ("\n", the most common stop string, is whitespace)."""
    stops = tuple(_utf8(v, interface.STOP, "stop string", MAX_STOP_BYTES, f"{MAX_STOP_BYTES} bytes") for v in values.reshape(-1))
    if "" in stops:
        raise RequestError(f"'{interface.STOP}' holds an empty string: every stop string needs at least one character")
    if len(stops) > interface.MAX_STOPS:
        raise RequestError(f"'{interface.STOP}' holds {len(stops)} strings: at most {interface.MAX_STOPS}")
    return stops


def _one_flag(raw: Any, name: str) -> bool:
    """The one value of a BOOL option tensor."""
    return bool(_one_value(raw, name, int, (0, 1)))


def unasked_max_new_tokens(open_ended: Any, default: int, limit: int, room: int) -> int:
    """A request's answer length when it sent no max_new_tokens: `default` (generation.max_new_tokens), or with
    OPEN_ENDED `limit` (the per-request cap), either cut to the `room` its prompt leaves in the context (vLLM's rule:
    a prompt that fits is never refused for a length its client did not ask)."""
    wanted = limit if open_ended is not None and _one_flag(open_ended, interface.OPEN_ENDED) else default
    return min(wanted, room)


def _one_value(raw: Any, name: str, kind: type, bounds: tuple, problem=None) -> Any:
    """The one value of an option tensor, checked against `bounds` (or `problem(value)`: why not allowed)."""
    values = {kind(v) for v in np.asarray(raw).reshape(-1)}
    if len(values) != 1:
        raise RequestError(f"{name} must hold one value per request")
    value = values.pop()
    low, high = bounds
    message = problem(value) if problem is not None else None
    if message is None and not (math.isfinite(value) and low <= value <= high):
        message = f"{name}={value} must be a finite number between {low} and {high}"
    if message:
        raise RequestError(message)
    return value


def generation_options(raw: dict[str, Any], defaults: dict[str, Any], nothing_generated: bool = False) -> dict[str, Any]:
    """Per-request max_new_tokens / temperature, checked; missing values take the configured defaults.
    `nothing_generated`: max_new_tokens may be 0 (a request for its prompt's log-probabilities only)."""
    options = dict(defaults)
    if raw.get(interface.MAX_NEW_TOKENS) is not None:
        low, high = interface.MAX_NEW_TOKENS_RANGE
        options[interface.MAX_NEW_TOKENS] = _one_value(
            raw[interface.MAX_NEW_TOKENS], interface.MAX_NEW_TOKENS, int, (0 if nothing_generated else low, high)
        )
    if raw.get(interface.TEMPERATURE) is not None:
        # 0 (greedy) or MIN_TEMPERATURE..100: sampling divides by it, so a denormal like 1e-45 would give NaN
        options[interface.TEMPERATURE] = _one_value(
            raw[interface.TEMPERATURE], interface.TEMPERATURE, float, interface.TEMPERATURE_RANGE, interface.temperature_problem
        )
    return options


def _stride_problem(value: int) -> str | None:
    if value >= interface.NO_STRIDE:
        return None
    name, none = interface.STRIDE, interface.NO_STRIDE
    return f"{name}={value} is negative: send the tokens consecutive windows share (0 or more), or {none} for none (truncate)"


def token_classification_options(raw: Any, raw_stride: Any = None, default_stride: int = interface.NO_STRIDE) -> dict[str, Any]:
    """A token-classification request's `aggregation_strategy` (one of the pipeline's, any case; default simple) and
    `stride` (default: the model's; the engine checks it against its window)."""
    name = interface.AGGREGATION_STRATEGY
    stride = default_stride
    if raw_stride is not None:
        stride = _one_value(raw_stride, interface.STRIDE, int, (interface.NO_STRIDE, 2**31 - 1), _stride_problem)
    if raw is None:
        return {name: interface.DEFAULT_AGGREGATION_STRATEGY, interface.STRIDE: stride}
    values = {_utf8(v, name, name, 64, "64 bytes").strip().lower() for v in np.asarray(raw).reshape(-1)}
    if len(values) != 1:
        raise RequestError(f"{name} must hold one value per request")
    value = values.pop()
    if value not in interface.AGGREGATION_STRATEGIES:
        raise RequestError(f"{name}={value!r} is not allowed: use one of {', '.join(interface.AGGREGATION_STRATEGIES)}")
    return {name: value, interface.STRIDE: stride}


def fill_mask_options(raw: Any) -> dict[str, Any]:
    """A fill-mask request's `top_k`: candidates per text (default 5, as the pipeline; FILL_MASK_TOP_K_RANGE)."""
    if raw is None:
        return {interface.TOP_K: interface.DEFAULT_FILL_MASK_TOP_K}
    return {interface.TOP_K: _one_value(raw, interface.TOP_K, int, interface.FILL_MASK_TOP_K_RANGE)}


def text_ranking_options(raw: Any, max_bytes: int) -> dict[str, Any]:
    """A text-ranking request's `query` (required, one value per request, not empty; max_input_bytes as a text)."""
    name = interface.QUERY
    if raw is None:
        raise RequestError(f"input '{name}' is missing: a text-ranking request ranks its texts against one query")
    values = {_utf8(v, name, name, max_bytes, f"max_input_bytes={max_bytes}") for v in np.asarray(raw).reshape(-1)}
    if len(values) != 1:
        raise RequestError(f"{name} must hold one value per request")
    value = values.pop()
    if not value.strip():
        raise RequestError(f"{name} is empty")
    return {name: value}


def embedding_options(raw: Any, prompt_names: tuple[str, ...]) -> dict[str, Any]:
    """A feature-extraction request's `prompt_name`: one of the model's prompts, one value per request (absent: none
    sent, the model's default_prompt_name applies)."""
    if raw is None:
        return {}
    name = interface.PROMPT_NAME
    values = {_utf8(v, name, name, 256, "256 bytes") for v in np.asarray(raw).reshape(-1)}
    if len(values) != 1:
        raise RequestError(f"{name} must hold one value per request")
    value = values.pop()
    if value not in prompt_names:
        raise RequestError(f"{name}={value!r} is not one of this model's prompts: {', '.join(prompt_names)}")
    return {name: value}


def chat_prompt(tokenizer, messages_json: list[str], tools_json: list[str] | None = None) -> str:
    """The chat template over `messages` (one JSON list of {"role", "content"}) and `tools` (one JSON list of OpenAI
    tool objects, or None), ready for the answer."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise RequestError(f"this model has no chat template: send '{interface.TEXT}' instead of '{interface.MESSAGES}'")
    messages = chat_messages(messages_json)
    tools = chat_tools(tools_json) if tools_json is not None else None
    # a template that never names `tools` would drop them silently: the model would answer as if it had none
    sources = template.values() if isinstance(template, dict) else [template]
    if tools and not any("tools" in source for source in sources):
        raise RequestError(
            f"the chat template of model {tokenizer.name_or_path} does not render tools (it never mentions `tools`): "
            "give the model a chat template with tool support (its tokenizer_config.json's chat_template) or send no tools"
        )
    import jinja2  # transformers' template engine: a template's raise_exception() and errors are the request's

    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    except jinja2.TemplateError as err:
        raise RequestError(f"the chat template refused the messages: {err}") from None


def _one_json(values: list[str], name: str) -> Any:
    if len(values) != 1:
        raise RequestError(f"'{name}' takes one JSON list per request, got {len(values)}")
    try:
        return json.loads(values[0])
    except ValueError as err:
        raise RequestError(f"'{name}' is not valid JSON ({err})") from None


def chat_tools(tools_json: list[str]) -> list[dict[str, Any]]:
    """`tools` (one JSON list of {"type": "function", "function": {"name", ...}} per request) checked."""
    tools = _one_json(tools_json, interface.TOOLS)
    shape = '{"type": "function", "function": {"name": ..., "parameters": {...}}}'
    if not isinstance(tools, list):
        raise RequestError(f"'{interface.TOOLS}' must be a JSON list of {shape}")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function" or not isinstance(function.get("name"), str):
            raise RequestError(f"tools[{index}] must be {shape}, got {str(tool)[:80]}")
    return tools


def _tool_calls(calls: Any, index: int) -> list[dict[str, Any]]:
    """An assistant message's tool calls as chat templates expect them: each function's `arguments` a dict (OpenAI
    sends its JSON text; vLLM hands templates the parsed object too); text that is no JSON object stays as it is."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls):
        raise RequestError(
            f'messages[{index}].tool_calls must be a list of {{"id", "type": "function", "function": {{"name", "arguments"}}}}'
        )
    out = []
    for call in calls:
        function = dict(call["function"])
        if isinstance(function.get("arguments"), str):
            try:
                parsed = json.loads(function["arguments"])
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                function["arguments"] = parsed
        out.append({**call, "function": function})
    return out


def chat_messages(messages_json: list[str]) -> list[dict[str, Any]]:
    """`messages` (one JSON list of {"role", "content"} per request) checked: role and content of each; an assistant's
    `tool_calls` (its content may then be null), a tool result's `tool_call_id` and `name`, kept for the template."""
    messages = _one_json(messages_json, interface.MESSAGES)
    if not isinstance(messages, list) or not messages:
        raise RequestError(f"'{interface.MESSAGES}' must be a non-empty JSON list of {{role, content}}")
    out = []
    for index, message in enumerate(messages):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if calls and message.get("role") == "assistant" and content is None:
            content = ""
        if not isinstance(message, dict) or message.get("role") not in interface.CHAT_ROLES or not isinstance(content, str):
            roles = "/".join(interface.CHAT_ROLES)
            raise RequestError(f'messages[{index}] must be {{"role": {roles}, "content": a string}}, got {str(message)[:80]}')
        item: dict[str, Any] = {"role": message["role"], "content": content}
        if calls:
            item["tool_calls"] = _tool_calls(calls, index)
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                item[key] = message[key]
        out.append(item)
    return out


def sampling_values(raw: dict[str, Any], options: dict[str, Any], params: Any) -> dict[str, Any]:
    """A streaming request's decoding options (the fields of batching's `Sampling`): max_new_tokens / temperature
    as `generation_options` checked them, within generation.max_new_tokens_limit, and top_p / top_k / seed / stop /
    logprobs / guided from `raw` (tensor name -> array, None when not sent), checked with clear errors."""
    values = {
        "max_new_tokens": options[interface.MAX_NEW_TOKENS],
        "temperature": options[interface.TEMPERATURE],
        "time_limit_s": params.time_limit_s,
    }
    if values["max_new_tokens"] > params.max_new_tokens_limit:
        raise RequestError(
            f"max_new_tokens={values['max_new_tokens']} exceeds generation.max_new_tokens_limit={params.max_new_tokens_limit}"
        )
    if raw.get(interface.TOP_P) is not None:
        values["top_p"] = _one_value(raw[interface.TOP_P], interface.TOP_P, float, interface.TOP_P_RANGE)
    if raw.get(interface.TOP_K) is not None:
        values["top_k"] = _one_value(raw[interface.TOP_K], interface.TOP_K, int, interface.TOP_K_RANGE)
    for name in (interface.PRESENCE_PENALTY, interface.FREQUENCY_PENALTY):
        if raw.get(name) is not None:
            values[name] = _one_value(raw[name], name, float, interface.PENALTY_RANGE)
    if raw.get(interface.IGNORE_EOS) is not None:
        values["ignore_eos"] = _one_flag(raw[interface.IGNORE_EOS], interface.IGNORE_EOS)
    if raw.get(interface.SEED) is not None:
        values["seed"] = _one_value(raw[interface.SEED], interface.SEED, int, interface.SEED_RANGE)
    if raw.get(interface.STOP) is not None:
        values["stop"] = stop_strings(raw[interface.STOP])
    if raw.get(interface.LOGPROBS) is not None:
        logprobs = _one_value(raw[interface.LOGPROBS], interface.LOGPROBS, int, (interface.NO_LOGPROBS, interface.MAX_LOGPROBS))
        values["logprobs"] = logprobs
    if raw.get(interface.PROMPT_LOGPROBS) is not None:
        values["prompt_logprobs"] = _one_flag(raw[interface.PROMPT_LOGPROBS], interface.PROMPT_LOGPROBS)
    if raw.get(interface.GUIDED) is not None:
        values["guided"] = guided_option(raw[interface.GUIDED], params.max_input_bytes)
    return values


GUIDED_VALUES = {  # what each kind's value must be (interface.GUIDED)
    "json_schema": (dict, "a JSON schema (an object)"),
    "json_object": (type(None), "null"),
    "regex": (str, "a regular expression (a string)"),
    "choice": (list, "a non-empty list of strings"),
    "grammar": (str, "an EBNF grammar (a string, `root ::= ...`)"),
}


def guided_option(raw: Any, max_bytes: int) -> Guided | None:
    """A streaming request's GUIDED input (one JSON object {"kind", "value"}; None when not sent), its shape checked;
    whether the grammar compiles is the batcher's check (batching/grammar.py) or vLLM's."""
    if raw is None:
        return None
    name = interface.GUIDED
    values = [_utf8(v, name, name, max_bytes, f"max_input_bytes={max_bytes}") for v in np.asarray(raw).reshape(-1)]
    if len(values) != 1:
        raise RequestError(f"'{name}' takes one JSON object per request, got {len(values)}")
    try:
        spec = json.loads(values[0])
    except ValueError as err:
        raise RequestError(f"'{name}' is not valid JSON ({err})") from None
    kinds = ", ".join(interface.GUIDED_KINDS)
    if not isinstance(spec, dict) or spec.get("kind") not in interface.GUIDED_KINDS:
        raise RequestError(f'\'{name}\' must be a JSON object {{"kind": one of {kinds}, "value": ...}}, got {values[0][:80]}')
    kind, value = spec["kind"], spec.get("value")
    expected, what = GUIDED_VALUES[kind]
    wrong = not isinstance(value, expected) or (kind == "choice" and not (value and all(isinstance(c, str) for c in value)))
    if wrong or (isinstance(value, str) and not value):
        raise RequestError(f"'{name}' of kind {kind} takes as value {what}, got {json.dumps(value)[:80]}")
    return Guided(kind, value)


def is_set(raw: Any) -> bool:
    """Whether an optional BOOL input is sent and true (absent: False)."""
    return raw is not None and bool(np.asarray(raw).reshape(-1).any())


def asks_prompt_logprobs(raw: Any) -> bool:
    """Whether a request's PROMPT_LOGPROBS input is set (before its other options are checked)."""
    return is_set(raw)


def token_id_prompt(raw: np.ndarray, vocabulary: int) -> list[int]:
    """A prompt sent as token ids (PROMPT_IDS): taken as they are, each a token of the model's vocabulary."""
    ids = [int(v) for v in np.asarray(raw).reshape(-1)]
    if not ids:
        raise RequestError(f"'{interface.PROMPT_IDS}' is empty")
    wrong = next((i for i in ids if not 0 <= i < vocabulary), None)
    if wrong is not None:
        raise RequestError(f"'{interface.PROMPT_IDS}' holds {wrong}, not a token of this model (0..{vocabulary - 1})")
    return ids


def prompt_ids(
    engine: Any,
    text: np.ndarray | None,
    messages: np.ndarray | None,
    max_bytes: int,
    max_new_tokens: int,
    ids: np.ndarray | None = None,
    tools: np.ndarray | None = None,
    raw: np.ndarray | None = None,
) -> list[int]:
    """A streaming request's prompt as token ids, from `text` (the engine's chat template applied as configured; with
    `raw` true, never: interface.RAW_PROMPT), `messages` with `tools` (the engine's `chat_prompt`) or `ids` (as they
    are); the engine checks that it and max_new_tokens fit its context."""
    if tools is not None and messages is None:
        raise RequestError(f"'{interface.TOOLS}' goes with '{interface.MESSAGES}' (the chat template renders them)")
    if (text is not None) + (messages is not None) + (ids is not None) != 1:
        raise RequestError(
            f"send one of '{interface.TEXT}', '{interface.MESSAGES}' (a JSON list of {{role, content}}) or '{interface.PROMPT_IDS}'"
        )
    if ids is not None:
        tokens = token_id_prompt(ids, len(engine.tokenizer))
        engine.check_length(len(tokens), max_new_tokens)
        return tokens
    if text is not None:
        texts = decode_texts(text, max_bytes)
        if len(texts) != 1:
            raise RequestError(f"a streaming model takes one prompt per request, got {len(texts)}")
        as_is = raw is not None and _one_flag(raw, interface.RAW_PROMPT)
        ids = engine.text_ids(texts[0], raw=as_is)
    else:
        if raw is not None:
            raise RequestError(f"'{interface.RAW_PROMPT}' goes with '{interface.TEXT}' (messages always take the chat template)")
        tools_json = decode_texts(tools, max_bytes) if tools is not None else None
        ids = engine.token_ids(engine.chat_prompt(decode_texts(messages, max_bytes), tools_json))
    if not ids:  # a text of tokens the tokenizer drops: nothing for the model to continue
        raise RequestError("the prompt encodes to no tokens: send text the model's tokenizer keeps")
    engine.check_length(len(ids), max_new_tokens)
    return ids


def _one_string(raw: Any, name: str, max_bytes: int) -> str:
    values = {_utf8(v, name, name, max_bytes, f"max_input_bytes={max_bytes}") for v in np.asarray(raw).reshape(-1)}
    if len(values) != 1:
        raise RequestError(f"{name} must hold one value per request")
    return values.pop()


def image_classification_options(raw_top_k: Any, raw_function: Any) -> dict[str, Any]:
    """An image-classification request's `top_k` (labels per image, default the pipeline's 5; more than the model has:
    all of them, as the pipeline) and `function_to_apply` (the pipeline's: default, sigmoid, softmax, none)."""
    top_k = interface.DEFAULT_IMAGE_TOP_K
    if raw_top_k is not None:
        top_k = _one_value(raw_top_k, interface.TOP_K, int, interface.IMAGE_TOP_K_RANGE)
    function = "default"
    if raw_function is not None:
        function = _one_string(raw_function, interface.FUNCTION_TO_APPLY, 64).strip().lower()
        if function not in interface.FUNCTIONS_TO_APPLY:
            allowed = ", ".join(interface.FUNCTIONS_TO_APPLY)
            raise RequestError(f"{interface.FUNCTION_TO_APPLY}={function!r} is not allowed: use one of {allowed}")
    return {interface.TOP_K: top_k, interface.FUNCTION_TO_APPLY: function}


def zero_shot_image_options(raw_labels: Any, raw_template: Any, max_bytes: int) -> dict[str, Any]:
    """A zero-shot-image-classification request's `candidate_labels` (needed: a JSON list of 1..MAX_CANDIDATE_LABELS
    distinct, non-empty strings; a tuple, so requests with the same labels share one pass) and `hypothesis_template`
    (default the pipeline's "This is a photo of {}."; it must hold `{}`, where each label goes)."""
    name = interface.CANDIDATE_LABELS
    if raw_labels is None:
        raise RequestError(f"input '{name}' is missing: send the labels to choose from as a JSON list of strings")
    text = _one_string(raw_labels, name, max_bytes)
    try:
        labels = json.loads(text)
    except ValueError:
        labels = None
    if not isinstance(labels, list) or not labels or not all(isinstance(label, str) and label.strip() for label in labels):
        raise RequestError(f'{name} must be a JSON list of non-empty strings, e.g. ["cat", "dog"]; got {text[:80]!r}')
    if len(labels) > interface.MAX_CANDIDATE_LABELS:
        raise RequestError(f"{name} holds {len(labels)} labels, more than {interface.MAX_CANDIDATE_LABELS}: split the request")
    template = interface.DEFAULT_HYPOTHESIS_TEMPLATE
    if raw_template is not None:
        template = _one_string(raw_template, interface.HYPOTHESIS_TEMPLATE, max_bytes)
        if "{}" not in template:
            raise RequestError(f"{interface.HYPOTHESIS_TEMPLATE}={template[:80]!r} must hold {{}} where each label goes")
        try:
            template.format("x")
        except (IndexError, KeyError, ValueError):
            raise RequestError(f"{interface.HYPOTHESIS_TEMPLATE}={template[:80]!r}: only one {{}} and no other braces") from None
    return {name: tuple(labels), interface.HYPOTHESIS_TEMPLATE: template}


# a Whisper prompt is at most half the decoder's 448 positions: 4 KiB of text is more than that in any tokenizer
MAX_SPEECH_PROMPT_BYTES = 4096


def speech_options(
    raw_language: Any, raw_task: Any, raw_timestamps: Any, raw_words: Any = None, raw_prompt: Any = None, raw_temperature: Any = None
) -> dict[str, Any]:
    """An automatic-speech-recognition request's `language` (a code, or a name Whisper knows: "english" -> "en"; "":
    the model detects it), `task` (transcribe | translate; "": none sent, the model's generation config decides, as
    the pipeline's default), `return_timestamps` (the pipeline's chunks), `word_timestamps` (its word chunks),
    `prompt` (the text the decoder continues from; "": none) and `temperature` (0: the pipeline's decoding)."""
    language = ""
    if raw_language is not None:
        language = _one_string(raw_language, interface.LANGUAGE, 64).strip().lower()
        if len(language) > 3:  # a name: Whisper's own table of names to codes
            from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

            language = TO_LANGUAGE_CODE.get(language, language)
    task = ""
    if raw_task is not None:
        task = _one_string(raw_task, interface.SPEECH_TASK, 64).strip().lower()
        if task not in interface.SPEECH_TASKS:
            raise RequestError(f"{interface.SPEECH_TASK}={task!r} is not allowed: use one of {', '.join(interface.SPEECH_TASKS)}")
    prompt = "" if raw_prompt is None else _one_string(raw_prompt, interface.SPEECH_PROMPT, MAX_SPEECH_PROMPT_BYTES).strip()
    return {
        interface.LANGUAGE: language,
        interface.SPEECH_TASK: task,
        interface.RETURN_TIMESTAMPS: is_set(raw_timestamps),
        interface.WORD_TIMESTAMPS: is_set(raw_words),
        interface.SPEECH_PROMPT: prompt,
        interface.TEMPERATURE: 0.0
        if raw_temperature is None
        else _one_value(raw_temperature, interface.TEMPERATURE, float, interface.SPEECH_TEMPERATURE_RANGE),
    }


def raw_sampling_rate(raw: Any) -> int | None:
    """A request's `sampling_rate`: its AUDIO rows are then raw float32 samples at that rate (absent: audio files)."""
    return None if raw is None else _one_value(raw, interface.SAMPLING_RATE, int, interface.SAMPLING_RATE_RANGE)
