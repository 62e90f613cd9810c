"""The gateway's request mapping without a server: OpenAI parameters -> the model's inputs, and Triton's
errors -> OpenAI status classes."""

from __future__ import annotations

import pytest

from hf2triton.gateway.app import ApiError, chat_messages, embedding_inputs, generation_options, triton_error


def test_sampling_parameters_map_to_model_inputs():
    body = {"max_tokens": 20, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": "\n"}
    assert generation_options(body) == {"max_new_tokens": 20, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n"]}
    assert generation_options({"max_completion_tokens": 5, "max_tokens": 9}) == {"max_new_tokens": 5}
    assert generation_options({"temperature": 0.001, "top_p": 1.0}) == {"temperature": 0.0}, "below the sampling minimum = greedy"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 3}, None),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": True}, "temperature"),
        ({"temperature": 3}, "temperature"),
        ({"stop": ["a", ""]}, "stop"),
        ({"stop": ["a"] * 5}, "stop"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_parameters_are_400_naming_the_parameter(body, param):
    with pytest.raises(ApiError) as info:
        generation_options(body)
    assert info.value.status == 400 and (param is None or info.value.param == param)


def test_messages_and_inputs():
    parts = [{"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]}]
    assert chat_messages({"messages": parts}) == [{"role": "system", "content": "be brief"}]
    with pytest.raises(ApiError, match="only text parts"):
        chat_messages({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
    assert embedding_inputs({"input": "x"}) == ["x"]
    with pytest.raises(ApiError, match="empty string"):
        embedding_inputs({"input": ["x", " "]})


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("busy: 2 requests already wait (generation.max_queue = 2); retry later", 429),
        ("text of 70000 bytes exceeds max_input_bytes=65536", 413),
        ("[StatusCode.UNAVAILABLE] failed to connect to all addresses", 503),
        ("max_new_tokens=5000 exceeds generation.max_new_tokens_limit=1024", 400),
    ],
)
def test_triton_errors_map_to_openai_status_classes(message, status):
    assert triton_error(RuntimeError(message)).status == status
