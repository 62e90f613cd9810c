"""Requests against a live server (tiny models): good ones answered, bad ones get their own error
response, a bad request does not spoil the good ones batched with it, and the server stays ready."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hf2triton.triton import client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def clients(tiny_workflow):
    settings = tiny_workflow.settings()
    return client.http_client(settings.url(), concurrency=8), client.grpc_client(settings.url("grpc_port"))


def text_input(module, values, name="text", datatype="BYTES", shape=None):
    data = np.array(values, dtype=np.object_ if datatype == "BYTES" else None)
    tensor = module.InferInput(name, list(shape or data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def embed(client, texts: list[bytes]):
    return client.infer("embed", [text_input(httpclient, [[t] for t in texts])]).as_numpy("embedding")


def expect_error(call, *words):
    with pytest.raises(InferenceServerException) as info:
        call()
    for word in words:
        assert word in str(info.value), str(info.value)
    return str(info.value)


def test_bad_request_in_a_dynamic_batch_does_not_spoil_good_ones(clients):
    http, _ = clients
    good = [b"first good text", b"second good text", "third: caf\u00e9".encode()]
    alone = embed(http, good)
    stats_before = http.get_inference_statistics("embed")["model_stats"][0]
    # async_infer sends all four at once (tritonclient.http is gevent-based: no threads)
    pending = [http.async_infer("embed", [text_input(httpclient, [[t]])]) for t in [*good, b"\xff\xfe broken"]]
    results = []
    for request in pending:
        try:
            results.append(request.get_result().as_numpy("embedding"))
        except InferenceServerException as err:
            results.append(err)
    assert all(isinstance(r, np.ndarray) for r in results[:3])
    for row, result in zip(alone, results[:3]):
        assert np.allclose(row, result[0], atol=1e-5)
    assert isinstance(results[3], InferenceServerException) and "UTF-8" in str(results[3])
    stats_after = http.get_inference_statistics("embed")["model_stats"][0]
    executions = stats_after["execution_count"] - stats_before["execution_count"]
    print(f"4 concurrent requests ran in {executions} model execution(s)")
    assert http.is_server_ready()


def test_invalid_utf8_empty_and_oversized_texts(clients):
    http, _ = clients
    expect_error(lambda: embed(http, [b"\xc3\x28"]), "UTF-8", "400")
    expect_error(lambda: embed(http, [b"   "]), "empty")
    expect_error(lambda: embed(http, [b"x" * 70_000]), "max_input_bytes=65536")
    assert http.is_model_ready("embed")


def test_texts_of_only_nul_or_zero_width_characters_are_empty(clients):
    """They used to get an embedding (of nothing: the tokenizer drops them) instead of the error."""
    http, grpc = clients
    for invisible in ["\x00\x00", "\u200b\u200c\ufeff"]:
        text = invisible.encode()
        expect_error(lambda: embed(http, [text]), "text is empty", "400")  # noqa: B023 - called at once
        message = expect_error(lambda: grpc.infer("embed", [text_input(grpcclient, [[text]])]), "text is empty")  # noqa: B023
        assert "INVALID_ARGUMENT" in message, message
    assert http.is_model_ready("embed")


def test_triton_rejects_malformed_requests(clients):
    http, grpc = clients
    expect_error(lambda: http.infer("no_such_model", [text_input(httpclient, [[b"x"]])]), "no_such_model")
    expect_error(lambda: http.infer("embed", [text_input(httpclient, [[b"x"]], name="input")]), "unexpected inference input 'input'")
    expect_error(lambda: http.infer("embed", [text_input(httpclient, np.array([[1]], dtype=np.int32), datatype="INT32")]), "INT32")
    expect_error(lambda: http.infer("embed", [text_input(httpclient, [b"x"])]), "unexpected shape")
    expect_error(lambda: http.infer("embed", [text_input(httpclient, [[b"x"]] * 9)]), "batch-size must be <=")
    expect_error(lambda: grpc.infer("embed", [text_input(grpcclient, [[b"\xff"]])]), "UTF-8")
    assert http.is_server_ready()


def test_generation_options_per_request(tiny_workflow):
    """The text-generation model streams (the default): /generate answers whole, gRPC streams; options and
    their errors are per request."""
    settings = tiny_workflow.settings()
    http_url, grpc_url = settings.url(), settings.url("grpc_port")

    def generate(**options):
        status, answer = client.http_generate(http_url, "generate", {"text": "Hello", **options, "stream": False})
        return answer["text_output"] if status == 200 else f"HTTP {status}: {answer.get('error')}"

    short, default = generate(max_new_tokens=2), generate()
    assert len(short) <= len(default) and not default.startswith("HTTP")
    assert client.stream_generate(grpc_url, "generate", "Hello")["text"] == default, "greedy: the same text streamed over gRPC"
    assert not generate(temperature=0.7).startswith("HTTP")
    assert generate(max_new_tokens=-3).startswith("HTTP 400") and "max_new_tokens=-3" in generate(max_new_tokens=-3)
    assert "exceeds the context" in generate(max_new_tokens=250)
    with pytest.raises(InferenceServerException, match="temperature=nan"):
        client.stream_generate(grpc_url, "generate", "Hello", {"temperature": math.nan})
    assert client.http_client(http_url).is_model_ready("generate")


def test_denormal_temperature_is_a_bad_request_not_a_server_error(tiny_workflow):
    """temperature 1e-45 (a float32 denormal) used to reach sampling, which divides by it: a 500."""
    settings = tiny_workflow.settings()
    for t in (1e-45, 0.001):
        status, answer = client.http_generate(settings.url(), "generate", {"text": "Hello", "temperature": t, "stream": False})
        assert status == 400 and "not allowed" in answer["error"] and "between 0.01 and 100" in answer["error"], answer
        with pytest.raises(InferenceServerException, match="between 0.01 and 100"):
            client.stream_generate(settings.url("grpc_port"), "generate", "Hello", {"temperature": t})
    status, _ = client.http_generate(settings.url(), "generate", {"text": "Hello", "temperature": 0.01, "stream": False})
    assert status == 200, "the minimum itself (0.0099999998 as float32) is allowed"


def test_classification_labels(clients):
    http, _ = clients
    result = http.infer("classify", [text_input(httpclient, [[b"great"], [b"awful"]])])
    assert {x.decode() for x in result.as_numpy("label").reshape(-1)} <= {"negative", "positive"}
    assert result.as_numpy("score").shape == (2, 1)
