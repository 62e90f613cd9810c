"""KServe V1 `POST /v1/models/{model}:predict` for the image tasks: each instance one image, as KServe's (and TensorFlow
Serving's) convention for binary data writes it -- `{"image_bytes": {"b64": "..."}}` -- or `{"b64": "..."}`, or a string
(base64, or a `data:image/...;base64,` URL). The options are the pipeline's: `top_k` / `function_to_apply`
(image-classification), `candidate_labels` / `hypothesis_template` (zero-shot), each in `parameters`, at the top of the
body, or (a per-image choice) in the instance itself. Instances with the same options go to Triton together. Speech
models take their audio files the same way (`{"audio_bytes": {"b64": ...}}` or `{"b64": ...}`), with `language`, `task`,
`return_timestamps`, `word_timestamps`, `prompt` and `temperature`."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from hf2triton.gateway.errors import ApiError
from hf2triton.serving import interface

OPTIONS = {
    interface.IMAGE_CLASSIFICATION: (interface.TOP_K, interface.FUNCTION_TO_APPLY),
    interface.ZERO_SHOT_IMAGE_CLASSIFICATION: (interface.CANDIDATE_LABELS, interface.HYPOTHESIS_TEMPLATE),
    interface.SPEECH_RECOGNITION: interface.SPEECH_OPTION_NAMES,
}
IMAGE_KEYS = ("image_bytes", "audio_bytes", "b64", "image", "audio", "data")


def _image(instance: Any, index: int, field: str = "instances", kind: str = "image") -> bytes:
    """One instance's image (or audio: `kind`) bytes (`field`: the request's field it came in, for the errors)."""
    value = instance
    if isinstance(value, dict):
        value = next((value[key] for key in IMAGE_KEYS if key in value), None)
        if isinstance(value, dict):  # {"image_bytes": {"b64": ...}}
            value = value.get("b64")
    if not isinstance(value, str) or not value:
        example = (
            '{"audio_bytes": {"b64": "<base64 of a WAV or FLAC>"}}'
            if kind == "audio"
            else '{"image_bytes": {"b64": "<base64 of a PNG or JPEG>"}}'
        )
        raise ApiError(400, f"{field}[{index}] must hold an {kind}: {example}", param=field)
    if value.startswith("data:"):
        head, _, value = value.partition(",")
        if ";base64" not in head:
            raise ApiError(400, f"{field}[{index}]: a data URL must be base64 (data:image/png;base64,...)", param=field)
    try:
        return base64.b64decode("".join(value.split()), validate=True)  # line breaks (`base64` without -w0) allowed
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{field}[{index}]: the {kind} is not valid base64", param=field) from None


def _option(task: str, key: str, value: Any) -> Any:
    """One option as the model's request tensor takes it (the server checks its range and meaning)."""
    if key == interface.TOP_K:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(400, f"'{key}' must be an integer, got {str(value)[:40]}", param=key)
        return value
    if key == interface.CANDIDATE_LABELS:
        if isinstance(value, str):  # "cat,dog": the pipeline takes a list; a comma-separated string is accepted too
            value = [label.strip() for label in value.split(",")]
        if not isinstance(value, list) or not all(isinstance(label, str) for label in value):
            raise ApiError(400, f"'{key}' must be a list of strings", param=key)
        return tuple(value)
    if key == interface.TEMPERATURE:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ApiError(400, f"'{key}' must be a number, got {str(value)[:40]}", param=key)
        return float(value)
    if key in (interface.RETURN_TIMESTAMPS, interface.WORD_TIMESTAMPS):
        if not isinstance(value, bool):
            raise ApiError(400, f"'{key}' must be true or false", param=key)
        return value
    if not isinstance(value, str):
        raise ApiError(400, f"'{key}' must be a string", param=key)
    return value


def image_requests(body: dict[str, Any], task: str) -> list[tuple[dict[str, Any], list[int], list[bytes]]]:
    """The body's images grouped by their options: [(options, instance positions, images)], in first-seen order."""
    instances = body.get("instances")
    if not isinstance(instances, list) or not instances:
        what = "audio files" if task == interface.SPEECH_RECOGNITION else "images"
        raise ApiError(400, f"'instances' must be a non-empty list of {what}", param="instances")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ApiError(400, "'parameters' must be an object", param="parameters")
    groups: dict[tuple, tuple[dict[str, Any], list[int], list[bytes]]] = {}
    for index, instance in enumerate(instances):
        options = {}
        for key in OPTIONS[task]:
            sources = (instance if isinstance(instance, dict) else {}, parameters, body)
            value = next((source[key] for source in sources if source.get(key) is not None), None)
            if value is not None:
                options[key] = _option(task, key, value)
        if task == interface.ZERO_SHOT_IMAGE_CLASSIFICATION and interface.CANDIDATE_LABELS not in options:
            message = "'candidate_labels' is required: the labels to choose from, in the instance or in 'parameters'"
            raise ApiError(400, message, param=interface.CANDIDATE_LABELS)
        group = groups.setdefault(tuple(sorted(options.items())), (options, [], []))
        group[1].append(index)
        group[2].append(_image(instance, index, kind="audio" if task == interface.SPEECH_RECOGNITION else "image"))
    return list(groups.values())


def embedding_items(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """/v1/embeddings' `input` for a zero-shot image model (CLIP, SigLIP): a string or a list of items, each a text
    (a string, or {"type": "text", "text": ...}) or an image ({"type": "image_url", "image_url": {"url":
    "data:image/png;base64,..."}}, as OpenAI's chat messages carry images); [("text", str) | ("image", bytes)]. The
    gateway fetches nothing: an http(s) URL is refused."""
    value = body.get("input")
    items = [value] if isinstance(value, (str, dict)) else value
    if not isinstance(items, list) or not items:
        raise ApiError(400, "'input' must be a string, an item or a non-empty list of them", param="input")
    found: list[tuple[str, Any]] = []
    for index, item in enumerate(items):
        text = item if isinstance(item, str) else item.get("text") if isinstance(item, dict) and item.get("type") == "text" else None
        if isinstance(text, str):
            if not text.strip():
                raise ApiError(400, f"input[{index}] is an empty text", param="input")
            found.append(("text", text))
            continue
        url = item.get("image_url") if isinstance(item, dict) and item.get("type") == "image_url" else None
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            raise ApiError(
                400,
                f'input[{index}] must be a text or {{"type": "image_url", "image_url": {{"url": "data:image/png;base64,..."}}}}',
                param="input",
            )
        if not url.startswith("data:"):
            raise ApiError(
                400, f"input[{index}]: the gateway fetches no URLs; send the image as a data URL (data:image/png;base64,...)", param="input"
            )
        found.append(("image", _image(url, index, "input")))
    return found
