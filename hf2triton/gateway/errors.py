"""OpenAI's error object, and Triton's failures mapped onto its status classes: every gateway module raises
`ApiError`, app.py's handler answers it."""

from __future__ import annotations

import re
from typing import Any

from hf2triton.errors import UserError
from hf2triton.serving import interface

# gRPC's words for "no connection" (down, restarting, or this channel in its reconnect back-off), as opposed to
# Triton's own UNAVAILABLE answers about a request (a full queue is 429, not retried). "Internal error from Core" is
# gRPC's INTERNAL for a connection cut mid-call (tritonserver killed as a request reached it), never Triton's words.
UNREACHABLE = (
    "failed to connect",
    "connection refused",
    "connection reset",
    "socket closed",
    "broken pipe",
    "goaway",
    "rst_stream",
    "internal error from core",
)
# Triton's words for a model of ours that is not (yet) loaded: a restart, a reload. A 400 would tell SDKs not to retry.
LOADING = ("unknown model", "no available versions", "is not ready")
RETRY_AFTER_S = 2  # sent with every 503 and 429: how long a client waits before trying again


class ApiError(Exception):
    """An OpenAI-style error: HTTP status, message, type, the offending parameter."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def headers(self) -> dict[str, str]:
        """Retry-After on the states that pass (not ready, restarting, busy): SDKs retry those, and wait that long."""
        return {"Retry-After": str(RETRY_AFTER_S)} if self.status in (429, 503) else {}

    def body(self) -> dict[str, Any]:
        message = self.message.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate from the request cannot be sent
        return {"error": {"message": message, "type": self.kind, "param": self.param, "code": self.code}}


def reason(err: BaseException) -> str:
    """Triton's or gRPC's own words for a failure, without the client library's wrapping ("[StatusCode.X] ",
    AioRpcError's multi-line repr)."""
    details, message = getattr(err, "details", None), getattr(err, "message", None)
    text = details() if callable(details) else message() if callable(message) else str(err)
    return re.sub(r"^\[StatusCode\.\w+\]\s*", "", str(text or "")).strip() or type(err).__name__


def status_code(err: BaseException) -> str:
    """gRPC's status code of a failure ("UNAVAILABLE", ...; "" where it has none): tritonclient's status(), grpc's
    code(), or the "[StatusCode.X]" its text starts with."""
    for name in ("status", "code"):
        value = getattr(err, name, None)
        value = value() if callable(value) else value
        if value:
            return str(getattr(value, "name", value)).removeprefix("StatusCode.")
    found = re.match(r"^\[StatusCode\.(\w+)\]", str(err))
    return found.group(1) if found else ""


def triton_error(err: Exception, model: str = "") -> ApiError:
    """Triton's error for one request (of `model`) -> the OpenAI status class, in Triton's words."""
    if isinstance(err, UserError):  # ours, on the way to Triton: the client key file (hf2triton.triton.client)
        return ApiError(503, f"{err.message} -- fix: {err.fix}" if err.fix else err.message, "server_error", code="unavailable")
    text = reason(err)
    lowered = text.lower()
    if "busy" in lowered or "exceeds the maximum queue size" in lowered:
        return ApiError(429, text, "rate_limit_error", code="busy")
    if any(
        limit in lowered
        for limit in ("max_input_bytes", "max_texts_per_request", "max_request_bytes", "max_image_pixels", "max_audio_seconds")
    ):
        return ApiError(413, text, code="too_large")
    if "unavailable" in lowered or any(words in lowered for words in (*UNREACHABLE, "stream removed")):
        return unavailable(text)
    if any(words in lowered for words in LOADING):  # a configured model: the gateway answers 404 for others first
        return not_loaded(model)
    if "stub process" in lowered or "not healthy" in lowered:  # the model's Python process died: the server's fault
        return ApiError(503, f"the model's process is not healthy (the supervisor restarts it): {text}", "server_error", code="unavailable")
    if status_code(err) == "UNAVAILABLE":  # gRPC's, whatever its words (a connection to a server dying has several)
        return unavailable(text)
    if interface.INTERNAL_ERROR in text:  # the model's own failure (an engine that raised): SDKs retry a 500, not a 400
        return ApiError(500, text, "server_error", code="internal_error")
    return ApiError(400, text)


def unreachable(err: BaseException) -> bool:
    """Triton could not be reached at all (no answer about the request itself)."""
    text = str(err).lower()
    return "unavailable" in text and any(words in text for words in UNREACHABLE)


def unavailable(detail: str | BaseException) -> ApiError:
    detail = reason(detail) if isinstance(detail, BaseException) else detail  # gRPC's own words, not its repr
    return ApiError(503, f"the Triton server is unavailable ({detail[:200]}); retry shortly", "server_error", code="unavailable")


def not_loaded(model: str) -> ApiError:
    """A model of ours that Triton does not serve right now (starting, restarting, reloading): 503, not 400/404."""
    what = f"model {model!r}" if model else "the model"
    message = f"{what} is not loaded yet (the server is starting or reloading it); retry shortly"
    return ApiError(503, message, "server_error", code="unavailable")


def not_served(model: str) -> ApiError:
    return ApiError(404, f"model {model[:100]!r} is not served here (GET /v1/models lists them)", param="model", code="model_not_found")
