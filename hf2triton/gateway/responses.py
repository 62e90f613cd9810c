"""Writing answers, shared by every endpoint: JSON with numpy arrays in it, server-sent events (OpenAI's stream:
`data: <json>` events, an error as an event once the stream has started, `data: [DONE]` last), and waiting for a
result only while its client is still there."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Coroutine
from typing import Any, Callable, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from hf2triton.gateway.errors import ApiError, unavailable

try:
    import orjson
except ImportError:  # pinned in envs/requirements.txt; without it the standard library writes the same JSON, slower
    orjson = None

T = TypeVar("T")


class ArrayJSONResponse(JSONResponse):
    """JSON with numpy arrays in it, written in one pass. A returned dict goes through FastAPI's
    jsonable_encoder and json.dumps, ~80x orjson's time for a 256 x 384 float embedding answer and ~5x as base64
    (benchmarks/probes/gateway_json.py); orjson prints float32 values shortest, and they read back exactly."""

    def render(self, content: Any) -> bytes:
        if orjson is not None:
            return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
        return json.dumps(content, ensure_ascii=False, default=lambda array: array.tolist()).encode("utf-8")


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False) if not isinstance(data, str) else data}\n\n".encode("utf-8", "replace")


class TextEvents:
    """Events that differ only in one text field (a stream's middle pieces): the event is rendered once around a
    marker and each one costs one string escape instead of a whole dict -> JSON."""

    MARKER = "\u0000piece\u0000"

    def __init__(self, event: Callable[[str], Any]):
        """`event(text)`: the event's data for a text."""
        self.head, self.tail = sse(event(self.MARKER)).decode().split(json.dumps(self.MARKER, ensure_ascii=False))

    def __call__(self, text: str) -> bytes:
        return f"{self.head}{json.dumps(text, ensure_ascii=False)}{self.tail}".encode("utf-8", "replace")


def event_stream(events: AsyncGenerator[bytes, None]) -> StreamingResponse:
    """The SSE response for `events` (each an sse() event). An ApiError once the stream has started becomes an
    error event; `events` is closed when the client leaves (its own `finally` cancels the Triton request)."""

    async def framed():
        try:
            async for event in events:
                yield event
        except ApiError as err:
            yield sse(err.body())
        finally:
            await events.aclose()
        yield sse("[DONE]")

    return StreamingResponse(framed(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """`work`'s result, or None when the client disconnects first: `work` is cancelled (a non-streamed
    generation's Triton stream with it, so the generation stops)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
    if watcher in done and not (task in done and not task.cancelled()):
        return None
    if task.cancelled():  # not by us: the channel to Triton was closed under it (a reconnect after tritonserver died)
        raise unavailable("the connection to the Triton server was closed during the request")
    return task.result()
