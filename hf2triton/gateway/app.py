"""The OpenAI-compatible gateway: FastAPI in front of tritonserver's gRPC API (tritonclient's asyncio client).

    GET  /v1/models             the served models
    POST /v1/chat/completions   streaming generation models (messages -> the model's `messages` input)
    POST /v1/completions        the same models, from a prompt
    POST /v1/embeddings         feature-extraction models (float or base64)
    GET  /health                the gateway is up and Triton is ready

Errors are OpenAI's error object with the HTTP status carrying the class (400 bad parameter, 401 key, 404 model,
408 slow body, 413 too large, 415 not JSON, 421 foreign Host, 403 foreign Origin, 429 busy, 503 Triton down or not
ready). A client that leaves (streamed or not) cancels the Triton request (the generation slot is freed within one
decoding step). The API key comes from an environment variable, never from config.yaml; requests are compared in
constant time and the key is never logged.

Loopback is no boundary against web pages: a page can POST "simple" cross-site requests (text/plain, forms) and a
name re-bound to 127.0.0.1 (DNS rebinding) makes it same-origin. So every request passes `Boundary` first: the Host
must be a name the gateway serves under, a foreign Origin is refused (allowed ones get CORS headers, never a
wildcard), POST bodies must be JSON, and a body is bounded in size and time while it is read.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hf2triton.gateway.process import VALIDATION_REPORT_ENV
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
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
RECONNECT_S = 5.0  # how long a request waits for an unreachable Triton (a restart) before 503
RETRY_PAUSE_S = 0.25
REFRESH_EVERY_S = 1.0  # an unknown model name re-reads Triton's models at most this often (while Triton answers)
# gRPC's words for "no connection" (down, restarting, or this channel in its reconnect back-off), as opposed to
# Triton's own UNAVAILABLE answers about a request (a full queue is 429, not retried)
UNREACHABLE = ("failed to connect", "connection refused", "connection reset", "socket closed", "broken pipe", "goaway")
# tritonclient's defaults that matter (no 4 MB message limit) and a prompt reconnect after tritonserver restarts:
# each channel has its own connections (a fresh channel inherits no backed-off one) and backs off at most 1 s.
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
PREFLIGHT_HEADERS = [
    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
    (b"access-control-allow-headers", b"Authorization, Content-Type"),
    (b"access-control-max-age", b"600"),
]
T = TypeVar("T")
PLAYGROUND = Path(__file__).with_name("playground")
PLAYGROUND_FILES = {
    "index.html": (PLAYGROUND / "index.html", "text/html; charset=utf-8"),
    "app.js": (PLAYGROUND / "app.js", "text/javascript; charset=utf-8"),
    "style.css": (PLAYGROUND / "style.css", "text/css; charset=utf-8"),
    "icon.svg": (PLAYGROUND / "icon.svg", "image/svg+xml"),
}
# The page loads nothing but its own files and talks only to this gateway; what a model says is never markup.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


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
    if "stub process" in lowered or "not healthy" in lowered:  # the model's Python process died: the server's fault
        return ApiError(503, f"the model's process is not healthy (`make serve` restarts it): {text}", "server_error", code="unavailable")
    return ApiError(400, text)


def unreachable(err: BaseException) -> bool:
    """Triton could not be reached at all (no answer about the request itself)."""
    text = str(err).lower()
    return "unavailable" in text and any(words in text for words in UNREACHABLE)


def unavailable(detail: str | BaseException) -> ApiError:
    if isinstance(detail, BaseException):  # gRPC's own words, not its multi-line repr
        details = getattr(detail, "details", None)
        detail = (details() if callable(details) else str(detail)) or type(detail).__name__
    return ApiError(503, f"the Triton server is unavailable ({detail[:200]}); retry shortly", "server_error", code="unavailable")


@dataclass(frozen=True)
class ServedModel:
    name: str
    task: str
    streaming: bool
    max_batch_size: int
    max_texts: int = interface.DEFAULTS.max_texts_per_request
    backend: str = ""
    device: str = ""  # "gpu" / "cpu": the instance groups' kind
    instances: int = 0


def _text(value: str, param: str) -> str:
    """A text field that can become UTF-8 (JSON's "\\ud800" escape decodes to a lone surrogate, which cannot)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, f"'{param}' contains a lone UTF-16 surrogate (not valid Unicode text)", param=param) from None
    return value


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
    # refused rather than silently ignored: a client asking for JSON or penalties must not get plain sampling
    if body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError(400, '\'response_format\' is not supported by this server (only {"type": "text"})', param="response_format")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0) or isinstance(body.get(key), bool):
            raise ApiError(400, f"'{key}' is not supported by this server (only 0)", param=key)
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
            options[interface.STOP] = [_text(s, "stop") for s in stops]
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
        out.append({"role": role, "content": _text(content, f"messages[{index}].content")})
    return out


def embedding_inputs(body: dict[str, Any]) -> list[str]:
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "'input' must be a string or a non-empty list of strings (token arrays are not supported)", param="input")
    if any(not t.strip() for t in texts):
        raise ApiError(400, "'input' contains an empty string", param="input")
    return [_text(t, "input") for t in texts]


def split_address(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port); a clear ValueError otherwise."""
    text = address.strip()
    name, sep, port = text.rpartition(":")
    name = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--grpc {address!r} is not host:port (e.g. 127.0.0.1:8001)")
    return name, int(port)


def grpc_target(addresses: str) -> tuple[str, list[tuple[str, Any]]]:
    """`host:port[,host:port...]` -> (the gRPC channel target, extra channel arguments).

    Several addresses are replicas of one repository (`python -m hf2triton replica`, Triton pods): one channel
    over all of them with gRPC's own `round_robin` policy, which sends each call to the next connected replica and
    skips one that is down until it reconnects (no balancer of ours). gRPC lists addresses of one family
    (`ipv4:a:p,b:p`), so host names are resolved once here; one address stays a plain target (gRPC's DNS)."""
    parts = [split_address(a) for a in addresses.split(",") if a.strip()]
    if not parts:
        raise ValueError("--grpc names no address (host:port[,host:port...])")
    if len(parts) == 1:
        return addresses.strip(" ,"), []
    resolved: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
    for name, port in parts:
        try:
            found = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as err:
            raise ValueError(f"--grpc: cannot resolve {name!r} ({err})") from None
        for family in (socket.AF_INET, socket.AF_INET6):  # IPv4 first where a name has both
            addresses_of = [info[4][0] for info in found if info[0] == family]
            if addresses_of:
                resolved[family].append(f"[{addresses_of[0]}]:{port}" if family == socket.AF_INET6 else f"{addresses_of[0]}:{port}")
                break
    for family, scheme in ((socket.AF_INET, "ipv4"), (socket.AF_INET6, "ipv6")):
        if len(resolved[family]) == len(parts):
            return f"{scheme}:{','.join(resolved[family])}", [("grpc.lb_policy_name", "round_robin")]
    raise ValueError(f"--grpc {addresses!r} mixes IPv4 and IPv6 replicas: give addresses of one family")


class Gateway:
    """The state the endpoints share: the Triton gRPC client (one channel over every replica), the served models,
    the key, the input bound."""

    def __init__(self, grpc_url: str, api_key: str | None, models: list[str], max_embedding_inputs: int | None = None):
        self.grpc_url, self.api_key, self.names = grpc_url, api_key or None, models
        self.target, self.channel_args = grpc_target(grpc_url)
        self.max_embedding_inputs = max_embedding_inputs  # None: each model's max_texts_per_request
        self.models: dict[str, ServedModel] = {}
        self.created = int(time.time())
        self._triton: Any = None
        self.refreshed_at, self.refresh_failed = 0.0, True

    async def triton(self):
        import tritonclient.grpc.aio as aio

        if self._triton is None:
            self._triton = client.keyed(aio.InferenceServerClient(self.target, channel_args=CHANNEL_ARGS + self.channel_args))
        return self._triton

    async def _reconnect(self, failed: Any) -> None:
        # After tritonserver restarts, a channel can sit in its reconnect back-off for many seconds ("failed to
        # connect to all addresses") while a fresh one connects at once. Only the failed client is replaced: a
        # request that already reconnected keeps its channel.
        if self._triton is failed:
            self._triton = None
            with contextlib.suppress(Exception):  # a broken channel may not close cleanly
                await failed.close()

    async def call(self, attempt: Callable[[Any], Awaitable[T]], patience_s: float = RECONNECT_S) -> T:
        """`attempt(triton client)`; Triton unreachable -> a fresh channel, retried for up to `patience_s` (at
        least once) before 503. Triton's own errors are raised as they are."""
        deadline = time.monotonic() + patience_s
        retried = False
        while True:
            triton = await self.triton()
            try:
                return await attempt(triton)
            except Exception as err:
                if not unreachable(err):
                    raise
                await self._reconnect(triton)
                if retried and time.monotonic() >= deadline:
                    raise unavailable(err) from None
            retried = True
            await asyncio.sleep(RETRY_PAUSE_S)

    async def refresh(self) -> None:
        """The served models' tasks and limits, from their configs on the server; 503 while Triton is down
        (the cached list is kept: a model that was served before is tried, with a reconnect, when it is back)."""
        from hf2triton.triton.modelconfig import model_parameters

        self.refreshed_at, self.refresh_failed = time.monotonic(), True
        try:
            ready = await self.call(lambda triton: triton.is_server_ready())
        except ApiError:
            raise
        except Exception as err:  # noqa: BLE001 - any other failure to ask is "unavailable" too
            raise unavailable(err) from None
        if not ready:
            raise unavailable("not ready")
        found = {}
        for name in self.names:
            try:
                config = (await self.call(lambda triton, name=name: triton.get_model_config(name))).config
            except ApiError:
                raise
            except Exception as err:  # noqa: BLE001 - Triton answered: this model is not loaded, so it is not listed
                log.info("model %s not listed: %s", name, err)
                continue
            parameters = model_parameters(config)
            decoupled = bool(config.model_transaction_policy.decoupled)
            groups = list(config.instance_group)
            device = "gpu" if any(g.kind == g.KIND_GPU for g in groups) else "cpu"
            found[name] = ServedModel(
                name, parameters.task, decoupled, config.max_batch_size, parameters.max_texts_per_request,
                parameters.backend, device, sum(max(g.count, 1) for g in groups) or 1,
            )  # fmt: skip
        self.models, self.refresh_failed = found, False

    def check_key(self, authorization: str | None) -> None:
        if self.api_key is None:
            return
        scheme, _, token = (authorization or "").strip().partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""  # the scheme is case-insensitive (RFC 9110)
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            message = "missing or wrong API key (send 'Authorization: Bearer <key>')"
            raise ApiError(401, message, "authentication_error", code="invalid_api_key")

    async def model(self, body: dict[str, Any], task: str) -> ServedModel:
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' is required", param="model")
        # A configured name missing from the cache (Triton restarted, a model loaded late) re-reads the list:
        # at most once a second while Triton answers, always while it did not (503 until it does).
        stale = self.refresh_failed or time.monotonic() - self.refreshed_at >= REFRESH_EVERY_S
        if name not in self.models and name in self.names and stale:
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
                raise triton_error(error)
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
            stream, first = await self.call(opened)
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
            raise triton_error(err) from None
        finally:
            if not finished and stream is not None:
                stream.cancel()

    # ------------------------------------------------------------------ embeddings

    async def embed(self, served: ServedModel, texts: list[str]) -> tuple[np.ndarray, int]:
        """The texts' embeddings and the tokens they became (the model's own count: no second tokenisation)."""
        import tritonclient.grpc as grpcclient

        # The gateway splits a request into the model's batches, which would bypass the model's own bound on
        # texts per request: bounded here, before anything reaches Triton.
        limit = self.max_embedding_inputs or served.max_texts
        if len(texts) > limit:
            message = f"'input' has {len(texts)} texts; at most {limit} per request (openai.max_embedding_inputs): split the request"
            raise ApiError(413, message, param="input", code="too_large")
        chunk = served.max_batch_size or len(texts)
        batches = [client.build_inputs(grpcclient, texts[i : i + chunk]) for i in range(0, len(texts), chunk)]
        parts = []
        try:
            results = await asyncio.gather(*(self.call(lambda triton, batch=batch: triton.infer(served.name, batch)) for batch in batches))
        except ApiError:
            raise
        except Exception as err:  # noqa: BLE001 - Triton's answer becomes an OpenAI error
            raise triton_error(err) from None
        tokens = 0
        for result in results:
            vectors = result.as_numpy(interface.EMBEDDING)
            parts.append(vectors.reshape(-1, vectors.shape[-1]))
            counts = result.as_numpy(interface.PROMPT_TOKENS)
            tokens += int(counts.sum()) if counts is not None else 0
        return np.concatenate(parts).astype(np.float32), tokens


def validation_summary() -> dict[str, Any] | None:
    """The last validation (report.json that `make serve` points $HF2TRITON_VALIDATION_REPORT at): pass/fail, when,
    and each model's result; None without one."""
    path = os.environ.get(VALIDATION_REPORT_ENV)
    if not path:
        return None
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    models = {name: bool(model.get("ok")) for name, model in (report.get("models") or {}).items()}
    finished = report.get("finished_at")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(finished)) if isinstance(finished, (int, float)) else ""
    return {"ok": bool(report.get("ok")), "time": when, "models": models}


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


def host_name(header: str) -> str:
    """The name in a Host header: no port, no IPv6 brackets, lower case, no trailing dot."""
    value = header.strip().lower()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def served_names(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names the gateway answers under: loopback, this machine's names, the host it binds, the configured
    ones (openai.allowed_hosts). IP literals are always answered: an address cannot be re-bound by DNS."""
    return frozenset(host_name(name) for name in (*LOOPBACK_NAMES, socket.gethostname(), socket.getfqdn(), bind_host, *extra) if name)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _peer(scope: Scope) -> str:
    peer = scope.get("client")
    return f"{peer[0]}:{peer[1]}" if peer else "?"


async def _refuse(scope: Scope, receive: Receive, send: Send, err: ApiError) -> None:
    """One log line (what the request carried is quoted: never a line of its own) and the error; the connection
    is closed after it, its body (maybe huge, maybe slow) never read."""
    log.warning("refused %s %r from %s: %s", scope["method"], scope["path"][:200], _peer(scope), err.message)
    await JSONResponse(err.body(), status_code=err.status, headers={"Connection": "close"})(scope, receive, send)


class Boundary:
    """What every request passes before any route (unknown ones too), as pure ASGI (BaseHTTPMiddleware would
    break streaming): the Host is a name the gateway serves under (421: DNS rebinding), an Origin is the
    gateway's own or an allowed one (403; allowed ones get CORS headers and preflights, never a wildcard), a POST
    body is JSON (415: browsers send text/plain and forms cross-site without a preflight), and the body is
    bounded while it is read: by size (413, never buffered beyond it) and by time (408, then the connection closes)."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str], origins: Iterable[str] = (), timeout_s: float = 30.0):
        self.app, self.hosts, self.timeout_s = app, hosts, timeout_s
        self.origins = frozenset(origin.strip().rstrip("/").lower() for origin in origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers, method = Headers(scope=scope), scope["method"]
        host = headers.get("host", "")
        name = host_name(host)
        if name not in self.hosts and not _is_ip(name):
            message = f"this gateway does not answer for host {name!r}; if clients reach it under that name, add it to openai.allowed_hosts"
            await _refuse(scope, receive, send, ApiError(421, message, code="host_not_allowed"))
            return
        cors: list[tuple[bytes, bytes]] = []
        origin = headers.get("origin")
        if origin is not None:
            normalized = origin.strip().rstrip("/").lower()
            if normalized in self.origins:
                cors = [(b"access-control-allow-origin", origin.strip().encode("latin-1")), (b"vary", b"Origin")]
                if method == "OPTIONS" and "access-control-request-method" in headers:  # a CORS preflight
                    await send({"type": "http.response.start", "status": 204, "headers": [*cors, *PREFLIGHT_HEADERS]})
                    await send({"type": "http.response.body", "body": b""})
                    return
            elif normalized != f"{scope.get('scheme', 'http')}://{host.strip().lower()}":  # not the gateway's own origin
                message = f"cross-origin requests from {origin!r} are not allowed; add the origin to openai.allowed_origins to allow it"
                await _refuse(scope, receive, send, ApiError(403, message, "permission_error", code="origin_not_allowed"))
                return
        if method == "POST" and headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
            message = f"the body must be JSON sent as Content-Type: application/json (got {headers.get('content-type', 'none')!r})"
            await _refuse(scope, receive, send, ApiError(415, message, code="unsupported_media_type"))
            return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            message = f"request body of {length} bytes exceeds {MAX_BODY_BYTES}"
            await _refuse(scope, receive, send, ApiError(413, message, code="too_large"))
            return

        deadline = time.monotonic() + self.timeout_s
        received, complete, cut = 0, False, False

        async def bounded_receive() -> Message:
            # raised inside the route's body read: the route's ApiError handler answers, `cut` closes the connection
            nonlocal received, complete, cut
            if complete:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0))
            except asyncio.TimeoutError:
                cut = True
                log.warning("client %s did not send its request body within %g s (openai.request_timeout_s)", _peer(scope), self.timeout_s)
                raise ApiError(408, f"the request body did not arrive within {self.timeout_s:g} s", code="timeout") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:
                    cut = True
                    raise ApiError(413, f"request body exceeds {MAX_BODY_BYTES} bytes", code="too_large")
            complete = not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start" and (cors or cut):
                message = {**message, "headers": [*message.get("headers", []), *cors, *([(b"connection", b"close")] if cut else [])]}
            await send(message)

        await self.app(scope, bounded_receive, guarded_send)


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """`work`'s result, or None when the client disconnects first: `work` is cancelled (a non-streamed
    generation's Triton stream with it, so the generation stops)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
    return None if task.cancelled() else task.result()


def create_app(
    gateway: Gateway, hosts: frozenset[str] | None = None, origins: Iterable[str] = (), request_timeout_s: float = 30.0
) -> FastAPI:
    """The gateway's app; `hosts`: the names it answers under (served_names), `origins`: web origins allowed
    to call it from a browser, `request_timeout_s`: the time a client has to send its body."""
    app = FastAPI(title="hf2triton OpenAI-compatible gateway", docs_url=None, redoc_url=None)
    app.add_middleware(Boundary, hosts=served_names("127.0.0.1") if hosts is None else hosts, origins=origins, timeout_s=request_timeout_s)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, err: RequestValidationError):
        return JSONResponse(ApiError(400, str(err)[:300]).body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):  # unknown routes and methods: OpenAI's error object too
        path = request.url.path[:200]
        if err.status_code == 404:
            message = f"no endpoint {path} (GET /v1/models, POST /v1/chat/completions, /v1/completions, /v1/embeddings)"
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
        log.info("client %s left before sending its whole request (%s %r)", _peer(request.scope), request.method, request.url.path[:200])
        return JSONResponse(ApiError(400, "the client left").body(), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception):
        log.exception("gateway error")
        return JSONResponse(ApiError(500, f"internal error: {type(err).__name__}", "server_error").body(), status_code=500)

    async def read_body(request: Request) -> dict[str, Any]:
        gateway.check_key(request.headers.get("authorization"))
        raw = await request.body()  # bounded in size and time by Boundary
        try:
            body = json.loads(raw or b"{}")
        except RecursionError:
            raise ApiError(400, "the body is nested too deeply") from None
        except ValueError as err:
            raise ApiError(400, f"the body is not valid JSON ({err})") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    @app.get("/health")
    async def health():
        try:  # no waiting: a probe wants an answer now (an unreachable Triton gets one fresh channel at once)
            ready = await gateway.call(lambda triton: triton.is_server_ready(), patience_s=0)
        except Exception:  # noqa: BLE001 - not ready
            ready = False
        return JSONResponse({"gateway": "up", "triton_ready": ready}, status_code=200 if ready else 503)

    @app.get("/", include_in_schema=False)
    @app.get("/playground", include_in_schema=False)
    async def to_playground():
        return RedirectResponse("/playground/", status_code=307)

    pages = {name: (path.read_bytes(), media_type) for name, (path, media_type) in PLAYGROUND_FILES.items()}  # read once

    @app.get("/playground/{name:path}", include_in_schema=False)
    async def playground(name: str):
        """The playground's static files (no data in them: every figure comes from /v1 with the key)."""
        found = pages.get(name or "index.html")
        if found is None:
            raise ApiError(404, f"no playground file {name[:100]!r}", code="not_found")
        content, media_type = found
        return Response(content, media_type=media_type, headers=PAGE_HEADERS)

    @app.get("/v1/status")
    async def status(request: Request):
        """hf2triton's own: the served models with backend, device and instances, Triton's readiness and the last
        validation result (what the playground's Status view shows)."""
        gateway.check_key(request.headers.get("authorization"))
        await gateway.refresh()
        models = [
            {"id": m.name, "task": m.task, "backend": m.backend, "device": m.device, "instances": m.instances,
             "max_batch_size": m.max_batch_size, "streaming": m.streaming}
            for m in gateway.models.values()
        ]  # fmt: skip
        return {"triton_ready": True, "models": models, "validation": validation_summary()}

    @app.get("/v1/models")
    async def models(request: Request):
        gateway.check_key(request.headers.get("authorization"))
        await gateway.refresh()  # 503 while Triton is down: an empty list would read as "nothing is served"
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
            prompt = _text(raw, "prompt")
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        pieces = gateway.generate(served, prompt, options)
        if not body.get("stream"):

            async def collect() -> tuple[str, dict[str, Any]]:
                text, final = [], {}
                async for piece, info in pieces:
                    text.append(piece)
                    final = info or final
                return "".join(text), final

            collected = await unless_client_leaves(request, collect())
            if collected is None:  # nobody reads this answer
                log.info("client %s left before its answer: the generation was cancelled", _peer(request.scope))
                return JSONResponse(ApiError(400, "the client left").body(), status_code=400)
            answer, final = collected
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
