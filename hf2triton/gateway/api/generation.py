"""POST /v1/chat/completions and /v1/completions: streaming generation models (decoupled in Triton), one prompt
(or the chat's messages, the model's `messages` input) per request, the answer whole or as server-sent events.
A client that leaves (streamed or not, before its first piece as well) cancels the Triton request: the generation
slot is freed within one decoding step."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hf2triton.gateway import protocol
from hf2triton.gateway.backend import Gateway, gateway_of
from hf2triton.gateway.boundary import KEY, peer
from hf2triton.gateway.errors import ApiError, triton_error
from hf2triton.gateway.protocol import FINISH_REASONS, ServedModel
from hf2triton.gateway.responses import TextEvents, event_stream, sse, unless_client_leaves
from hf2triton.serving import interface
from hf2triton.triton import client

log = logging.getLogger(__name__)
router = APIRouter()


async def generate(gateway: Gateway, served: ServedModel, prompt: str | list[dict[str, str]], options: dict[str, Any]):
    """Async iterator of (text piece, final info or None) from a Triton stream; cancelling the iteration
    (a client gone) cancels the Triton request."""
    import tritonclient.grpc as grpcclient

    texts, inputs = ([prompt], options) if isinstance(prompt, str) else ([], {**options, interface.MESSAGES: prompt})
    request = {"model_name": served.name, "inputs": client.build_inputs(grpcclient, texts, inputs, one_prompt=True)}

    async def requests():
        yield request

    async def opened(triton):  # the first response proves the connection: only then is a retry unsafe
        stream = triton.stream_infer(requests())
        try:
            return stream, await stream.__anext__()
        except BaseException:
            stream.cancel()
            raise

    def read(response: tuple[Any, Any]) -> tuple[str, dict[str, Any] | None]:
        result, error = response
        if error is not None:
            raise triton_error(error, served.name)
        piece = result.as_numpy(interface.TEXT_OUTPUT)
        text = piece.reshape(-1)[0].decode("utf-8") if piece is not None else ""
        reason = result.as_numpy(interface.FINISH_REASON)
        if reason is None:
            return text, None
        return text, {
            "finish_reason": FINISH_REASONS.get(reason.reshape(-1)[0].decode(), "stop"),
            "prompt_tokens": int(result.as_numpy(interface.PROMPT_TOKENS).reshape(-1)[0]),
            "completion_tokens": int(result.as_numpy(interface.COMPLETION_TOKENS).reshape(-1)[0]),
        }

    stream, finished = None, False
    try:
        stream, first = await gateway.call(opened)
        text, info = read(first)
        while info is None:
            yield text, None
            text, info = read(await stream.__anext__())
        finished = True
        yield text, info
    except ApiError:
        raise
    except StopAsyncIteration:
        raise ApiError(502, "Triton ended the stream without a final response", "server_error") from None
    except Exception as err:  # noqa: BLE001 - gRPC failures become OpenAI errors
        raise triton_error(err, served.name) from None
    finally:
        if not finished and stream is not None:
            stream.cancel()


async def completion(request: Request, chat: bool):
    gateway = gateway_of(request)
    body = await protocol.read_body(request)
    served = await gateway.model(body, interface.GENERATIVE_TASKS)
    options = protocol.generation_options(body, served.max_new_tokens)
    prompt = protocol.chat_messages(body) if chat else protocol.completion_prompt(body)
    head = protocol.completion_head(chat, served.name)
    pieces = generate(gateway, served, prompt, options)
    if not protocol.flag(body, "stream"):

        async def collect() -> tuple[str, dict[str, Any]]:
            text, final = [], {}
            async for piece, info in pieces:
                text.append(piece)
                final = info or final
            return "".join(text), final

        collected = await unless_client_leaves(request, collect())
        if collected is None:  # nobody reads this answer
            log.info("client %s left before its answer: the generation was cancelled", peer(request.scope))
            return JSONResponse(ApiError(400, "the client left").body(), status_code=400)
        answer, final = collected
        return protocol.completion_answer(head, chat, answer, final)
    include_usage = protocol.include_usage(body)
    # The first piece is awaited before the response starts, so an early error (busy, bad prompt) is a status code;
    # a client that leaves meanwhile (waiting for a place, a long prefill) cancels it then, not at its first piece.
    first = await unless_client_leaves(request, pieces.__anext__())
    if first is None:
        await pieces.aclose()
        log.info("client %s left before its first piece: the generation was cancelled", peer(request.scope))
        return JSONResponse(ApiError(400, "the client left").body(), status_code=400)
    middle = TextEvents(lambda text: protocol.completion_chunk(head, chat, text, None))

    def piece_event(piece: str, info: dict | None, role: bool = False) -> bytes:
        if role or info is not None or not piece:
            return sse(protocol.completion_chunk(head, chat, piece, info, role))
        return middle(piece)

    async def events():
        try:
            piece, info = first
            yield piece_event(piece, info, role=True)
            while info is None:
                piece, info = await pieces.__anext__()
                yield piece_event(piece, info)
            if include_usage:
                yield sse(protocol.usage_chunk(head, chat, info))
        finally:
            await pieces.aclose()  # a client gone: the Triton request is cancelled

    return event_stream(events())


@router.post("/v1/chat/completions", dependencies=KEY)
async def chat_completions(request: Request):
    return await completion(request, chat=True)


@router.post("/v1/completions", dependencies=KEY)
async def completions(request: Request):
    return await completion(request, chat=False)
