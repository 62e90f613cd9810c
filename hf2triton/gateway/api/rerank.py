"""POST /v1/rerank (also /rerank and /v2/rerank, as vLLM) and /v1/score (also /score): text-ranking models
(cross-encoder rerankers). rerank: a query and its documents -> the documents' relevance scores, best first, in the
Cohere / Jina shape vLLM serves; score: text pairs -> one score each, in vLLM's shape. One Triton call path for both:
a pair's score is the same whichever endpoint asks."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
from fastapi import APIRouter, Request

from hf2triton.gateway import protocol
from hf2triton.gateway.backend import Gateway, bound_texts, gateway_of
from hf2triton.gateway.boundary import KEY
from hf2triton.gateway.protocol import ServedModel
from hf2triton.serving import interface

router = APIRouter()


async def rank(gateway: Gateway, served: ServedModel, query: str, documents: list[str], param: str) -> tuple[np.ndarray, int]:
    """Each document's relevance to the query (in the documents' order) and the tokens their pairs became."""
    results = await gateway.infer_texts(served, documents, {interface.QUERY: query}, param)
    scores = np.concatenate([result.as_numpy(interface.SCORE).reshape(-1) for result in results]).astype(np.float32)
    return scores, sum(int(result.as_numpy(interface.PROMPT_TOKENS).sum()) for result in results)


@router.post("/v1/rerank", dependencies=KEY)
@router.post("/v2/rerank", dependencies=KEY)  # Cohere's v2 client's path
@router.post("/rerank", dependencies=KEY)  # vLLM serves all three
async def rerank(request: Request):
    gateway, body = gateway_of(request), await protocol.read_body(request)
    served = await gateway.model(body, interface.TEXT_RANKING)
    ranking = protocol.rerank_request(body)
    scores, tokens = await rank(gateway, served, ranking.query, ranking.documents, "documents")
    return protocol.rerank_answer(f"rerank-{uuid.uuid4().hex[:24]}", served.name, ranking, scores, tokens)


@router.post("/v1/score", dependencies=KEY)
@router.post("/score", dependencies=KEY)
async def score(request: Request):
    gateway, body = gateway_of(request), await protocol.read_body(request)
    served = await gateway.model(body, interface.TEXT_RANKING)
    pairs = protocol.score_pairs(body)
    bound_texts(served, len(pairs), "text_2")
    # the model ranks documents against one query per request: one ranking per distinct text_1, all at once, each
    # exactly the request /v1/rerank sends for that query and its documents (the same batches, the same scores)
    positions: dict[str, list[int]] = {}
    for index, (first, _) in enumerate(pairs):
        positions.setdefault(first, []).append(index)
    rankings = [rank(gateway, served, first, [pairs[i][1] for i in indexes], "text_2") for first, indexes in positions.items()]
    scores, tokens = np.empty(len(pairs), dtype=np.float32), 0
    for indexes, (ranked, used) in zip(positions.values(), await asyncio.gather(*rankings)):
        scores[indexes], tokens = ranked, tokens + used
    return protocol.score_answer(f"score-{uuid.uuid4().hex[:24]}", served.name, scores, tokens)
