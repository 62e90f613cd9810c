"""The one client helper for a Triton server on this machine: plain HTTP GET/POST (health, repository
control, statistics), the Prometheus metrics endpoint, and inference inputs built from the serving interface
for tritonclient's HTTP and gRPC modules (sync or asyncio). validate, bench, loadgen, soak and tune use it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hf2triton.errors import UserError
from hf2triton.serving import interface

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")

# --- the client key ---------------------------------------------------------------------------------------
# tritonserver has no Host or Origin check, so loopback alone does not keep web pages out (DNS rebinding,
# cross-site "simple" POSTs). Every server of ours therefore restricts its metadata, inference, model-config
# and statistics APIs (HTTP and gRPC) to requests carrying this header; health stays open for probes. The key
# is per user (0600 file, created by serve), so every hf2triton client of this user -- gateway, CLI,
# validation, bench, tests -- finds it without configuration; a browser page cannot read the file, and a
# custom header on a cross-site request needs a CORS preflight that Triton never grants.
KEY_HEADER = "hf2triton-key"
GRPC_KEY_HEADER = f"triton-grpc-protocol-{KEY_HEADER}"  # how tritonserver names a restricted gRPC header
KEY_FILE_ENV = "HF2TRITON_KEY_FILE"
CLIENT_KEY_APIS = "metadata,inference,model-config,statistics"


def key_file() -> Path:
    """$HF2TRITON_KEY_FILE, else ~/.config/hf2triton/triton.key (XDG_CONFIG_HOME respected)."""
    if os.environ.get(KEY_FILE_ENV):
        return Path(os.environ[KEY_FILE_ENV])
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "hf2triton" / "triton.key"


_KEY_CACHE: dict[Path, tuple[int, str]] = {}
KEY_FIX = "`make serve` creates it (or `python -m hf2triton key --new`)"


def client_key() -> str:
    """The key Triton's client APIs require, read from key_file(). Only serve (create_key) writes it: a client
    that made a new key when the file was missing would lock every running server out of its own clients."""
    path = key_file()
    try:
        stamp = path.stat().st_mtime_ns
        if _KEY_CACHE.get(path) is None or _KEY_CACHE[path][0] != stamp:  # read once per change, not per request
            _KEY_CACHE[path] = (stamp, path.read_text().strip())
        key = _KEY_CACHE[path][1]
    except FileNotFoundError:
        raise UserError(f"the client key file {path} is missing", f"{KEY_FIX}; servers already running keep their key") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read the client key file {path}: {err}", f"make it readable by this user, or {KEY_FIX}") from None
    if not key:
        raise UserError(f"the client key file {path} is empty", KEY_FIX)
    return key


def create_key(replace: bool = False) -> str:
    """The client key, created (0600 in a 0700 directory) when missing, or a new one when `replace`: `serve`
    and `python -m hf2triton key --new` only."""
    path = key_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    written = path.with_name(f".{path.name}.{secrets.token_hex(4)}") if replace else path  # replaced in one rename
    try:
        fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # there already, or another serve made it first: use it
        return client_key()
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    if replace:
        os.replace(written, path)
    return client_key()


def key_digest(secret: str, salt: str) -> str:
    """A keyed digest of a secret for state files and comparisons (never the secret itself)."""
    return hmac.new(salt.encode(), secret.encode(), hashlib.sha256).hexdigest()


def key_headers() -> dict[str, str]:
    """HTTP headers that open Triton's client APIs."""
    return {KEY_HEADER: client_key()}


class _KeyPlugin:
    """tritonclient plugin: every request of a client carries the key (HTTP header or gRPC metadata)."""

    def __init__(self, header: str):
        self.header = header

    def __call__(self, request: Any) -> None:
        request.headers[self.header] = client_key()


def keyed(triton: Any) -> Any:
    """A tritonclient InferenceServerClient (HTTP or gRPC, sync or asyncio) that sends the key."""
    grpc = "grpc" in type(triton).__module__
    triton.register_plugin(_KeyPlugin(GRPC_KEY_HEADER if grpc else KEY_HEADER))
    return triton


def http_client(url: str, **kwargs: Any) -> Any:
    import tritonclient.http as httpclient

    return keyed(httpclient.InferenceServerClient(url, **kwargs))


def grpc_client(url: str, **kwargs: Any) -> Any:
    import tritonclient.grpc as grpcclient

    return keyed(grpcclient.InferenceServerClient(url, **kwargs))


def _triton_headers(url: str, headers: dict[str, str] | None) -> dict[str, str]:
    """Requests to Triton's API (/v2/...) carry the key; others (the gateway's /v1) do not."""
    if urllib.parse.urlsplit(url).path.startswith("/v2/"):
        return {**key_headers(), **(headers or {})}
    return dict(headers or {})


NUMPY_TYPES = {"BYTES": np.object_, "FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_}
INTEGER_SIZES = {"INT32": 4, "INT64": 8, "UINT32": 4, "UINT64": 8}  # bytes per element, little-endian on the wire
# fill-mask's top_k is the same tensor (INT32) as streaming generation's
_OPTIONS = (*interface.GENERATION_OPTIONS, *interface.STREAMING_OPTIONS)
_OPTIONS += (*interface.TOKEN_CLASSIFICATION_OPTIONS, *interface.FILL_MASK_OPTIONS, *interface.TEXT_RANKING_OPTIONS)
_OPTIONS += (*interface.EMBEDDING_OPTIONS, *interface.IMAGE_CLASSIFICATION_OPTIONS, *interface.ZERO_SHOT_IMAGE_OPTIONS)
_OPTIONS += interface.SPEECH_OPTIONS
_OPTIONS += tuple(t for t in interface.ZERO_SHOT_EMBEDDING_INPUTS if t.name != interface.TEXT)  # embed (BOOL)
OPTION_TENSORS = {t.name: t for t in _OPTIONS}


def http_get(url: str, timeout: float = 2.0, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, body); status 0 when nothing answers."""
    try:
        request = urllib.request.Request(url, headers=_triton_headers(url, headers))  # noqa: S310 - our own host/port
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http on our own host/port
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, ""


def _json_post(url: str, headers: dict[str, str] | None, body: dict | None) -> urllib.request.Request:
    data = json.dumps(body or {}).encode()
    headers = {"Content-Type": "application/json", **_triton_headers(url, headers)}
    return urllib.request.Request(url, data=data, headers=headers, method="POST")  # noqa: S310


def http_post(url: str, headers: dict[str, str] | None = None, body: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    request = _json_post(url, headers, body)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - our own server
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


def http_post_events(url: str, headers: dict[str, str] | None = None, body: dict | None = None, timeout: float = 300) -> Iterator[dict]:
    """The server-sent events of a streamed POST (`data: {...}` lines until `data: [DONE]`), parsed.
    An error status raises urllib.error.HTTPError."""
    with urllib.request.urlopen(_json_post(url, headers, body), timeout=timeout) as response:  # noqa: S310 - our own server
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                yield json.loads(line[5:])


def is_live(http_url: str) -> bool:
    return http_get(f"http://{http_url}/v2/health/live")[0] == 200


def is_ready(http_url: str) -> bool:
    return http_get(f"http://{http_url}/v2/health/ready")[0] == 200


def model_ready(http_url: str, model: str) -> bool:
    return http_get(f"http://{http_url}/v2/models/{model}/ready")[0] == 200


# --- statistics and metrics ------------------------------------------------------------------------------


def model_statistics(http_url: str, model: str) -> dict[str, int]:
    """Cumulative counters of one model: successes, executions, inferences and the ns spent per phase."""
    status, body = http_get(f"http://{http_url}/v2/models/{model}/stats", timeout=10)
    if status != 200:
        raise OSError(f"statistics of {model} at {http_url}: HTTP {status}")
    totals: dict[str, int] = {"execution_count": 0, "inference_count": 0}
    for entry in json.loads(body)["model_stats"]:
        totals["execution_count"] += int(entry.get("execution_count", 0))
        totals["inference_count"] += int(entry.get("inference_count", 0))
        for phase, value in entry.get("inference_stats", {}).items():
            totals[f"{phase}_count"] = totals.get(f"{phase}_count", 0) + int(value.get("count", 0))
            totals[f"{phase}_ns"] = totals.get(f"{phase}_ns", 0) + int(value.get("ns", 0))
    return totals


def parse_metrics(text: str, model: str, include_gpu: bool = True) -> dict[str, float]:
    """Prometheus text -> {metric: value summed over series} for `model` (plus the nv_gpu_* gauges)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0]
        if f'model="{model}"' in name or (include_gpu and metric.startswith("nv_gpu_")):
            try:
                out[metric] = out.get(metric, 0.0) + float(value)
            except ValueError:
                continue
    return out


def model_metrics(metrics_url: str, model: str) -> dict[str, float]:
    """The metrics endpoint's counters and gauges for `model` now (empty when it does not answer)."""
    status, text = http_get(f"http://{metrics_url}/metrics", timeout=10)
    return parse_metrics(text, model) if status == 200 else {}


# --- inference inputs ------------------------------------------------------------------------------------


def input_arrays(
    texts: list[bytes] | list[str], options: dict[str, Any] | None = None, one_prompt: bool = False, primary: str = interface.TEXT
) -> list[tuple[str, str, np.ndarray]]:
    """(name, datatype, array) per input tensor: the texts as [n, 1] BYTES (`primary`: the tensor they go in, IMAGE for
    an image task's encoded images), each option (max_new_tokens, temperature, ...) repeated per row as the interface
    declares it; `one_prompt` (a streaming model): shape [1] per tensor, `stop` a list of strings."""
    encoded = [t.encode("utf-8") if isinstance(t, str) else t for t in texts]
    shape = (1,) if one_prompt else (len(encoded), 1)
    arrays = [(primary, "BYTES", np.array(encoded, dtype=np.object_).reshape(shape))] if encoded else []
    for name, value in (options or {}).items():
        if value is None:
            continue
        tensor = OPTION_TENSORS[name]
        if name == interface.CANDIDATE_LABELS and not isinstance(value, str):  # a list of labels: its JSON on every row
            value = json.dumps(list(value), ensure_ascii=False)
        if name in (interface.MESSAGES, interface.TOOLS, interface.GUIDED):  # JSON: the chat form, its tools, a constraint
            arrays.append((name, tensor.datatype, np.array([json.dumps(value, ensure_ascii=False).encode("utf-8")], dtype=np.object_)))
            continue
        if name == interface.STOP:
            arrays.append((name, tensor.datatype, np.array([s.encode("utf-8") for s in value], dtype=np.object_)))
            continue
        if name == interface.PROMPT_IDS:  # a prompt as token ids: one list
            arrays.append((name, tensor.datatype, np.array(value, dtype=NUMPY_TYPES[tensor.datatype])))
            continue
        if tensor.datatype == "BYTES" and isinstance(value, str):  # e.g. aggregation_strategy, a query, a prompt_name
            value = value.encode("utf-8")
        arrays.append((name, tensor.datatype, np.full(shape, value, dtype=NUMPY_TYPES[tensor.datatype])))
    return arrays


def build_inputs(
    client_module: Any,
    texts: list[bytes] | list[str],
    options: dict[str, Any] | None = None,
    one_prompt: bool = False,
    primary: str = interface.TEXT,
) -> list:
    """tritonclient InferInput objects (client_module: tritonclient.http or tritonclient.grpc)."""
    inputs = []
    for name, datatype, array in input_arrays(texts, options, one_prompt, primary):
        tensor = client_module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def generate_body(texts: list[bytes] | list[str], options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of Triton's generate / generate_stream for one prompt: the tensors input_arrays builds for a
    streaming model, each as a JSON value -- one element as its scalar, several as an array (Triton's generate extension
    makes an array an [n] input: the stop strings, a prompt's token ids), BYTES as text."""
    body: dict[str, Any] = {}
    for name, _, array in input_arrays(texts, options, one_prompt=True):
        values = [v.decode("utf-8") if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()]
        body[name] = values[0] if len(values) == 1 else values
    return body


def is_loopback(host: str) -> bool:
    return host in LOOPBACK


# --- streaming generation (decoupled models) ------------------------------------------------------------


def first_values(result: Any) -> dict[str, bytes | int]:
    """A gRPC InferResult's outputs by name, each output's first element: a BYTES tensor's as bytes, an integer
    tensor's as int. Read from the response's raw contents in one pass: 2.9 us per streamed piece in the gateway's
    worker instead of 7.2 through InferResult.as_numpy per name (a walk over the outputs, a numpy array and a reshape
    each; 2 cores, benchmarks/probes/stream_outputs.py)."""
    message = result.get_response()
    raw = message.raw_output_contents
    values: dict[str, bytes | int] = {}
    if len(raw) != len(message.outputs):  # contents sent typed instead of raw: tritonclient's own reading
        for output in message.outputs:
            array = result.as_numpy(output.name).reshape(-1)
            if array.size and (output.datatype == "BYTES" or output.datatype in INTEGER_SIZES):
                values[output.name] = array[0] if output.datatype == "BYTES" else int(array[0])
        return values
    for output, content in zip(message.outputs, raw):
        if output.datatype == "BYTES":  # each element: a 4-byte little-endian length, then its bytes
            if len(content) >= 4:
                values[output.name] = content[4 : 4 + int.from_bytes(content[:4], "little")]
        elif output.datatype in INTEGER_SIZES and len(content) >= INTEGER_SIZES[output.datatype]:
            values[output.name] = int.from_bytes(content[: INTEGER_SIZES[output.datatype]], "little", signed=output.datatype[0] == "I")
    return values


def stream_generate(
    grpc_url: str,
    model: str,
    text: str | bytes | list[dict[str, str]],
    options: dict[str, Any] | None = None,
    timeout_s: float = 300,
    on_piece: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One prompt (a text, or chat messages [{"role", "content"}, ...]) through gRPC ModelStreamInfer:
    {"pieces": [...], "text", "finish_reason", "prompt_tokens", "completion_tokens", "first_piece_s",
    "piece_times_s"}; raises the server's error."""
    import queue
    import time

    import tritonclient.grpc as grpcclient

    events: queue.Queue = queue.Queue()
    triton = grpc_client(grpc_url)
    triton.start_stream(callback=lambda result, error: events.put((result, error, time.perf_counter())))
    started = time.perf_counter()
    finished = False
    try:
        texts, options = ([text], options) if isinstance(text, (str, bytes)) else ([], {**(options or {}), interface.MESSAGES: text})
        triton.async_stream_infer(model, build_inputs(grpcclient, texts, options, one_prompt=True), enable_empty_final_response=False)
        out: dict[str, Any] = {"pieces": [], "piece_times_s": []}
        while True:
            result, error, at = events.get(timeout=timeout_s)
            if error is not None:
                raise error
            piece = result.as_numpy(interface.TEXT_OUTPUT)
            out["pieces"].append(piece.reshape(-1)[0].decode("utf-8") if piece is not None else "")
            if on_piece is not None:
                on_piece(out["pieces"][-1])
            out["piece_times_s"].append(at - started)
            reason = result.as_numpy(interface.FINISH_REASON)
            if reason is not None:
                out.update(
                    text="".join(out["pieces"]),
                    finish_reason=reason.reshape(-1)[0].decode(),
                    prompt_tokens=int(result.as_numpy(interface.PROMPT_TOKENS).reshape(-1)[0]),
                    completion_tokens=int(result.as_numpy(interface.COMPLETION_TOKENS).reshape(-1)[0]),
                    first_piece_s=out["piece_times_s"][0],
                )
                finished = True
                return out
    finally:
        # Left early (Ctrl-C, an error, the timeout): cancel, so the server stops generating and this returns at
        # once; a plain stop_stream() would join the stream's thread, i.e. wait for the whole answer.
        triton.stop_stream(cancel_requests=not finished)
        triton.close()


def http_generate(http_url: str, model: str, body: dict[str, Any], timeout: float = 300) -> tuple[int, dict[str, Any]]:
    """POST /v2/models/<model>/generate (one JSON answer; for a streaming model send "stream": false)."""
    status, text = http_post(f"http://{http_url}/v2/models/{model}/generate", body=body, timeout=timeout)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, {"error": text}
