"""POST /v1/models/{model}:predict: the tasks whose answer is the transformers pipeline's JSON per text
(token-classification: its entities, fill-mask: its candidates) and text-classification ({label, score}), in KServe's
V1 protocol as its Hugging Face runtime serves them: {"instances": [texts]} -> {"predictions": [one per text]}."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from hf2triton.gateway import protocol
from hf2triton.gateway.backend import gateway_of
from hf2triton.gateway.boundary import KEY
from hf2triton.serving import interface

router = APIRouter()
PREDICT_TASKS = (interface.TOKEN_CLASSIFICATION, interface.FILL_MASK, interface.CLASSIFICATION)
JSON_OUTPUTS = {interface.TOKEN_CLASSIFICATION: interface.ENTITIES, interface.FILL_MASK: interface.CANDIDATES}


def predictions(task: str, result: Any) -> list[Any]:
    """One Triton answer's rows as the pipeline's JSON: the model's own JSON, parsed (not re-derived), or label and score."""
    if task in JSON_OUTPUTS:
        return [json.loads(row) for row in result.as_numpy(JSON_OUTPUTS[task]).reshape(-1)]
    labels, scores = result.as_numpy(interface.LABEL).reshape(-1), result.as_numpy(interface.SCORE).reshape(-1)
    return [{"label": label.decode("utf-8"), "score": float(score)} for label, score in zip(labels, scores)]


@router.post("/v1/models/{model}:predict", dependencies=KEY)
async def predict(request: Request, model: str):
    gateway, body = gateway_of(request), await protocol.read_body(request)
    served = await gateway.model({"model": model}, PREDICT_TASKS)
    texts, options = protocol.predict_request(body, served.task)
    results = await gateway.infer_texts(served, texts, options, "instances")
    return {"predictions": [prediction for result in results for prediction in predictions(served.task, result)]}
