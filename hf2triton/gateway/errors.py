"""OpenAI's error object, and Triton's failures mapped onto its status classes: every gateway module raises
`ApiError`, app.py's handler answers it."""

from __future__ import annotations

from typing import Any

# gRPC's words for "no connection" (down, restarting, or this channel in its reconnect back-off), as opposed to
# Triton's own UNAVAILABLE answers about a request (a full queue is 429, not retried)
UNREACHABLE = ("failed to connect", "connection refused", "connection reset", "socket closed", "broken pipe", "goaway")


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
