"""POST /v1/models/{model}:predict: the tasks whose answer is the transformers pipeline's JSON per text
(token-classification: its entities, fill-mask: its candidates) and text-classification ({label, score}), in KServe's
V1 protocol as its Hugging Face runtime serves them: {"instances": [texts]} -> {"predictions": [one per text]}; and the
image tasks: {"instances": [{"image_bytes": {"b64": ...}}]} -> per image the pipeline's [{label, score}] (gateway/images.py);
speech: {"instances": [{"audio_bytes": {"b64": ...}}]} -> per audio the pipeline's {text} (with timestamps: and its chunks)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from hf2triton.gateway import protocol
from hf2triton.gateway.backend import gateway_of
from hf2triton.gateway.boundary import KEY
from hf2triton.gateway.images import image_requests
from hf2triton.serving import interface

router = APIRouter()
PREDICT_TASKS = (interface.TOKEN_CLASSIFICATION, interface.FILL_MASK, interface.CLASSIFICATION, *interface.IMAGE_TASKS)
PREDICT_TASKS += (interface.SPEECH_RECOGNITION,)
JSON_OUTPUTS = {interface.TOKEN_CLASSIFICATION: interface.ENTITIES, interface.FILL_MASK: interface.CANDIDATES}


def predictions(task: str, result: Any) -> list[Any]:
    """One Triton answer's rows as the pipeline's JSON: the model's own JSON, parsed (not re-derived), or label and score."""
    if task in JSON_OUTPUTS:
        return [json.loads(row) for row in result.as_numpy(JSON_OUTPUTS[task]).reshape(-1)]
    labels, scores = result.as_numpy(interface.LABEL).reshape(-1), result.as_numpy(interface.SCORE).reshape(-1)
    return [{"label": label.decode("utf-8"), "score": float(score)} for label, score in zip(labels, scores)]


def rows_of(task: str, result: Any, options: dict[str, Any]) -> list[Any]:
    """An image or speech request's answer per row: an image's [{label, score}], an audio's {text} (+ its chunks, its words)."""
    if task != interface.SPEECH_RECOGNITION:
        return [json.loads(row) for row in result.as_numpy(interface.LABELS).reshape(-1)]
    rows = [{"text": text.decode("utf-8")} for text in result.as_numpy(interface.TEXT_OUTPUT).reshape(-1)]
    for name, asked in ((interface.CHUNKS, interface.RETURN_TIMESTAMPS), (interface.WORDS, interface.WORD_TIMESTAMPS)):
        if options.get(asked):  # the pipeline's chunks: segments or words
            for row, value in zip(rows, result.as_numpy(name).reshape(-1)):
                row[name] = json.loads(value)
    return rows


async def image_predictions(gateway: Any, served: Any, body: dict[str, Any]) -> list[Any]:
    """An image model's predictions: its instances grouped by their options, each group in the model's batches, the
    answers put back in the instances' order."""
    answers: list[Any] = [None] * len(body.get("instances") or [])
    for options, positions, images in image_requests(body, served.task):
        results = await gateway.infer_texts(served, images, options, "instances")
        rows = [row for result in results for row in rows_of(served.task, result, options)]
        for position, row in zip(positions, rows):
            answers[position] = row
    return answers


@router.post("/v1/models/{model}:predict", dependencies=KEY)
async def predict(request: Request, model: str):
    gateway, body = gateway_of(request), await protocol.read_body(request)
    served = await gateway.model({"model": model}, PREDICT_TASKS)
    if served.task in interface.IMAGE_TASKS or served.task == interface.SPEECH_RECOGNITION:  # files, base64 in JSON
        return {"predictions": await image_predictions(gateway, served, body)}
    texts, options = protocol.predict_request(body, served.task)
    results = await gateway.infer_texts(served, texts, options, "instances")
    return {"predictions": [prediction for result in results for prediction in predictions(served.task, result)]}
