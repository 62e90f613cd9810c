"""What every request passes before its endpoint's code: the Host, the Origin, the Content-Type, the body's size
and time (`Boundary`, ASGI middleware around every route, unknown ones too) and the API key (`require_key`, declared
by each route that needs it: /health and the playground's files do not, an unknown route stays a 404).

Loopback is no boundary against web pages: a page can POST "simple" cross-site requests (text/plain, forms) and a
name re-bound to 127.0.0.1 (DNS rebinding) makes it same-origin. So every request passes `Boundary` first: the Host
must be a name the gateway serves under, a foreign Origin is refused (allowed ones get CORS headers, never a
wildcard), POST bodies must be JSON (the audio endpoints: a multipart form), and a body is bounded in size and time
while it is read: 8 MiB for JSON, 25 MiB (openai.max_audio_upload_mib) for an audio form. The API key comes from
an environment variable, never from config.yaml; requests are compared in constant time and the key is never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import socket
import time
from collections.abc import Iterable

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hf2triton.gateway.errors import ApiError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024  # a JSON body
# an audio form: OpenAI takes files up to 25 MB, refusing bodies over 26214400 bytes (25 MiB), which holds such a file
# with its form fields; openai.max_audio_upload_mib sets it
MAX_AUDIO_UPLOAD_MIB = 25
MIB = 1024 * 1024
# OpenAI's audio endpoints take a multipart form (the file): only there, and cross-site only from an allowed Origin
# (a browser sends Origin on every cross-origin POST, so a foreign page's form post is refused like a JSON one)
FORM = "multipart/form-data"
FORM_PATHS = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
PREFLIGHT_HEADERS = [
    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
    (b"access-control-allow-headers", b"Authorization, Content-Type"),
    (b"access-control-max-age", b"600"),
]


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


def peer(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


def check_key(api_key: str | None, authorization: str | None) -> None:
    """401 unless `authorization` is `Bearer <api_key>` (no key configured: every request passes)."""
    if api_key is None:
        return
    scheme, _, token = (authorization or "").strip().partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else ""  # the scheme is case-insensitive (RFC 9110)
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        message = "missing or wrong API key (send 'Authorization: Bearer <key>')"
        raise ApiError(401, message, "authentication_error", code="invalid_api_key")


async def require_key(request: Request) -> None:
    """A route's dependency (`dependencies=KEY`): checked before its body is read."""
    check_key(request.app.state.gateway.api_key, request.headers.get("authorization"))


KEY = [Depends(require_key)]


async def _refuse(scope: Scope, receive: Receive, send: Send, err: ApiError) -> None:
    """One log line (what the request carried is quoted: never a line of its own) and the error; the connection
    is closed after it, its body (maybe huge, maybe slow) never read."""
    log.warning("refused %s %r from %s: %s", scope["method"], scope["path"][:200], peer(scope), err.message)
    await JSONResponse(err.body(), status_code=err.status, headers={"Connection": "close"})(scope, receive, send)


class Boundary:
    """What every request passes before any route (unknown ones too), as pure ASGI (BaseHTTPMiddleware would
    break streaming): the Host is a name the gateway serves under (421: DNS rebinding), an Origin is the
    gateway's own or an allowed one (403; allowed ones get CORS headers and preflights, never a wildcard), a POST
    body is JSON (415: browsers send text/plain and forms cross-site without a preflight), and the body is
    bounded while it is read: by size (413, never buffered beyond it) and by time (408, then the connection closes)."""

    def __init__(
        self, app: ASGIApp, hosts: frozenset[str], origins: Iterable[str] = (), timeout_s: float = 30.0,
        max_form_bytes: int = MAX_AUDIO_UPLOAD_MIB * MIB,
    ):  # fmt: skip
        self.app, self.hosts, self.timeout_s, self.max_form_bytes = app, hosts, timeout_s, max_form_bytes
        self.origins = frozenset(origin.strip().rstrip("/").lower() for origin in origins)

    def body_limit(self, form: bool) -> tuple[int, str]:
        """The size a body may have (an audio form's or a JSON body's), and how a refusal names it."""
        if form:
            size = f"{self.max_form_bytes / MIB:g} MiB ({self.max_form_bytes} bytes)"
            return self.max_form_bytes, f"the {size} limit of an audio upload (openai.max_audio_upload_mib)"
        return MAX_BODY_BYTES, f"the {MAX_BODY_BYTES // MIB} MiB ({MAX_BODY_BYTES} bytes) limit of a JSON body"

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
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        if method == "POST" and media != "application/json" and not (media == FORM and scope["path"] in FORM_PATHS):
            message = f"the body must be JSON sent as Content-Type: application/json (got {headers.get('content-type', 'none')!r})"
            if scope["path"] in FORM_PATHS:
                message = f"the body must be a form sent as Content-Type: {FORM} (got {headers.get('content-type', 'none')!r})"
            await _refuse(scope, receive, send, ApiError(415, message, code="unsupported_media_type"))
            return
        limit, what = self.body_limit(media == FORM and scope["path"] in FORM_PATHS)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await _refuse(scope, receive, send, ApiError(413, f"request body of {length} bytes exceeds {what}", code="too_large"))
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
                log.warning("client %s did not send its request body within %g s (openai.request_timeout_s)", peer(scope), self.timeout_s)
                raise ApiError(408, f"the request body did not arrive within {self.timeout_s:g} s", code="timeout") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    cut = True
                    raise ApiError(413, f"request body exceeds {what}", code="too_large")
            complete = not message.get("more_body", False)
            return message

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start" and (cors or cut):
                message = {**message, "headers": [*message.get("headers", []), *cors, *([(b"connection", b"close")] if cut else [])]}
            await send(message)

        await self.app(scope, bounded_receive, guarded_send)
