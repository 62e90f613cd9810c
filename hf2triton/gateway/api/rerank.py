"""POST /v1/rerank: text-ranking models (cross-encoder rerankers), a query and its documents -> the documents' relevance
scores, best first, in the Cohere / Jina shape vLLM serves."""

from __future__ import annotations

import uuid

import numpy as np
from fastapi import APIRouter, Request

from hf2triton.gateway import protocol
from hf2triton.gateway.backend import Gateway, gateway_of
from hf2triton.gateway.boundary import KEY
from hf2triton.gateway.errors import ApiError
from hf2triton.gateway.protocol import ServedModel
from hf2triton.serving import interface
from hf2triton.triton import client

router = APIRouter()


async def rank(gateway: Gateway, served: ServedModel, ranking: protocol.Ranking) -> tuple[np.ndarray, int]:
    """Each document's relevance to the query (in the documents' order) and the tokens their pairs became."""
    import tritonclient.grpc as grpcclient

    documents = ranking.documents
    if len(documents) > served.max_texts:  # the gateway splits into the model's batches, bypassing its own bound: bounded here
        message = f"'documents' has {len(documents)} documents; at most {served.max_texts} per request: split the request"
        raise ApiError(413, message, param="documents", code="too_large")
    chunk = served.max_batch_size or len(documents)
    options = {interface.QUERY: ranking.query}
    batches = [client.build_inputs(grpcclient, documents[i : i + chunk], options) for i in range(0, len(documents), chunk)]
    scores, tokens = [], 0
    for result in await gateway.infer(served.name, batches):
        scores.append(result.as_numpy(interface.SCORE).reshape(-1))
        tokens += int(result.as_numpy(interface.PROMPT_TOKENS).sum())
    return np.concatenate(scores).astype(np.float32), tokens


@router.post("/v1/rerank", dependencies=KEY)
async def rerank(request: Request):
    gateway, body = gateway_of(request), await protocol.read_body(request)
    served = await gateway.model(body, interface.TEXT_RANKING)
    ranking = protocol.rerank_request(body)
    return protocol.rerank_answer(f"rerank-{uuid.uuid4().hex[:24]}", served.name, ranking, *await rank(gateway, served, ranking))
