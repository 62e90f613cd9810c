"""The OpenAI-compatible gateway: FastAPI in front of tritonserver's gRPC API (tritonclient's asyncio client).

    GET  /v1/models             the served models                                   api/models.py
    GET  /v1/status             hf2triton's own: backends, devices, validation      api/models.py
    POST /v1/chat/completions   streaming generation models (messages -> the model's `messages` input)
    POST /v1/completions        the same models, from a prompt                      api/generation.py
    POST /v1/embeddings         feature-extraction models (float or base64)         api/embeddings.py
    POST /v1/rerank             text-ranking models: a query's documents, best first api/rerank.py
    POST /v1/score              the same models: text pairs' scores (vLLM's shape)  api/rerank.py
    POST /v1/models/{m}:predict token-classification, fill-mask, text-classification: the pipeline's JSON per text
                                (KServe's V1 protocol)                              api/predict.py
    POST /v1/audio/transcriptions, /v1/audio/translations  speech recognition: a multipart form, up to
                                25 MiB (openai.max_audio_upload_mib)                api/audio.py
    GET  /health                the gateway is up and Triton is ready               api/models.py
    GET  /playground/           the browser playground (static)                     api/playground.py

Errors are OpenAI's error object with the HTTP status carrying the class (400 bad parameter, 401 key, 404 model,
408 slow body, 413 too large, 415 not JSON, 421 foreign Host, 403 foreign Origin, 429 busy, 503 Triton down or not
ready). Every request passes the Boundary (boundary.py) before any route. This module only builds the app: the
middleware, the error handlers, the routers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from hf2triton.gateway.api import audio, embeddings, generation, models, playground, predict, rerank
from hf2triton.gateway.backend import Gateway
from hf2triton.gateway.boundary import MAX_AUDIO_UPLOAD_MIB, MIB, Boundary, peer, served_names
from hf2triton.gateway.errors import ApiError

log = logging.getLogger(__name__)

# one per API family (api/)
ROUTERS = [models.router, playground.router, generation.router, embeddings.router, rerank.router, predict.router, audio.router]


def create_app(
    gateway: Gateway,
    hosts: frozenset[str] | None = None,
    origins: Iterable[str] = (),
    request_timeout_s: float = 30.0,
    max_audio_upload_mib: int = MAX_AUDIO_UPLOAD_MIB,
) -> FastAPI:
    """The gateway's app; `hosts`: the names it answers under (served_names), `origins`: web origins allowed
    to call it from a browser, `request_timeout_s`: the time a client has to send its body, `max_audio_upload_mib`:
    the size of an audio endpoint's form (JSON bodies: boundary.MAX_BODY_BYTES)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await gateway.close()  # the HTTP upstream's connections

    app = FastAPI(title="hf2triton OpenAI-compatible gateway", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.gateway = gateway  # how the routes reach Triton (backend.gateway_of) and the key (boundary.require_key)
    app.add_middleware(
        Boundary, hosts=served_names("127.0.0.1") if hosts is None else hosts, origins=origins, timeout_s=request_timeout_s,
        max_form_bytes=max_audio_upload_mib * MIB,
    )  # fmt: skip

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, err: RequestValidationError):
        return JSONResponse(ApiError(400, str(err)[:300]).body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):  # unknown routes and methods: OpenAI's error object too
        path = request.url.path[:200]
        if err.status_code == 404:
            endpoints = "POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/rerank, /v1/score, /v1/models/{model}:predict, "
            endpoints += "/v1/audio/transcriptions, /v1/audio/translations"
            message = f"no endpoint {path} (GET /v1/models, {endpoints})"
        elif err.status_code == 405:
            message = f"{request.method} is not allowed on {path} (allowed: {(err.headers or {}).get('Allow', '?')})"
        else:
            message = str(err.detail)
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return JSONResponse(ApiError(err.status_code, message, code=code).body(), status_code=err.status_code, headers=err.headers)

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, __: RecursionError):  # JSON nested deeper than Python's stack: bad input, not a crash
        return JSONResponse(ApiError(400, "the request is nested too deeply").body(), status_code=400)

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, _: ClientDisconnect):  # one line, no traceback (slow clients come by the hundred)
        log.info("client %s left before sending its whole request (%s %r)", peer(request.scope), request.method, request.url.path[:200])
        return JSONResponse(ApiError(400, "the client left").body(), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception):
        log.exception("gateway error")
        return JSONResponse(ApiError(500, f"internal error: {type(err).__name__}", "server_error").body(), status_code=500)

    for router in ROUTERS:
        app.include_router(router)
    return app
