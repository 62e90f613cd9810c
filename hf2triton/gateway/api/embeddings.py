"""POST /v1/embeddings: feature-extraction models, a string or a list of them, vectors as floats or base64; extra field
`prompt_name` (one of the model's prompts), and `dimensions` for Matryoshka models (cut, normalised again). A
zero-shot image model (CLIP, SigLIP): texts and images (`image_url` items with data URLs) in one list."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request

from hf2triton.gateway import protocol
from hf2triton.gateway.backend import Gateway, gateway_of
from hf2triton.gateway.boundary import KEY
from hf2triton.gateway.errors import ApiError
from hf2triton.gateway.images import embedding_items
from hf2triton.gateway.protocol import ServedModel
from hf2triton.gateway.responses import ArrayJSONResponse
from hf2triton.serving import interface
from hf2triton.triton import client

router = APIRouter()

OPENAI_MAX_INPUTS = 2048  # inputs per /v1/embeddings request OpenAI takes


async def embed(
    gateway: Gateway,
    served: ServedModel,
    texts: list[str] | list[bytes],
    prompt_name: str | None = None,
    options: dict | None = None,
    primary: str = interface.TEXT,
) -> tuple[np.ndarray, int]:
    """The texts' embeddings and the tokens they became (the model's own count: no second tokenisation); `options`
    and `primary` (the input the rows go in): a zero-shot image model's images (IMAGE, embed true)."""
    import tritonclient.grpc as grpcclient

    # Bounded here, before anything reaches Triton: by default at OpenAI's own limit, since clients batch up to it
    # (LangChain's OpenAIEmbeddings sends 1,000 texts a request); the model still gets at most its batch per request.
    limit = gateway.max_embedding_inputs or OPENAI_MAX_INPUTS
    if len(texts) > limit:
        message = f"'input' has {len(texts)} texts; at most {limit} per request (openai.max_embedding_inputs): split the request"
        raise ApiError(413, message, param="input", code="too_large")
    chunk = min(served.max_batch_size or served.max_texts, served.max_texts)  # what the model takes per request
    options = {interface.PROMPT_NAME: prompt_name} if prompt_name is not None else options
    batches = [client.build_inputs(grpcclient, texts[i : i + chunk], options, primary=primary) for i in range(0, len(texts), chunk)]
    parts, tokens = [], 0
    for result in await gateway.infer(served.name, batches):
        vectors = result.as_numpy(interface.EMBEDDING)
        parts.append(vectors.reshape(-1, vectors.shape[-1]))
        counts = result.as_numpy(interface.PROMPT_TOKENS)
        tokens += int(counts.sum()) if counts is not None else 0
    return np.concatenate(parts).astype(np.float32), tokens


async def dual_embeddings(gateway: Gateway, served: ServedModel, body: dict) -> tuple[np.ndarray, int]:
    """A zero-shot image model's (CLIP, SigLIP) embeddings of texts and images, in `input`'s order: one pass for the
    texts, one for the images (the vectors they are scored with: comparable with each other)."""
    items = embedding_items(body)
    vectors: list = [None] * len(items)
    tokens = 0
    for kind, options, primary in (("text", None, interface.TEXT), ("image", {interface.EMBED: True}, interface.IMAGE)):
        positions = [i for i, (what, _) in enumerate(items) if what == kind]
        if positions:
            found, counted = await embed(gateway, served, [items[i][1] for i in positions], options=options, primary=primary)
            tokens += counted
            for position, vector in zip(positions, found):
                vectors[position] = vector
    return np.stack(vectors), tokens


@router.post("/v1/embeddings", dependencies=KEY)
async def embeddings(request: Request):
    gateway = gateway_of(request)
    body = await protocol.read_body(request)
    served = await gateway.model(body, (interface.FEATURE_EXTRACTION, interface.ZERO_SHOT_IMAGE_CLASSIFICATION))
    encoding = protocol.embedding_format(body)
    prompt_name, dimensions = protocol.embedding_prompt(body, served), protocol.embedding_dimensions(body, served)
    if served.task == interface.ZERO_SHOT_IMAGE_CLASSIFICATION:
        vectors, tokens = await dual_embeddings(gateway, served, body)
        return ArrayJSONResponse(protocol.embedding_answer(served.name, vectors, tokens, encoding))
    texts = protocol.embedding_inputs(body)
    vectors, tokens = await embed(gateway, served, texts, prompt_name)
    vectors = protocol.matryoshka(vectors, dimensions, served.normalized)
    return ArrayJSONResponse(protocol.embedding_answer(served.name, vectors, tokens, encoding))
