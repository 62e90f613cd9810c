"""Connection limits uvicorn does not have: a deadline for a request's headers, and a bound per client address.

uvicorn times out an idle keep-alive connection, but a connection that sends part of a header and then nothing
stays open for good: 50 such sockets were still open after 119 s, and about 20,000 of them exhausted the
gateway's open files and locked out every client, `/health` included (issue 42 #4). So every connection gets
HEADER_TIMEOUT_S for the headers of each request (from its first byte, or from the connection's start), and one
client address holds at most MAX_PER_CLIENT connections at once -- a further one is closed as it opens, before
a byte is read. The body has its own deadline (the Boundary middleware's request timeout).

uvicorn takes the protocol by import string (`http="hf2triton.gateway.connections:GuardedHttpTools"`), so its
worker processes (--workers) build it too; the limits come from the environment for the same reason.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("hf2triton.gateway")

HEADER_TIMEOUT_ENV = "HF2TRITON_GATEWAY_HEADER_TIMEOUT_S"
MAX_PER_CLIENT_ENV = "HF2TRITON_GATEWAY_MAX_PER_CLIENT"
HEADER_TIMEOUT_S = 10.0
# Loopback clients all share 127.0.0.1: the bound must let a busy local load generator through (1,024 streams),
# yet keep one address well under the process's open-file limit.
MAX_PER_CLIENT = 1024


def _limit(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        return default


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a per-address connection bound."""

    open_per_client: Counter = Counter()  # per worker process: one event loop, no lock needed

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = _limit(HEADER_TIMEOUT_ENV, HEADER_TIMEOUT_S)
        self.max_per_client = int(_limit(MAX_PER_CLIENT_ENV, MAX_PER_CLIENT))
        self.header_deadline = None
        self.address = ""

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.address = self.client[0] if self.client else ""
        if self.open_per_client[self.address] >= self.max_per_client:
            log.warning("refused a connection from %s: %d already open (the per-client bound)", self.address, self.max_per_client)
            self.address = ""  # not counted
            transport.close()
            return
        self.open_per_client[self.address] += 1
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        if self.address:
            self.open_per_client[self.address] -= 1
            if self.open_per_client[self.address] <= 0:
                del self.open_per_client[self.address]
            self.address = ""
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._await_headers()  # a new request on a kept-alive connection: its headers have the same deadline

    def on_headers_complete(self) -> None:
        self._headers_arrived()
        super().on_headers_complete()

    def _await_headers(self) -> None:
        self._headers_arrived()
        self.header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _headers_arrived(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def _headers_too_slow(self) -> None:
        self.header_deadline = None
        if self.cycle is None or self.cycle.response_complete:  # no request is being answered on this connection
            log.warning("closed a connection from %s: no complete request headers in %.0f s", self.address or "?", self.header_timeout_s)
            self.transport.close()
