"""The gateway's request mapping without a server: OpenAI parameters -> the model's inputs, Triton's errors ->
OpenAI status classes, and the boundary every request passes (driven as ASGI, no Triton behind it)."""

from __future__ import annotations

import asyncio
import json
import socket

import numpy as np
import pytest

from hf2triton.errors import UserError
from hf2triton.gateway.app import create_app
from hf2triton.gateway.backend import Gateway, http_error_message
from hf2triton.gateway.boundary import MAX_AUDIO_UPLOAD_MIB, MIB, host_name, served_names
from hf2triton.gateway.errors import ApiError, triton_error, unreachable
from hf2triton.gateway.protocol import (
    ChoiceLogprobs,
    Ranking,
    ServedModel,
    chat_messages,
    completion_answer,
    completion_chunk,
    completion_prompts,
    embedding_inputs,
    generation_options,
    predict_request,
    rerank_answer,
    rerank_request,
    sample_count,
    score_answer,
    score_pairs,
)
from hf2triton.serving import interface


def options_besides_length(body: dict, **kwargs) -> dict:
    """generation_options but the answer-length default where the body sends no max_tokens: chat OPEN_ENDED (what the
    context leaves), completions OpenAI's 16."""
    options = generation_options(body, **kwargs)
    unset = "max_tokens" not in body and "max_completion_tokens" not in body
    if kwargs.get("chat", True):
        assert options.pop("open_ended", False) == unset, body
    elif unset:
        assert options.pop("max_new_tokens") == 16 and "open_ended" not in options, body
    return options


def test_sampling_parameters_map_to_model_inputs():
    body = {"max_tokens": 20, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": "\n"}
    assert generation_options(body) == {"max_new_tokens": 20, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n"]}
    assert generation_options({"max_completion_tokens": 5, "max_tokens": 9}) == {"max_new_tokens": 5}
    assert options_besides_length({"temperature": 0.001, "top_p": 1.0}) == {"temperature": 0.0}, "below the sampling minimum = greedy"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"logit_bias": {"1": 5}}, "logit_bias"),  # tools: tests/test_tools.py
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": True}, "temperature"),
        ({"temperature": 3}, "temperature"),
        ({"stop": ["a", ""]}, "stop"),
        ({"stop": ["a"] * 65}, "stop"),
        ({"seed": 2**63}, "seed"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"min_p": 0.1}, "min_p"),
        ({"min_tokens": 4}, "min_tokens"),
        ({"top_k": -2}, "top_k"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": True}, "presence_penalty"),
        ({"stop": ["ok", "a\ud800"]}, "stop"),
    ],
)
def test_bad_parameters_are_400_naming_the_parameter(body, param):
    with pytest.raises(ApiError) as info:
        generation_options(body)
    assert info.value.status == 400 and (param is None or info.value.param == param)


def test_what_vllm_takes_is_taken_as_vllm_takes_it():
    """lm-eval's code tasks send 5-6 stop strings; vLLM's extra top_k is applied; neutral values of parameters this
    server does not apply, top_logprobs 0 without logprobs, modalities ["text"] and any 64-bit seed are accepted."""
    stops = ["\nclass", "\ndef", "\n#", "\nif", "\nprint", "<|endoftext|>"]
    assert options_besides_length({"stop": stops}) == {"stop": stops}
    assert options_besides_length({"top_k": 5}) == {"top_k": 5}
    assert options_besides_length({"top_k": -1}) == options_besides_length({"top_k": 0}) == {}, "vLLM's off"
    neutral = {"repetition_penalty": 1.0, "min_p": 0.0, "min_tokens": 0, "top_logprobs": 0, "modalities": ["text"], "presence_penalty": 0}
    assert options_besides_length(neutral) == {}
    penalties = {"presence_penalty": 0.5, "frequency_penalty": -1.0}
    assert options_besides_length({"presence_penalty": 0.5, "frequency_penalty": -1}) == penalties
    assert options_besides_length({"ignore_eos": True}) == {"ignore_eos": True} and options_besides_length({"ignore_eos": False}) == {}
    assert options_besides_length({"seed": -1}) == {"seed": 2**63 - 1}
    assert options_besides_length({"seed": 7}) == {"seed": 7}


def test_messages_and_inputs():
    parts = [{"role": "developer", "content": [{"type": "text", "text": "be"}, {"type": "input_text", "text": "brief"}]}]
    assert chat_messages({"messages": parts}) == [{"role": "system", "content": "be\nbrief"}], "joined as vLLM joins them"
    nulls = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]
    assert chat_messages({"messages": nulls})[1] == {"role": "assistant", "content": ""}
    with pytest.raises(ApiError, match="only text parts"):
        chat_messages({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
    assert embedding_inputs({"input": "x"}) == ["x"]
    with pytest.raises(ApiError, match="empty string"):
        embedding_inputs({"input": ["x", " "]})
    assert options_besides_length({"response_format": {"type": "text"}, "frequency_penalty": 0, "presence_penalty": 0.0}) == {}


def test_a_lone_surrogate_is_400_naming_the_field():
    with pytest.raises(ApiError) as info:
        chat_messages({"messages": [{"role": "user", "content": "fine"}, {"role": "user", "content": "a\ud800"}]})
    assert info.value.status == 400 and info.value.param == "messages[1].content"
    with pytest.raises(ApiError) as info:
        embedding_inputs({"input": ["ok", "\udfff"]})
    assert info.value.param == "input"
    assert chat_messages({"messages": [{"role": "user", "content": "你好 😀"}]})[0]["content"] == "你好 😀"


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("busy: 2 requests already wait (generation.max_queue = 2); retry later", 429),
        ("text of 70000 bytes exceeds max_input_bytes=65536", 413),
        ("[StatusCode.UNAVAILABLE] failed to connect to all addresses", 503),
        ("max_new_tokens=5000 exceeds generation.max_new_tokens_limit=1024", 400),
        ("Stub process 'generate_0_0' is not healthy.", 503),
        ("internal error: generation failed: RuntimeError: CUDA error: out of memory", 500),
        ("the json_schema allows no token of this model's vocabulary after 'x': it cannot write that", 400),
    ],
)
def test_triton_errors_map_to_openai_status_classes(message, status):
    assert triton_error(RuntimeError(message)).status == status


def test_only_connection_failures_are_retried_on_a_fresh_channel():
    assert unreachable(RuntimeError("[StatusCode.UNAVAILABLE] failed to connect to all addresses; last error: Connection refused"))
    assert unreachable(RuntimeError('<AioRpcError status = StatusCode.UNAVAILABLE details = "Socket closed">'))
    assert not unreachable(RuntimeError("[StatusCode.UNAVAILABLE] Exceeds the maximum queue size")), "busy is 429, at once"
    assert not unreachable(RuntimeError("[StatusCode.NOT_FOUND] Request for unknown model: 'x' is not found"))


def test_host_names_and_the_bearer_scheme():
    assert [host_name(h) for h in ("LocalHost:9000", "[::1]:9000", "::1", "example.org.", "10.0.0.1:80", "")] == [
        "localhost",
        "::1",
        "::1",
        "example.org",
        "10.0.0.1",
        "",
    ]
    names = served_names("My-Box.example", ["Models.Example.test"])
    assert {"localhost", "127.0.0.1", "::1", "my-box.example", "models.example.test", host_name(socket.gethostname())} <= names
    gateway = Gateway("127.0.0.1:1", "k3y", [])
    for header in ("Bearer k3y", "bearer k3y", "BEARER  k3y "):
        gateway.check_key(header)
    for header in ("Bearer nope", "k3y", "Basic k3y", None):
        with pytest.raises(ApiError, match="API key"):
            gateway.check_key(header)


# ------------------------------------------------------------------ the boundary, as ASGI


def asgi(method: str, path: str, headers: dict[str, str], chunks: list = (), timeout_s: float = 30.0, audio_mib: int = 25):
    """(status, headers, JSON answer) of one request to a gateway with no Triton behind it. `chunks`: the body's
    pieces as they arrive; a final None: the client stalls there (no end of body)."""
    hosts = served_names("127.0.0.1", ["ok.example"])
    app = create_app(Gateway("127.0.0.1:1", None, ["m"]), hosts, ["http://app.example:8080"], timeout_s, audio_mib)
    stall = bool(chunks) and chunks[-1] is None
    body = [c for c in chunks if c is not None]
    pending = [{"type": "http.request", "body": c, "more_body": stall or i < len(body) - 1} for i, c in enumerate(body)]
    sent = []

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in {"host": "127.0.0.1:9000", **headers}.items()]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http", "path": path}
    scope.update(
        raw_path=path.encode(), query_string=b"", root_path="", headers=raw, client=("127.0.0.1", 5000), server=("127.0.0.1", 9000)
    )
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, json.loads(answer or b"{}")


JSON = {"content-type": "application/json"}
CHAT = json.dumps({"model": "unknown", "messages": [{"role": "user", "content": "x"}]}).encode()


@pytest.mark.parametrize(
    ("method", "path", "headers", "chunks", "status", "code"),
    [
        ("GET", "/v1/models", {"host": "evil.example:9000"}, [], 421, "host_not_allowed"),
        ("GET", "/nothing", {"host": "evil.example"}, [], 421, "host_not_allowed"),
        ("POST", "/v1/chat/completions", {"host": "ok.example:9000", **JSON}, [CHAT], 404, "model_not_found"),
        ("POST", "/v1/chat/completions", {"host": "192.168.1.7:9000", **JSON}, [CHAT], 404, "model_not_found"),
        ("POST", "/v1/chat/completions", {"origin": "http://evil.example", **JSON}, [CHAT], 403, "origin_not_allowed"),
        ("POST", "/v1/chat/completions", {"origin": "http://127.0.0.1:9000", **JSON}, [CHAT], 404, "model_not_found"),
        ("POST", "/v1/chat/completions", {"content-type": "text/plain"}, [CHAT], 415, "unsupported_media_type"),
        ("POST", "/v1/embeddings", {"content-type": "application/x-www-form-urlencoded"}, [b"a=b"], 415, "unsupported_media_type"),
        ("POST", "/v1/embeddings", {"content-length": str(400 << 20), **JSON}, [], 413, "too_large"),
        ("POST", "/v1/embeddings", JSON, [b" " * (1 << 20)] * 9, 413, "too_large"),
        ("POST", "/v1/embeddings", JSON, [b"{", None], 408, "timeout"),
        ("GET", "/v1/nothing", {}, [], 404, "not_found"),
        ("GET", "/v1/chat/completions", {}, [], 405, "method_not_allowed"),
        ("POST", "/v1/chat/completions", {"content-type": "application/json; charset=utf-8"}, [b"[" * 100_000], 400, None),
    ],
)
def test_the_boundary_answers_every_route_with_openai_errors(method, path, headers, chunks, status, code):
    got, sent, answer = asgi(method, path, headers, chunks, timeout_s=0.3)
    assert got == status and answer["error"]["code"] == code, answer
    assert not any(h.startswith("access-control-") for h in sent)
    assert (sent.get("connection") == "close") == (status in (421, 403, 415, 413, 408))


def multipart(size: int) -> tuple[dict[str, str], list[bytes]]:
    """The headers and 1 MiB chunks of a form: a `model` field, a `file` of `size` bytes, then a `stream` field (not
    served: a 400 naming it once the form is read to its end, before any model is asked)."""
    head = b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n'
    head += b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'
    tail = b'\r\n--b\r\nContent-Disposition: form-data; name="stream"\r\n\r\ntrue\r\n--b--\r\n'
    body = head + b"\0" * size + tail
    return {"content-type": "multipart/form-data; boundary=b"}, [body[i : i + MIB] for i in range(0, len(body), MIB)]


def test_an_audio_form_is_bounded_at_its_own_limit_and_json_at_8_mib():
    from hf2triton.specs import OpenAISpec

    assert OpenAISpec().max_audio_upload_mib == MAX_AUDIO_UPLOAD_MIB == 25, "the config's default is the gateway's: OpenAI's 25 MB"
    form, chunks = multipart(20 * MIB)
    status, _, answer = asgi("POST", "/v1/audio/transcriptions", form, chunks)
    assert status == 400 and answer["error"]["param"] == "stream", "read to its last field, not refused for its size"
    for declared in (False, True):  # refused by its Content-Length at once, or once past the limit while it is read
        form, chunks = multipart(26 * MIB)
        headers = {**form, "content-length": str(sum(map(len, chunks)))} if declared else form
        status, sent, answer = asgi("POST", "/v1/audio/translations", headers, chunks)
        assert status == 413 and answer["error"]["code"] == "too_large" and sent["connection"] == "close", answer
        assert "25 MiB (26214400 bytes) limit of an audio upload (openai.max_audio_upload_mib)" in answer["error"]["message"], answer
    status, _, answer = asgi("POST", "/v1/embeddings", JSON, [b" " * MIB] * 20)
    assert status == 413 and "8 MiB (8388608 bytes) limit of a JSON body" in answer["error"]["message"], answer
    form, chunks = multipart(2 * MIB)
    status, _, answer = asgi("POST", "/v1/audio/transcriptions", form, chunks, audio_mib=1)
    assert status == 413 and "the 1 MiB (1048576 bytes) limit" in answer["error"]["message"], answer


def test_a_cross_site_form_post_is_refused_before_its_body_is_read():
    form, chunks = multipart(1024)
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):  # the body never comes: reading it would be a 408
        status, sent, answer = asgi("POST", path, {**form, "origin": "https://evil.example"}, [*chunks, None], timeout_s=5)
        assert status == 403 and answer["error"]["code"] == "origin_not_allowed" and sent["connection"] == "close", answer


def test_allowed_origins_get_cors_headers_and_preflights():
    preflight = {"origin": "http://app.example:8080", "access-control-request-method": "POST"}
    status, headers, _ = asgi("OPTIONS", "/v1/chat/completions", preflight)
    assert status == 204 and headers["access-control-allow-origin"] == "http://app.example:8080" and headers["vary"] == "Origin"
    assert headers["access-control-allow-headers"] == "Authorization, Content-Type"
    status, headers, answer = asgi("POST", "/v1/chat/completions", {"origin": "http://app.example:8080", **JSON}, [CHAT])
    assert status == 404 and headers["access-control-allow-origin"] == "http://app.example:8080", "errors are readable by the page too"
    assert asgi("OPTIONS", "/v1/chat/completions", {**preflight, "origin": "http://app.example:8081"})[0] == 403


def test_an_http_upstream_address_is_checked_and_its_error_bodies_read():
    assert Gateway("127.0.0.1:1", None, [], http_url=" [::1]:8000 ").http_url == "[::1]:8000"
    assert Gateway("127.0.0.1:1", None, []).http_url is None, "no --http: generation over gRPC"
    with pytest.raises(ValueError, match="--http 'localhost' is not host:port"):
        Gateway("127.0.0.1:1", None, [], http_url="localhost")
    assert http_error_message('data: {"error":"busy: 2 requests already wait"}') == "busy: 2 requests already wait"
    assert http_error_message('{"error": "unknown model"}') == "unknown model" and http_error_message("") == "no answer"


def test_several_grpc_addresses_become_one_round_robin_channel_and_bad_ones_are_named():
    from hf2triton.gateway.backend import grpc_target

    assert grpc_target("127.0.0.1:8001") == ("127.0.0.1:8001", [])
    assert grpc_target("127.0.0.1:8001, localhost:8101") == ("ipv4:127.0.0.1:8001,127.0.0.1:8101", [("grpc.lb_policy_name", "round_robin")])
    assert grpc_target("[::1]:8001,[::1]:8101")[0] == "ipv6:[::1]:8001,[::1]:8101"
    for bad, words in (("8001", "not host:port"), ("a:0", "not host:port"), (",", "names no address"), ("127.0.0.1:1,[::1]:2", "mixes")):
        with pytest.raises(ValueError, match=words):
            grpc_target(bad)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "suffix": "end"}, "suffix"),
        ({"prompt": ["x", ""]}, "prompt"),
        ({"prompt": [[1, -2]]}, "prompt"),
        ({"prompt": []}, "prompt"),
    ],
)
def test_completion_parameters_not_done_here_are_refused_not_ignored(body, param):
    """Issue 42 #6: best_of and suffix were accepted and ignored (echo is done since issue 44)."""
    with pytest.raises(ApiError) as info:
        completion_prompts(body)
    assert info.value.status == 400 and info.value.param == param
    assert completion_prompts({"prompt": "x", "best_of": 1, "suffix": "", "echo": False}) == ["x"], "their no-op values pass"


def test_completion_prompts_are_texts_or_token_ids_one_choice_each():
    """Issue 44 #2: lm-eval's local-completions sends lists of token ids; OpenAI takes a string or a list of either."""
    assert completion_prompts({"prompt": [1, 2]}) == [[1, 2]]
    assert completion_prompts({"prompt": [[1, 2], [3]]}) == [[1, 2], [3]]
    assert completion_prompts({"prompt": ["a", [3]]}) == ["a", [3]]


@pytest.mark.parametrize(
    ("body", "chat", "options"),
    [
        ({"logprobs": True}, True, {"logprobs": 0}),
        ({"logprobs": True, "top_logprobs": 5}, True, {"logprobs": 5}),
        ({"logprobs": False}, True, {}),
        ({"logprobs": 1, "echo": True, "max_tokens": 0}, False, {"logprobs": 1, "prompt_logprobs": True, "max_new_tokens": 0}),
        ({"logprobs": 0}, False, {"logprobs": 0}),
        ({"echo": True}, False, {"prompt_logprobs": True}),
    ],
)
def test_logprobs_and_echo_map_to_the_models_inputs(body, chat, options):
    """Issue 44 #1/#2: chat's logprobs + top_logprobs, completions' logprobs (alternatives) + echo (max_tokens 0 allowed)."""
    assert options_besides_length(body, chat=chat) == options


@pytest.mark.parametrize(
    ("body", "chat", "param"),
    [
        ({"top_logprobs": 2}, True, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, True, "top_logprobs"),
        ({"logprobs": 1}, True, "logprobs"),
        ({"logprobs": 21}, False, "logprobs"),
        ({"logprobs": True}, False, "logprobs"),
        ({"max_tokens": 0, "logprobs": 1}, False, "max_tokens"),
        ({"echo": "yes"}, False, "echo"),
    ],
)
def test_bad_logprobs_requests_are_400_naming_the_parameter(body, chat, param):
    with pytest.raises(ApiError) as info:
        generation_options(body, chat=chat)
    assert info.value.status == 400 and info.value.param == param


def test_n_is_bounded_by_the_models_max_n():
    served = ServedModel("g", "text-generation", True, 0, max_n=4)
    assert sample_count({}, served) == 1 and sample_count({"n": 4}, served) == 4
    for bad in (5, 0, 1.5, True):
        with pytest.raises(ApiError) as info:
            sample_count({"n": bad}, served)
        assert info.value.status == 400 and info.value.param == "n"


def _entry(token: str, logprob: float | None, *top: tuple[str, float]) -> dict:
    return {"id": 0, "token": token, "logprob": logprob, "top": [{"id": 1, "token": t, "logprob": lp} for t, lp in top]}


def test_completion_logprobs_shape_with_echo_as_lm_eval_reads_it():
    """Issue 44 #2: tokens, token_logprobs (the prompt's first null), top_logprobs (alternatives + the token itself),
    text_offset continuing over a stream's pieces; the echo's text starts with the prompt's."""
    shape = ChoiceLogprobs(chat=False, reported=True)
    first = {"prompt": [_entry("Hi", None), _entry(" there", -1.5, (" you", -0.5))], "prompt_text": "Hi there", "tokens": []}
    text, found = shape.piece("", first)
    assert text == "Hi there"
    assert found == {
        "tokens": ["Hi", " there"],
        "token_logprobs": [None, -1.5],
        "top_logprobs": [None, {" you": -0.5, " there": -1.5}],
        "text_offset": [0, 2],
    }
    text, more = shape.piece("!", {"tokens": [_entry("!", -0.1, ("!", -0.1))]})
    assert text == "!" and more["text_offset"] == [8] and more["top_logprobs"] == [{"!": -0.1}]
    merged = shape.merged([found, None, more])
    assert merged["tokens"] == ["Hi", " there", "!"] and merged["token_logprobs"] == [None, -1.5, -0.1]
    final = {"finish_reason": "length", "prompt_tokens": 2, "completion_tokens": 1}
    answer = completion_answer({"id": "x"}, False, [("Hi there!", final, merged)])
    assert answer["choices"][0]["logprobs"] is merged and answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    assert ChoiceLogprobs(chat=False, reported=False).piece("", first) == ("Hi there", None), "echo without logprobs: the text only"


def test_chat_logprobs_shape_and_chunks_per_choice():
    """Issue 44 #1/#3: chat's logprobs.content entries (token, logprob, bytes, top_logprobs) in a streamed chunk of its
    choice; a whole answer of n choices counts its prompt once."""
    shape = ChoiceLogprobs(chat=True, reported=True)
    text, found = shape.piece("é", {"tokens": [_entry("é", -0.25, ("é", -0.25), ("e", -2.0))]})
    assert found == {
        "content": [
            {
                "token": "é",
                "logprob": -0.25,
                "bytes": [195, 169],
                "top_logprobs": [{"token": "é", "logprob": -0.25, "bytes": [195, 169]}, {"token": "e", "logprob": -2.0, "bytes": [101]}],
            }
        ]
    }
    chunk = completion_chunk({"id": "c", "object": "chat.completion"}, True, text, None, role=True, index=2, logprobs=found)
    assert chunk["object"] == "chat.completion.chunk" and chunk["choices"][0]["index"] == 2 and chunk["choices"][0]["logprobs"] is found
    final = {"finish_reason": "stop", "prompt_tokens": 5, "completion_tokens": 2}
    answer = completion_answer({"id": "c"}, True, [("a", final, None), ("b", final, None)], samples=2)
    assert [c["index"] for c in answer["choices"]] == [0, 1] and answer["usage"]["prompt_tokens"] == 5
    assert answer["usage"]["completion_tokens"] == 4


def test_max_tokens_is_checked_against_the_models_own_limit_and_stream_must_be_a_boolean():
    with pytest.raises(ApiError) as info:
        generation_options({"max_tokens": 2000}, max_new_tokens=1024)
    assert info.value.param == "max_tokens" and "1..1024" in info.value.message, "the model's range, the client's name"
    assert generation_options({"max_tokens": 1024}, max_new_tokens=1024) == {"max_new_tokens": 1024}
    with pytest.raises(ApiError) as info:
        generation_options({"stream": "yes"})
    assert info.value.param == "stream" and "true or false" in info.value.message
    with pytest.raises(ApiError, match=r"developer"):
        chat_messages({"messages": [{"role": "function", "content": "x"}]})  # OpenAI's deprecated role
    with pytest.raises(ApiError, match=r"tool_call_id") as info:
        chat_messages({"messages": [{"role": "tool", "content": "x"}]})
    assert info.value.param == "messages[0].tool_call_id"


@pytest.mark.parametrize(
    ("error", "status", "words"),
    [
        (RuntimeError("[StatusCode.UNAVAILABLE] Request for unknown model: 'generate' has no available versions"), 503, "not loaded yet"),
        (RuntimeError("[StatusCode.UNAVAILABLE] Stream removed (Socket closed)"), 503, "Stream removed (Socket closed)"),
        (RuntimeError("[StatusCode.UNAVAILABLE] recvmsg:Connection lost"), 503, "Connection lost"),
        (RuntimeError("[StatusCode.INTERNAL] Received RST_STREAM with error code 2"), 503, "RST_STREAM"),
        (RuntimeError("[StatusCode.INTERNAL] Internal error from Core"), 503, "Internal error from Core"),
        (UserError("the client key file /k is missing", "`make serve` creates it"), 503, "the client key file /k is missing"),
    ],
)
def test_restarts_and_a_missing_key_are_503_with_retry_after_in_plain_words(error, status, words):
    """Issue 42 #2/#3: a restart answered 400 (SDKs do not retry it); gRPC's wrapping leaked into messages."""
    mapped = triton_error(error, "generate")
    assert mapped.status == status and words in mapped.message and mapped.headers() == {"Retry-After": "2"}
    assert "StatusCode" not in mapped.message and "AioRpcError" not in mapped.message


def test_a_configured_model_that_is_not_loaded_is_503_not_404():
    gateway = Gateway("127.0.0.1:1", None, ["generate"])
    gateway.refresh_failed, gateway.refreshed_at = False, float("inf")  # as if Triton had just listed no models
    with pytest.raises(ApiError) as info:
        asyncio.run(gateway.model({"model": "generate"}, "text-generation"))
    assert info.value.status == 503 and info.value.headers() == {"Retry-After": "2"}
    with pytest.raises(ApiError) as info:
        asyncio.run(gateway.model({"model": "other"}, "text-generation"))
    assert info.value.status == 404 and info.value.code == "model_not_found"


def test_rerank_requests_and_answers():
    assert rerank_request({"query": "q", "documents": ["a", "b"]}) == Ranking("q", ["a", "b"], 0, True)
    assert rerank_request({"query": "q", "documents": [{"text": "a"}, "b"]}) == Ranking("q", ["a", "b"], 0, True)  # Cohere v1
    assert rerank_request({"query": "q", "documents": ["a"], "top_n": 1, "return_documents": False}) == Ranking("q", ["a"], 1, False)
    for body, param in (
        ({"documents": ["a"]}, "query"),
        ({"query": " ", "documents": ["a"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": "a"}, "documents"),
        ({"query": "q", "documents": [{"text": "a", "title": "t"}]}, "documents"),
        ({"query": "q", "documents": [{"text": 3}]}, "documents"),
        ({"query": "q", "documents": ["a", "  "]}, "documents"),
        ({"query": "q", "documents": ["\ud800"]}, "documents"),
        ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ({"query": "q", "documents": ["a"], "top_n": 1.5}, "top_n"),
        ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
    ):
        with pytest.raises(ApiError) as refused:
            rerank_request(body)
        assert refused.value.status == 400 and refused.value.param == param, (body, refused.value.body())
    ranking = Ranking("q", ["a", "b", "c"], 0, True)
    answer = rerank_answer("rerank-1", "m", ranking, [0.2, 0.9, 0.2], 12)
    assert answer == {
        "id": "rerank-1", "model": "m", "usage": {"total_tokens": 12},
        "results": [
            {"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
            {"index": 0, "relevance_score": 0.2, "document": {"text": "a"}},
            {"index": 2, "relevance_score": 0.2, "document": {"text": "c"}},
        ],
    }  # fmt: skip
    top = rerank_answer("rerank-2", "m", Ranking("q", ["a", "b", "c"], 2, False), [0.2, 0.9, 0.5], 12)["results"]
    assert top == [{"index": 1, "relevance_score": 0.9}, {"index": 2, "relevance_score": 0.5}]


def test_score_pairs_one_to_many_and_pairwise_and_its_answer():
    assert score_pairs({"text_1": "q", "text_2": "d"}) == [("q", "d")]
    assert score_pairs({"text_1": ["q"], "text_2": ["a", "b"]}) == [("q", "a"), ("q", "b")]
    assert score_pairs({"text_1": ["q", "r"], "text_2": ["a", "b"]}) == [("q", "a"), ("r", "b")]
    for body, param, words in (
        ({"text_1": ["q", "r"], "text_2": ["a", "b", "c"]}, "text_1", "'text_1' has 2 texts and 'text_2' 3"),
        ({"text_1": ["q", "r"], "text_2": "a"}, "text_1", "'text_1' has 2 texts and 'text_2' 1"),
        ({"text_2": ["a"]}, "text_1", "'text_1' must be a string or a non-empty list of strings"),
        ({"text_1": "q", "text_2": []}, "text_2", "non-empty list"),
        ({"text_1": "q", "text_2": ["a", 3]}, "text_2", "list of strings"),
        ({"text_1": " ", "text_2": ["a"]}, "text_1", "empty string (text_1[0])"),
        ({"text_1": "q", "text_2": ["a", "\ud800"]}, "text_2", "surrogate"),
    ):
        with pytest.raises(ApiError) as refused:
            score_pairs(body)
        assert refused.value.status == 400 and refused.value.param == param and words in refused.value.message, (body, refused.value.body())
    answer = score_answer("score-1", "m", np.array([0.25, 0.5], dtype=np.float32), 9)
    assert answer.pop("created") > 0
    assert answer == {
        "id": "score-1", "object": "list", "model": "m", "usage": {"prompt_tokens": 9, "total_tokens": 9, "completion_tokens": 0},
        "data": [{"index": 0, "object": "score", "score": 0.25}, {"index": 1, "object": "score", "score": 0.5}],
    }  # fmt: skip


def test_predict_requests_take_instances_and_the_tasks_own_option():
    assert predict_request({"instances": ["a", "b"]}, "fill-mask") == (["a", "b"], {})
    assert predict_request({"instances": ["a"], "top_k": 3}, "fill-mask") == (["a"], {"top_k": 3})
    assert predict_request({"instances": ["a"], "aggregation_strategy": "FIRST"}, "token-classification") == (
        ["a"], {"aggregation_strategy": "first"}
    )  # fmt: skip
    # the Inference API's `parameters`, and a stride: -1 (no windows) reaches aggregation "none" on a windowed model
    assert predict_request({"instances": ["a"], "parameters": {"aggregation_strategy": "none", "stride": -1}}, "token-classification") == (
        ["a"], {"aggregation_strategy": "none", "stride": -1}
    )  # fmt: skip
    assert predict_request({"instances": ["a"], "parameters": {"top_k": 2}, "top_k": 4}, "fill-mask") == (["a"], {"top_k": 4})
    for body, task, param in (
        ({}, "fill-mask", "instances"),
        ({"instances": "a"}, "fill-mask", "instances"),
        ({"instances": ["a", ""]}, "fill-mask", "instances"),
        ({"instances": ["a"], "top_k": 0}, "fill-mask", "top_k"),
        ({"instances": ["a"], "top_k": 51}, "fill-mask", "top_k"),
        ({"instances": ["a"], "top_k": 3}, "token-classification", "top_k"),
        ({"instances": ["a"], "aggregation_strategy": "most"}, "token-classification", "aggregation_strategy"),
        ({"instances": ["a"], "aggregation_strategy": "simple"}, "text-classification", "aggregation_strategy"),
        ({"instances": ["a"], "stride": -2}, "token-classification", "stride"),
        ({"instances": ["a"], "parameters": {"stride": 4}}, "fill-mask", "stride"),
        ({"instances": ["a"], "targets": ["capital"]}, "fill-mask", "targets"),  # the pipeline's, not served: never ignored
        ({"instances": ["a"], "parameters": {"function_to_apply": "none"}}, "text-classification", "function_to_apply"),
        ({"instances": ["a"], "parameters": ["top_k"]}, "fill-mask", "parameters"),
        ({"instances": ["a"], "parameters": []}, "fill-mask", "parameters"),
    ):
        with pytest.raises(ApiError) as refused:
            predict_request(body, task)
        assert refused.value.status == 400 and refused.value.param == param, (body, refused.value.body())


def test_predict_and_score_refuse_other_tasks_and_too_many_texts_before_triton():
    gateway = Gateway("127.0.0.1:1", None, ["tagger", "chat"])
    gateway.refresh_failed, gateway.refreshed_at = False, float("inf")
    gateway.models = {
        "tagger": ServedModel("tagger", "token-classification", False, 4, max_texts=3),
        "chat": ServedModel("chat", "text-generation", True, 0),
    }
    tasks = ("token-classification", "fill-mask", "text-classification")
    assert asyncio.run(gateway.model({"model": "tagger"}, tasks)).name == "tagger"
    with pytest.raises(ApiError) as refused:
        asyncio.run(gateway.model({"model": "chat"}, tasks))
    assert refused.value.param == "model" and "not token-classification or fill-mask or text-classification" in refused.value.message
    with pytest.raises(ApiError) as refused:
        asyncio.run(gateway.infer_texts(gateway.models["tagger"], ["a"] * 4, None, "instances"))
    assert refused.value.status == 413 and refused.value.param == "instances" and "at most 3" in refused.value.message
    status, _, answer = asgi("POST", "/v1/models/nothing:predict", JSON, [b'{"instances": ["a"]}'])
    assert status == 404 and answer["error"]["code"] == "model_not_found" and "'nothing'" in answer["error"]["message"], answer
    status, _, answer = asgi("POST", "/v1/nothing", JSON, [b"{}"])
    assert status == 404 and "/v1/score" in answer["error"]["message"] and ":predict" in answer["error"]["message"]


def test_transcription_subtitles_are_srt_and_webvtt():
    """OpenAI's srt / vtt response formats from a transcript's segments: numbered SubRip cues with comma millis,
    WebVTT with its header and dots; hours roll over; an open end was already closed at the audio's duration."""
    from hf2triton.gateway.api.audio import subtitles

    cues = [(0.0, 1.5, " Hello"), (1.5, 3723.25, " world ")]
    assert subtitles(cues, "srt") == "1\n00:00:00,000 --> 00:00:01,500\nHello\n\n2\n00:00:01,500 --> 01:02:03,250\nworld\n"
    assert subtitles(cues, "vtt") == "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello\n\n00:00:01.500 --> 01:02:03.250\nworld\n"
    assert subtitles([], "vtt") == "WEBVTT\n"


def _stream_response(outputs: list[tuple[str, str, bytes]], raw: bool = True):
    """A gRPC ModelInferResponse as Triton streams a piece: (name, datatype, one element's wire bytes) per output."""
    from tritonclient.grpc import service_pb2
    from tritonclient.grpc._infer_result import InferResult

    message = service_pb2.ModelInferResponse()
    for name, datatype, content in outputs:
        output = message.outputs.add(name=name, datatype=datatype, shape=[1])
        if raw:
            message.raw_output_contents.append(content)
        elif datatype == "BYTES":
            output.contents.bytes_contents.append(content[4:])
    return InferResult(message)


def test_a_streamed_pieces_values_are_read_from_its_raw_contents_as_tritonclient_reads_them():
    """client.first_values (the gateway's per-piece reader) against InferResult.as_numpy on the same responses."""
    from hf2triton.triton.client import first_values

    text = "Paris, déjà vu".encode()
    final = [
        (interface.TEXT_OUTPUT, "BYTES", len(text).to_bytes(4, "little") + text),
        (interface.FINISH_REASON, "BYTES", (4).to_bytes(4, "little") + b"stop"),
        (interface.PROMPT_TOKENS, "INT32", np.array([37], dtype=np.int32).tobytes()),
        (interface.COMPLETION_TOKENS, "INT32", np.array([7], dtype=np.int32).tobytes()),
        ("offset", "INT64", np.array([-3], dtype=np.int64).tobytes()),
        ("empty", "BYTES", (0).to_bytes(4, "little")),
    ]
    result = _stream_response(final)
    values = first_values(result)
    assert values == {name: result.as_numpy(name).reshape(-1)[0] for name, _, _ in final}
    assert values[interface.TEXT_OUTPUT].decode() == "Paris, déjà vu" and values[interface.PROMPT_TOKENS] == 37
    assert values["offset"] == -3 and values["empty"] == b""
    # contents sent typed (not raw): tritonclient's own reading
    typed = _stream_response(final[:2], raw=False)
    assert first_values(typed) == {interface.TEXT_OUTPUT: text, interface.FINISH_REASON: b"stop"}


def test_the_generate_body_holds_the_grpc_tensors_as_json_values():
    """client.generate_body (Triton's HTTP generate / generate_stream): the tensors input_arrays builds for one
    streamed prompt, one element as its scalar, several as an array, BYTES as text, JSON inputs as their JSON text."""
    from hf2triton.triton.client import generate_body

    messages = [{"role": "user", "content": "é"}]
    body = generate_body([], {"messages": messages, "stop": ["a", "b"], "max_new_tokens": 5, "temperature": 0.5, "seed": None})
    assert body == {"messages": json.dumps(messages, ensure_ascii=False), "stop": ["a", "b"], "max_new_tokens": 5, "temperature": 0.5}
    assert generate_body(["hi"], {"prompt_ids": [3, 4], "stop": ["x"]}) == {"text": "hi", "prompt_ids": [3, 4], "stop": "x"}
