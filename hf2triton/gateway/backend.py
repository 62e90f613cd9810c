"""The gateway's one way to Triton: `Gateway`, the state every endpoint shares (request.app.state.gateway): the
gRPC client (one channel over every replica, replaced when Triton restarts), `call` (a Triton call retried on a
fresh channel while Triton is unreachable), `stream_http` (a generation read from Triton's HTTP event stream, where
the gateway is given --http), the served models read from Triton's configs, and the key."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Callable, TypeVar

from fastapi import Request

from hf2triton.gateway.boundary import check_key
from hf2triton.gateway.errors import ApiError, not_loaded, not_served, triton_error, unavailable, unreachable
from hf2triton.gateway.protocol import ServedModel
from hf2triton.serving import interface
from hf2triton.triton import client

log = logging.getLogger(__name__)

RECONNECT_S = 5.0  # how long a request waits for an unreachable Triton (a restart) before 503
RETRY_PAUSE_S = 0.25
REFRESH_EVERY_S = 1.0  # an unknown model name re-reads Triton's models at most this often (while Triton answers)
# tritonclient's defaults that matter (no 4 MB message limit) and a prompt reconnect after tritonserver restarts:
# each channel has its own connections (a fresh channel inherits no backed-off one) and backs off at most 1 s.
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
T = TypeVar("T")


def split_address(address: str, option: str = "--grpc") -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port); a clear ValueError naming `option` otherwise."""
    text = address.strip()
    name, sep, port = text.rpartition(":")
    name = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        example = "127.0.0.1:8001" if option == "--grpc" else "127.0.0.1:8000"
        raise ValueError(f"{option} {address!r} is not host:port (e.g. {example})")
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

    def __init__(
        self, grpc_url: str, api_key: str | None, models: list[str], max_embedding_inputs: int | None = None, http_url: str | None = None
    ):
        self.grpc_url, self.api_key, self.names = grpc_url, api_key or None, models
        self.target, self.channel_args = grpc_target(grpc_url)
        if http_url:
            split_address(http_url, "--http")  # a clear ValueError for an address that is not host:port
        self.http_url = http_url.strip() if http_url else None  # generation streams over HTTP (None: over gRPC)
        self._http: Any = None  # the aiohttp session (this worker's event loop), made on first use
        self.max_embedding_inputs = max_embedding_inputs  # None: OpenAI's limit (api/embeddings.py)
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

    async def stream_http(self, name: str, body: dict[str, Any], patience_s: float = RECONNECT_S) -> AsyncIterator[dict[str, Any]]:
        """The responses of Triton's generate_stream for `body`, each as the JSON object Triton sends (its outputs by
        name); Triton's errors raised as ApiErrors. A connection refused is retried like `call` (until a response
        starts); closing the iterator (a client gone) closes the connection, which Triton notices at its next write
        and cancels the request."""
        import aiohttp

        if self._http is None:  # no pool limit: one connection per running stream, kept alive between them
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(sock_connect=5))
        url = f"http://{self.http_url}/v2/models/{name}/generate_stream"
        deadline, retried = time.monotonic() + patience_s, False
        while True:
            try:
                response = await self._http.post(url, json=body, headers=client.key_headers())
                break
            except aiohttp.ClientConnectionError as err:  # nothing was sent: safe to retry
                if retried and time.monotonic() >= deadline:
                    raise unavailable(err) from None
            retried = True
            await asyncio.sleep(RETRY_PAUSE_S)
        finished = False
        try:
            if response.status != 200:  # refused before it was queued: Triton's {"error": ...}
                raise triton_error(RuntimeError(http_error_message(await response.text())), name)
            async for line in response.content:
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    if "error" in event:
                        raise triton_error(RuntimeError(str(event["error"])), name)
                    yield event
            finished = True
        except aiohttp.ClientError as err:
            raise unavailable(err) from None
        finally:
            if finished:
                response.release()  # the connection goes back to the pool
            else:
                response.close()  # a client gone (or an error): the connection closes, which cancels the request

    async def close(self) -> None:
        """The HTTP session's connections (uvicorn's shutdown)."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def infer(self, name: str, batches: list[list[Any]]) -> list[Any]:
        """One Triton request per batch of inputs, all at once; their results in order (Triton's errors as
        OpenAI's)."""
        try:
            return await asyncio.gather(*(self.call(lambda triton, batch=batch: triton.infer(name, batch)) for batch in batches))
        except ApiError:
            raise
        except Exception as err:  # noqa: BLE001 - Triton's answer becomes an OpenAI error
            raise triton_error(err, name) from None

    async def infer_texts(self, served: ServedModel, texts: list[str], options: dict[str, Any] | None, param: str) -> list[Any]:
        """`texts` in the model's batches, one Triton request each, all at once, with `options` on every row; their
        results in order."""
        import tritonclient.grpc as grpcclient

        bound_texts(served, len(texts), param)
        chunk = served.max_batch_size or len(texts)
        primary = interface.primary_input(served.task)  # an image model's rows are its images
        batches = [client.build_inputs(grpcclient, texts[i : i + chunk], options, primary=primary) for i in range(0, len(texts), chunk)]
        return await self.infer(served.name, batches)

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
                parameters.backend, device, sum(max(g.count, 1) for g in groups) or 1, parameters.max_new_tokens_limit,
                parameters.max_sequences if decoupled else 0, parameters.max_n, tool_parser=parameters.tool_parser,
                **embedding_facts(config, parameters),
            )  # fmt: skip
        self.models, self.refresh_failed = found, False

    def check_key(self, authorization: str | None) -> None:
        check_key(self.api_key, authorization)

    async def model(self, body: dict[str, Any], task: str | tuple[str, ...]) -> ServedModel:
        """The served model `body` names, one of `task` (a task, or the tasks an endpoint serves)."""
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' is required", param="model")
        # A configured name missing from the cache (Triton restarted, a model loaded late) re-reads the list:
        # at most once a second while Triton answers, always while it did not (503 until it does).
        stale = self.refresh_failed or time.monotonic() - self.refreshed_at >= REFRESH_EVERY_S
        if name not in self.models and name in self.names and stale:
            await self.refresh()
        served = self.models.get(name)
        if served is None and name in self.names:  # configured, not loaded now: a restart or reload, not a wrong name
            raise not_loaded(name)
        if served is None:
            raise not_served(name)
        tasks = (task,) if isinstance(task, str) else task
        if served.task not in tasks:
            raise ApiError(400, f"model {name!r} is a {served.task} model, not {' or '.join(tasks)}", param="model")
        if served.task in interface.GENERATIVE_TASKS and not served.streaming:
            message = f"model {name!r} is served static (generation.streaming: false); the gateway needs a streaming model"
            raise ApiError(400, message, param="model")
        return served


def http_error_message(text: str) -> str:
    """Triton's words in an HTTP error body ({"error": "..."}, generate_stream's as an event), or the body itself."""
    try:
        return str(json.loads(text.strip().removeprefix("data:"))["error"])
    except (ValueError, KeyError, TypeError):
        return text[:300] or "no answer"


def bound_texts(served: ServedModel, count: int, param: str) -> None:
    """413 for more texts than the model takes per request: the gateway splits a request into the model's batches,
    which would bypass the model's own bound, so it is checked here, before anything reaches Triton."""
    if count > served.max_texts:
        message = f"'{param}' has {count} texts; at most {served.max_texts} per request: split the request"
        raise ApiError(413, message, param=param, code="too_large")


def embedding_facts(config, parameters: interface.ModelParameters) -> dict[str, Any]:
    """A feature-extraction model's prompt names, width, normalisation and Matryoshka widths (ServedModel's fields)."""
    if parameters.task != interface.FEATURE_EXTRACTION:
        return {}
    try:
        names = tuple(n for n in json.loads(parameters.prompt_names or "[]") if isinstance(n, str))
    except ValueError:
        names = ()
    output = next((o for o in config.output if o.name == interface.EMBEDDING), None)
    width = int(output.dims[-1]) if output is not None and output.dims and output.dims[-1] > 0 else 0
    return {"prompt_names": names, "width": width, "normalized": parameters.normalize, "matryoshka": parameters.matryoshka_dimensions}


def gateway_of(request: Request) -> Gateway:
    """The app's Gateway (create_app puts it on app.state)."""
    return request.app.state.gateway
