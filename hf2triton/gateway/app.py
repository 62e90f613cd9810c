"""The OpenAI-compatible gateway: FastAPI in front of tritonserver's gRPC API (tritonclient's asyncio client).

    GET  /v1/models             the served models
    POST /v1/chat/completions   streaming generation models (messages -> the model's `messages` input)
    POST /v1/completions        the same models, from a prompt
    POST /v1/embeddings         feature-extraction models (float or base64)
    GET  /health                the gateway is up and Triton is ready

Errors are OpenAI's error object with the HTTP status carrying the class (400 bad parameter, 401 key, 404 model,
413 too large, 429 busy, 503 Triton not ready). A client that closes its stream cancels the Triton request
(the generation slot is freed within one decoding step). The API key comes from an environment variable, never
from config.yaml; requests are compared in constant time and the key is never logged.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from hf2triton.serving import interface
from hf2triton.triton import client

try:
    import orjson
except ImportError:  # pinned in envs/requirements.txt; without it the standard library writes the same JSON, slower
    orjson = None

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
UNSUPPORTED_CHAT = ("tools", "functions", "tool_choice", "function_call", "logprobs", "top_logprobs", "logit_bias", "audio", "modalities")
FINISH_REASONS = {"stop": "stop", "length": "length", "time": "length", "cancelled": "stop"}


class ApiError(Exception):
    """An OpenAI-style error: HTTP status, message, type, the offending parameter."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict[str, Any]:
        message = self.message.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate from the request cannot be sent
        return {"error": {"message": message, "type": self.kind, "param": self.param, "code": self.code}}


def triton_error(err: Exception) -> ApiError:
    """Triton's error for one request -> the OpenAI status class."""
    text = str(err)
    lowered = text.lower()
    if "busy" in lowered or "exceeds the maximum queue size" in lowered:
        return ApiError(429, text, "rate_limit_error", code="busy")
    if "max_input_bytes" in lowered or "max_texts_per_request" in lowered or "max_request_bytes" in lowered:
        return ApiError(413, text, code="too_large")
    if "unavailable" in lowered or "failed to connect" in lowered or "not ready" in lowered:
        return ApiError(503, f"the Triton server is not ready: {text}", "server_error", code="unavailable")
    return ApiError(400, text)


@dataclass(frozen=True)
class ServedModel:
    name: str
    task: str
    streaming: bool
    max_batch_size: int


def _number(body: dict[str, Any], key: str, kind: type, low: float, high: float) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise ApiError(400, f"'{key}' must be a {'whole number' if kind is int else 'number'}, got {json.dumps(value)[:40]}", param=key)
    if not low <= value <= high:
        raise ApiError(400, f"'{key}' = {value} is out of range ({low}..{high})", param=key)
    return kind(value)


def generation_options(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI sampling parameters -> the model's request inputs (checked here: a bad value never reaches Triton)."""
    if body.get("n", 1) != 1:
        raise ApiError(400, "only n = 1 is supported", param="n")
    for key in UNSUPPORTED_CHAT:
        if body.get(key) not in (None, False, [], {}):
            raise ApiError(400, f"'{key}' is not supported by this server", param=key)
    options: dict[str, Any] = {}
    tokens = _number(body, "max_completion_tokens", int, 1, interface.MAX_NEW_TOKENS_RANGE[1])
    tokens = tokens if tokens is not None else _number(body, "max_tokens", int, 1, interface.MAX_NEW_TOKENS_RANGE[1])
    if tokens is not None:
        options[interface.MAX_NEW_TOKENS] = tokens
    temperature = _number(body, "temperature", float, 0.0, 2.0)
    if temperature is not None:
        options[interface.TEMPERATURE] = 0.0 if temperature < interface.MIN_TEMPERATURE else temperature
    top_p = _number(body, "top_p", float, *interface.TOP_P_RANGE)
    if top_p is not None and top_p < 1.0:
        options[interface.TOP_P] = top_p
    seed = _number(body, "seed", int, *interface.SEED_RANGE)
    if seed is not None:
        options[interface.SEED] = seed
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
            raise ApiError(400, "'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
        if stops:
            options[interface.STOP] = stops
    return options


def chat_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role == "developer":
            role = "system"
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported", param=f"messages[{index}].content")
            content = "".join(p["text"] for p in content)
        if role not in interface.CHAT_ROLES or not isinstance(content, str):
            raise ApiError(
                400,
                f"messages[{index}] must have a role ({', '.join(interface.CHAT_ROLES)}) and text content",
                param=f"messages[{index}]",
            )
        out.append({"role": role, "content": content})
    return out


def embedding_inputs(body: dict[str, Any]) -> list[str]:
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "'input' must be a string or a non-empty list of strings (token arrays are not supported)", param="input")
    if any(not t.strip() for t in texts):
        raise ApiError(400, "'input' contains an empty string", param="input")
    return texts


class Gateway:
    """The state the endpoints share: the Triton gRPC client, the served models, the key."""

    def __init__(self, grpc_url: str, api_key: str | None, models: list[str]):
        self.grpc_url, self.api_key, self.names = grpc_url, api_key or None, models
        self.models: dict[str, ServedModel] = {}
        self.created = int(time.time())

    async def triton(self):
        import tritonclient.grpc.aio as aio

        if not hasattr(self, "_triton"):
            self._triton = aio.InferenceServerClient(self.grpc_url)
        return self._triton

    async def refresh(self) -> None:
        """The served models' tasks and limits, from their configs on the server."""
        from hf2triton.triton.modelconfig import model_parameters

        triton = await self.triton()
        found = {}
        for name in self.names:
            try:
                config = (await triton.get_model_config(name)).config
            except Exception as err:  # noqa: BLE001 - a model that is not loaded is not listed
                log.info("model %s not listed: %s", name, err)
                continue
            decoupled = bool(config.model_transaction_policy.decoupled)
            found[name] = ServedModel(name, model_parameters(config).task, decoupled, config.max_batch_size)
        self.models = found

    def check_key(self, authorization: str | None) -> None:
        if self.api_key is None:
            return
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            message = "missing or wrong API key (send 'Authorization: Bearer <key>')"
            raise ApiError(401, message, "authentication_error", code="invalid_api_key")

    async def model(self, body: dict[str, Any], task: str) -> ServedModel:
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' is required", param="model")
        if name not in self.models:
            await self.refresh()
        served = self.models.get(name)
        if served is None:
            raise ApiError(404, f"model {name!r} is not served here (GET /v1/models lists them)", param="model", code="model_not_found")
        if served.task != task:
            raise ApiError(400, f"model {name!r} is a {served.task} model, not {task}", param="model")
        if task == interface.GENERATION and not served.streaming:
            message = f"model {name!r} is served static (generation.streaming: false); the gateway needs a streaming model"
            raise ApiError(400, message, param="model")
        return served

    # ------------------------------------------------------------------ generation

    async def generate(self, served: ServedModel, prompt: str | list[dict[str, str]], options: dict[str, Any]):
        """Async iterator of (text piece, final info or None) from a Triton stream; cancelling the iteration
        (a client gone) cancels the Triton request."""
        import tritonclient.grpc as grpcclient

        texts, inputs = ([prompt], options) if isinstance(prompt, str) else ([], {**options, interface.MESSAGES: prompt})
        request = {"model_name": served.name, "inputs": client.build_inputs(grpcclient, texts, inputs, one_prompt=True)}

        async def requests():
            yield request

        stream = (await self.triton()).stream_infer(requests())
        finished = False
        try:
            async for result, error in stream:
                if error is not None:
                    raise triton_error(error)
                piece = result.as_numpy(interface.TEXT_OUTPUT)
                text = piece.reshape(-1)[0].decode("utf-8") if piece is not None else ""
                reason = result.as_numpy(interface.FINISH_REASON)
                if reason is None:
                    yield text, None
                    continue
                finished = True
                yield (
                    text,
                    {
                        "finish_reason": FINISH_REASONS.get(reason.reshape(-1)[0].decode(), "stop"),
                        "prompt_tokens": int(result.as_numpy(interface.PROMPT_TOKENS).reshape(-1)[0]),
                        "completion_tokens": int(result.as_numpy(interface.COMPLETION_TOKENS).reshape(-1)[0]),
                    },
                )
                return
        except ApiError:
            raise
        except Exception as err:  # noqa: BLE001 - gRPC failures become OpenAI errors
            raise triton_error(err) from None
        finally:
            if not finished:
                stream.cancel()

    # ------------------------------------------------------------------ embeddings

    async def embed(self, served: ServedModel, texts: list[str]) -> tuple[np.ndarray, int]:
        """The texts' embeddings and the tokens they became (the model's own count: no second tokenisation)."""
        import tritonclient.grpc as grpcclient

        triton = await self.triton()
        chunk = served.max_batch_size or len(texts)
        parts = []
        try:
            results = await asyncio.gather(
                *(triton.infer(served.name, client.build_inputs(grpcclient, texts[i : i + chunk])) for i in range(0, len(texts), chunk))
            )
        except Exception as err:  # noqa: BLE001 - Triton's answer becomes an OpenAI error
            raise triton_error(err) from None
        tokens = 0
        for result in results:
            vectors = result.as_numpy(interface.EMBEDDING)
            parts.append(vectors.reshape(-1, vectors.shape[-1]))
            counts = result.as_numpy(interface.PROMPT_TOKENS)
            tokens += int(counts.sum()) if counts is not None else 0
        return np.concatenate(parts).astype(np.float32), tokens


class ArrayJSONResponse(JSONResponse):
    """JSON with numpy arrays in it, written in one pass. A returned dict goes through FastAPI's
    jsonable_encoder and json.dumps, ~80x orjson's time for a 256 x 384 float embedding answer and ~5x as base64
    (benchmarks/gateway_json.py); orjson prints float32 values shortest, and they read back exactly."""

    def render(self, content: Any) -> bytes:
        if orjson is not None:
            return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
        return json.dumps(content, ensure_ascii=False, default=lambda array: array.tolist()).encode("utf-8")


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False) if not isinstance(data, str) else data}\n\n".encode("utf-8", "replace")


def create_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="hf2triton OpenAI-compatible gateway", docs_url=None, redoc_url=None)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, err: RequestValidationError):
        return JSONResponse(ApiError(400, str(err)[:300]).body(), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception):
        log.exception("gateway error")
        return JSONResponse(ApiError(500, f"internal error: {type(err).__name__}", "server_error").body(), status_code=500)

    async def read_body(request: Request) -> dict[str, Any]:
        gateway.check_key(request.headers.get("authorization"))
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body of {len(raw)} bytes exceeds {MAX_BODY_BYTES}", code="too_large")
        try:
            body = json.loads(raw or b"{}")
        except ValueError as err:
            raise ApiError(400, f"the body is not valid JSON ({err})") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    @app.get("/health")
    async def health():
        try:
            ready = await (await gateway.triton()).is_server_ready()
        except Exception:  # noqa: BLE001 - not ready
            ready = False
        return JSONResponse({"gateway": "up", "triton_ready": ready}, status_code=200 if ready else 503)

    @app.get("/v1/models")
    async def models(request: Request):
        gateway.check_key(request.headers.get("authorization"))
        await gateway.refresh()
        data = [
            {"id": m.name, "object": "model", "created": gateway.created, "owned_by": "hf2triton", "task": m.task}
            for m in gateway.models.values()
        ]
        return {"object": "list", "data": data}

    async def completion(request: Request, chat: bool):
        body = await read_body(request)
        served = await gateway.model(body, interface.GENERATION)
        options = generation_options(body)
        if chat:
            prompt: str | list[dict[str, str]] = chat_messages(body)
        else:
            raw = body.get("prompt")
            raw = raw[0] if isinstance(raw, list) and len(raw) == 1 else raw
            if not isinstance(raw, str) or not raw.strip():
                raise ApiError(400, "'prompt' must be a non-empty string (one prompt per request)", param="prompt")
            prompt = raw
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        pieces = gateway.generate(served, prompt, options)
        if not body.get("stream"):
            text, final = [], {}
            async for piece, info in pieces:
                text.append(piece)
                final = info or final
            answer = "".join(text)
            usage = {
                "prompt_tokens": final.get("prompt_tokens", 0),
                "completion_tokens": final.get("completion_tokens", 0),
                "total_tokens": final.get("prompt_tokens", 0) + final.get("completion_tokens", 0),
            }
            ending = {"finish_reason": final.get("finish_reason"), "logprobs": None}
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": answer}, **ending}
                if chat
                else {"index": 0, "text": answer, **ending}
            )
            return {"id": ident, "object": kind, "created": created, "model": served.name, "choices": [choice], "usage": usage}
        stream_options = body.get("stream_options") or {}
        if not isinstance(stream_options, dict):
            raise ApiError(400, "'stream_options' must be an object", param="stream_options")
        include_usage = bool(stream_options.get("include_usage"))
        # The first piece is awaited before the response starts, so an early error (busy, bad prompt) is a status code.
        first = await pieces.__anext__()

        def chunk(piece: str, info: dict | None, role: bool = False) -> dict[str, Any]:
            if chat:
                delta = {"role": "assistant", "content": piece} if role else ({"content": piece} if piece else {})
                choice = {"index": 0, "delta": delta, "finish_reason": info and info["finish_reason"], "logprobs": None}
            else:
                choice = {"index": 0, "text": piece, "finish_reason": info and info["finish_reason"], "logprobs": None}
            return {"id": ident, "object": f"{kind}.chunk" if chat else kind, "created": created, "model": served.name, "choices": [choice]}

        # Every middle piece differs only in its text: its event is rendered once around a marker and each token
        # costs one string escape instead of a whole dict -> JSON.
        marker = "\u0000piece\u0000"
        head, tail = sse(chunk(marker, None)).decode().split(json.dumps(marker, ensure_ascii=False))

        def piece_event(piece: str, info: dict | None) -> bytes:
            if info is not None or not piece:
                return sse(chunk(piece, info))
            return f"{head}{json.dumps(piece, ensure_ascii=False)}{tail}".encode("utf-8", "replace")

        async def events():
            try:
                piece, info = first
                yield sse(chunk(piece, info, role=True))
                while info is None:
                    piece, info = await pieces.__anext__()
                    yield piece_event(piece, info)
                if include_usage:
                    usage = {"prompt_tokens": info["prompt_tokens"], "completion_tokens": info["completion_tokens"]}
                    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                    yield sse({**chunk("", None), "choices": [], "usage": usage})
            except ApiError as err:
                yield sse(err.body())
            finally:
                await pieces.aclose()  # a client gone: the Triton request is cancelled
            yield sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await completion(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await completion(request, chat=False)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        body = await read_body(request)
        served = await gateway.model(body, interface.FEATURE_EXTRACTION)
        texts = embedding_inputs(body)
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise ApiError(400, "'encoding_format' must be float or base64", param="encoding_format")
        if body.get("dimensions") is not None:
            raise ApiError(400, "'dimensions' is not supported (the model's size is fixed)", param="dimensions")
        vectors, tokens = await gateway.embed(served, texts)
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.tobytes()).decode() if encoding == "base64" else v,
            }
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return ArrayJSONResponse({"object": "list", "data": data, "model": served.name, "usage": usage})

    return app
