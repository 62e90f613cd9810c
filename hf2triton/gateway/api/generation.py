"""POST /v1/chat/completions and /v1/completions: streaming generation models (decoupled in Triton), the answer whole
or as server-sent events. A choice is one Triton request: one per prompt (completions take a list) and sample (`n`),
run together (the batcher decodes them in one batch). A client that leaves (streamed or not, before its first piece
as well) cancels the Triton requests: the generation slots are freed within one decoding step."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from hf2triton.gateway import protocol, tools
from hf2triton.gateway.backend import Gateway, bound_texts, gateway_of
from hf2triton.gateway.boundary import KEY, peer
from hf2triton.gateway.errors import ApiError, triton_error
from hf2triton.gateway.protocol import FINISH_REASONS, ServedModel
from hf2triton.gateway.responses import TextEvents, event_stream, sse, unless_client_leaves
from hf2triton.gateway.tool_parsers import ToolStream, called, tool_message
from hf2triton.serving import interface
from hf2triton.triton import client

log = logging.getLogger(__name__)
router = APIRouter()


class Piece(NamedTuple):
    """One Triton response: new text, the final info (finish reason, token counts) on the last, and the
    log-probabilities (interface.TOKEN_LOGPROBS, parsed) when the request asked for them."""

    text: str
    final: dict[str, Any] | None
    logprobs: dict[str, Any] | None


async def generate(
    gateway: Gateway, served: ServedModel, prompt: str | list[int] | list[dict[str, str]], options: dict[str, Any]
) -> AsyncIterator[Piece]:
    """Async iterator of the Pieces of a Triton stream (gRPC, or Triton's HTTP event stream where the gateway has
    --http); cancelling the iteration (a client gone) cancels the Triton request. `prompt`: a text, token ids
    (interface.PROMPT_IDS) or chat messages; a text is a /v1/completions prompt, taken as it is (interface.RAW_PROMPT:
    no chat template, as vLLM takes it)."""
    if isinstance(prompt, str):
        texts, inputs = [prompt], {**options, interface.RAW_PROMPT: True}
    else:
        texts, inputs = [], {**options, (interface.PROMPT_IDS if prompt and isinstance(prompt[0], int) else interface.MESSAGES): prompt}
    pieces = _http_pieces if gateway.http_url else _grpc_pieces
    async for piece in pieces(gateway, served, texts, inputs):
        yield piece


def _piece(values: dict[str, Any]) -> Piece:
    """A response's outputs by name (bytes from gRPC, text from Triton's JSON) -> its Piece."""

    def text_of(name: str) -> str | None:
        value = values.get(name)
        return value.decode("utf-8") if isinstance(value, bytes) else value

    logprobs = text_of(interface.TOKEN_LOGPROBS)
    reason = text_of(interface.FINISH_REASON)
    final = None
    if reason is not None:
        final = {
            "finish_reason": FINISH_REASONS.get(reason, "stop"),
            "prompt_tokens": int(values[interface.PROMPT_TOKENS]),
            "completion_tokens": int(values[interface.COMPLETION_TOKENS]),
        }
    return Piece(text_of(interface.TEXT_OUTPUT) or "", final, json.loads(logprobs) if logprobs is not None else None)


def _ended_early(served: ServedModel, received: int) -> ApiError:
    log.warning("model %s: Triton ended a stream after %d pieces without a final response", served.name, received)
    return ApiError(502, "Triton ended the stream without a final response", "server_error")


async def _http_pieces(gateway: Gateway, served: ServedModel, texts: list[str], inputs: dict[str, Any]) -> AsyncIterator[Piece]:
    """The Pieces of Triton's HTTP event stream (read to its end, so that its connection is kept for the next). It
    asks for keep-alive pieces while it waits for a place (interface.KEEPALIVE), which are not passed on: a client
    gone meanwhile is noticed at Triton's next write, and its request cancelled."""
    received, final = 0, False
    body = {**client.generate_body(texts, inputs), "parameters": {interface.KEEPALIVE: True}}
    try:
        async for values in gateway.stream_http(served.name, body):
            piece = _piece(values)
            if not (piece.text or piece.final or piece.logprobs):
                continue  # a keep-alive
            final = piece.final is not None
            received += 1
            yield piece
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - the key file missing, a broken event: OpenAI errors
        raise triton_error(err, served.name) from None
    if not final:
        raise _ended_early(served, received)


async def _grpc_pieces(gateway: Gateway, served: ServedModel, texts: list[str], inputs: dict[str, Any]) -> AsyncIterator[Piece]:
    """The Pieces of a gRPC stream, up to its final one."""
    import tritonclient.grpc as grpcclient

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

    def read(response: tuple[Any, Any]) -> Piece:
        result, error = response
        if error is not None:
            raise triton_error(error, served.name)
        return _piece(client.first_values(result))

    stream, finished, received = None, False, 0
    try:
        stream, first = await gateway.call(opened)
        piece = read(first)
        while piece.final is None:
            yield piece
            received += 1
            piece = read(await stream.__anext__())
        finished = True
        yield piece
    except ApiError:
        raise
    except StopAsyncIteration:
        raise _ended_early(served, received) from None
    except Exception as err:  # noqa: BLE001 - gRPC failures become OpenAI errors
        raise triton_error(err, served.name) from None
    finally:
        if not finished and stream is not None:
            stream.cancel()


async def merged(streams: list[AsyncIterator[Piece]]) -> AsyncIterator[tuple[int, Piece]]:
    """The pieces of several streams as they come, with their stream's index; the first error ends them all, and so
    does closing this iterator (each stream's own `finally` cancels its Triton request)."""
    if len(streams) == 1:  # one choice: no tasks
        async for piece in streams[0]:
            yield 0, piece
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[Piece]) -> None:
        try:
            async for piece in stream:
                queue.put_nowait((index, piece))
            queue.put_nowait((index, None))
        except Exception as err:  # noqa: BLE001 - handed to the reader, which raises it
            queue.put_nowait((index, err))

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                left -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _tool_options(body: dict[str, Any], served: ServedModel, options: dict[str, Any]) -> tools.ToolRequest:
    """A chat request's tools (interface.TOOLS, for the template) and, for a forced call, its constraint (GUIDED)."""
    request = tools.tool_request(body, served)
    if request.tools:
        options[interface.TOOLS] = request.tools
    constraint = tools.guided(request, served.tool_parser)
    if constraint is not None:
        if interface.GUIDED in options:
            message = (
                "'tool_choice' required or a named function constrains the answer already: send no 'response_format' "
                "(nor guided_* / structured_outputs) with it"
            )
            raise ApiError(400, message, param="tool_choice")
        options[interface.GUIDED] = constraint
    return request


def _choices(body: dict[str, Any], served: ServedModel, chat: bool) -> tuple[list, list[dict[str, Any]], int, tools.ToolRequest | None]:
    """The request's choices in index order -- each prompt `n` times -- as (prompts, options per choice, n, the chat's
    tools). Samples of one prompt differ: with a `seed`, sample i takes seed + i."""
    options = protocol.generation_options(body, served.max_new_tokens, chat=chat)
    tool_request = _tool_options(body, served, options) if chat else None
    prompts = [protocol.chat_messages(body)] if chat else protocol.completion_prompts(body)
    if served.task == interface.TEXT2TEXT and options.get(interface.PROMPT_LOGPROBS):
        message = "'echo' is not supported for text2text-generation models: an encoder's input has no log-probabilities"
        raise ApiError(400, message, param="echo")
    samples = protocol.sample_count(body, served)
    bound_texts(served, len(prompts) * samples, "n" if samples > 1 else "prompt")
    seed = options.get(interface.SEED)
    per_sample = [options if seed is None else {**options, interface.SEED: (seed + i) % interface.SEED_RANGE[1]} for i in range(samples)]
    choices = [per_sample[i % samples] for i in range(len(prompts) * samples)]
    return [p for p in prompts for _ in range(samples)], choices, samples, tool_request


async def completion(request: Request, chat: bool):
    gateway = gateway_of(request)
    body = await protocol.read_body(request)
    served = await gateway.model(body, interface.GENERATIVE_TASKS)
    prompts, options, samples, tool_request = _choices(body, served, chat)
    parser = served.tool_parser if tool_request is not None and tool_request.parses else None
    reported = bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
    shapes = [protocol.ChoiceLogprobs(chat, reported) for _ in prompts]
    head = protocol.completion_head(chat, served.name)
    pieces = merged([generate(gateway, served, prompt, choice) for prompt, choice in zip(prompts, options)])
    if not protocol.flag(body, "stream"):

        async def collect() -> list[tuple[str, dict, dict | None]]:
            texts: list[list[str]] = [[] for _ in prompts]
            logprobs: list[list[dict | None]] = [[] for _ in prompts]
            finals: list[dict] = [{} for _ in prompts]
            async for index, piece in pieces:
                text, found = shapes[index].piece(piece.text, piece.logprobs)
                texts[index].append(text)
                logprobs[index].append(found)
                finals[index] = piece.final or finals[index]
            answers = [("".join(texts[i]), finals[i], shapes[i].merged(logprobs[i])) for i in range(len(prompts))]
            if parser is None:
                return answers
            return [(*tool_message(parser, text, final), found) for text, final, found in answers]

        collected = await unless_client_leaves(request, collect())
        if collected is None:  # nobody reads this answer
            log.info("client %s left before its answer: the generation was cancelled", peer(request.scope))
            return JSONResponse(ApiError(400, "the client left").body(), status_code=400)
        return protocol.completion_answer(head, chat, collected, samples)
    include_usage = protocol.include_usage(body)
    # The first piece is awaited before the response starts, so an early error (busy, bad prompt) is a status code;
    # a client that leaves meanwhile (waiting for a place, a long prefill) cancels it then, not at its first piece.
    first = await unless_client_leaves(request, pieces.__anext__())
    if first is None:
        await pieces.aclose()
        log.info("client %s left before its first piece: the generation was cancelled", peer(request.scope))
        return JSONResponse(ApiError(400, "the client left").body(), status_code=400)
    middles = {}  # per choice: its plain middle pieces rendered around a marker (responses.TextEvents)
    started: set[int] = set()

    calls = [ToolStream(parser) for _ in prompts] if parser is not None else []

    def tool_events(index: int, text: str, final: dict | None, logprobs: dict | None) -> bytes:
        """A piece of a choice whose text is read for tool calls: its deltas (text that may become a call held back);
        the finish reason "tool_calls" once a call went out (unless the answer was cut)."""
        deltas = calls[index].feed(text) + (calls[index].finish() if final is not None else [])
        if final is not None and calls[index].called:
            final = called(final)
        if final is not None or (logprobs is not None and not deltas):
            deltas.append({})  # the finish reason (and log-probabilities whose text is held back) on a delta of its own
        events = []
        for number, delta in enumerate(deltas):
            role = index not in started
            started.add(index)
            last = final if number == len(deltas) - 1 else None
            events.append(sse(protocol.completion_chunk(head, chat, delta, last, role, index, logprobs if number == 0 else None)))
        return b"".join(events)

    def piece_event(index: int, piece: Piece) -> bytes:
        text, logprobs = shapes[index].piece(piece.text, piece.logprobs)
        if calls:
            return tool_events(index, text, piece.final, logprobs)
        role = index not in started
        started.add(index)
        if role or piece.final is not None or not text or piece.logprobs is not None:
            return sse(protocol.completion_chunk(head, chat, text, piece.final, role, index, logprobs))
        if index not in middles:
            middles[index] = TextEvents(lambda text: protocol.completion_chunk(head, chat, text, None, index=index))
        return middles[index](text)

    async def events():
        finals: list[dict] = [{} for _ in prompts]
        try:
            index, piece = first
            while True:
                yield piece_event(index, piece)
                finals[index] = piece.final or finals[index]
                try:
                    index, piece = await pieces.__anext__()
                except StopAsyncIteration:
                    break
            if include_usage:
                yield sse(protocol.usage_chunk(head, chat, finals, samples))
        finally:
            await pieces.aclose()  # a client gone: the Triton requests are cancelled

    return event_stream(events())


@router.post("/v1/chat/completions", dependencies=KEY)
async def chat_completions(request: Request):
    return await completion(request, chat=True)


@router.post("/v1/completions", dependencies=KEY)
async def completions(request: Request):
    return await completion(request, chat=False)
