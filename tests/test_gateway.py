"""The OpenAI-compatible gateway: the official `openai` client (sync, async, streaming) against the real gateway
in front of a real tritonserver serving tiny models; errors as OpenAI error objects with their status; the API
key; a closed stream frees its generation slot; the gateway managed by serve/stop/status and restored after it
is killed."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from hf2triton import host
from hf2triton.gateway.process import state_file
from hf2triton.triton import client
from tests.helpers import ROOT, long_context_copy, make_workflow, tiny_model_entries

pytestmark = pytest.mark.integration

KEY = "test-key-not-a-secret"
QUESTION = "What is the capital of France?"
ASK = [{"role": "user", "content": "x"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, tiny_models):
    models = {**tiny_models, "text-generation": long_context_copy(tiny_models["text-generation"], tmp_path_factory.mktemp("long"))}
    entries = tiny_model_entries(models)
    for entry in entries:
        if entry["name"] == "generate":
            entry["generation"] = {"max_new_tokens": 12, "max_sequences": 1, "max_queue": 1, "max_new_tokens_limit": 3000}
    workflow = make_workflow(tmp_path_factory.mktemp("gateway"), entries)
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0], "api_key_env": "HF2TRITON_TEST_KEY"}
    workflow.run("serve")
    yield workflow
    workflow.stop()


def base_url(workflow) -> str:
    return f"http://127.0.0.1:{workflow.config['openai']['port']}/v1"


def openai_client(workflow, key: str = "unused"):
    from openai import OpenAI

    return OpenAI(base_url=base_url(workflow), api_key=key, max_retries=0, timeout=60)


def post(workflow, path: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    status, text = client.http_post(f"{base_url(workflow)}{path}", headers=headers, body=body)
    return status, json.loads(text) if text.startswith("{") else {"raw": text}


def test_serve_checks_the_gateway_against_triton(gateway):
    report = json.loads((gateway.directory / "results" / "validation" / "gateway.json").read_text())
    names = {c["name"] for c in report["checks"]}
    expected = {"generate: chat equals Triton", "generate: streamed chat equals Triton", "embed: embeddings equal Triton"}
    assert report["ok"] and names == expected, report
    assert "PASS" in (gateway.directory / "results" / "validation" / "gateway.md").read_text()
    status, text = client.http_get(f"{base_url(gateway)}/status", timeout=30)  # the playground's Status view
    assert status == 200 and json.loads(text)["validation"]["ok"] is True, text
    assert "/playground/" in client.http_get(base_url(gateway).removesuffix("/v1") + "/playground/", timeout=10)[1]


def test_models_chat_and_completions_equal_tritons_own_answer(gateway):
    api = openai_client(gateway)
    listed = {m.id for m in api.models.list().data}
    assert listed == {"embed", "classify", "generate"}
    # no max_tokens (LangChain sends none): what the context leaves, up to max_new_tokens_limit, as vLLM -- not the
    # configured generation.max_new_tokens (12 here) that a direct request without max_new_tokens gets
    messages = [{"role": "user", "content": QUESTION}]
    direct = client.stream_generate(gateway.settings().url("grpc_port"), "generate", messages, {"open_ended": True})
    chat = api.chat.completions.create(model="generate", messages=messages)
    assert chat.choices[0].message.content == direct["text"] and chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage.prompt_tokens == direct["prompt_tokens"] and chat.usage.completion_tokens == direct["completion_tokens"]
    assert chat.usage.completion_tokens > 12 or chat.choices[0].finish_reason == "stop", chat.usage
    configured = client.stream_generate(gateway.settings().url("grpc_port"), "generate", messages)
    assert configured["completion_tokens"] <= 12 and direct["text"].startswith(configured["text"])
    pieces, finish = [], None
    stream = api.chat.completions.create(
        model="generate", messages=[{"role": "user", "content": QUESTION}], stream=True, stream_options={"include_usage": True}
    )
    usage = None
    for event in stream:
        if event.choices:
            pieces.append(event.choices[0].delta.content or "")
            finish = event.choices[0].finish_reason or finish
        usage = event.usage or usage
    # in pieces: the first token's alone, the rest as the server's load lets them come (sequences.take_pending)
    assert "".join(pieces) == direct["text"] and len(pieces) > 1 and finish in ("stop", "length") and usage.total_tokens > 0
    # /v1/completions takes its prompt as it is (vLLM's): no chat template, the tokenizer's BOS
    completion = api.completions.create(model="generate", prompt=QUESTION, max_tokens=6)
    url = gateway.settings().url("grpc_port")
    raw = client.stream_generate(url, "generate", QUESTION, {"max_new_tokens": 6, "raw_prompt": True})
    assert completion.choices[0].text == raw["text"] and completion.usage.prompt_tokens == raw["prompt_tokens"]
    templated = client.stream_generate(url, "generate", QUESTION, {"max_new_tokens": 6})
    assert raw["prompt_tokens"] < templated["prompt_tokens"], (raw, templated)
    seeded = [
        api.chat.completions.create(model="generate", messages=[{"role": "user", "content": "Hi"}], temperature=1.0, seed=7, max_tokens=8)
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1], "same seed, same text"


def test_a_model_card_the_models_own_max_tokens_and_head_on_the_playground(gateway):
    """Issue 42 #6: the SDK's models.retrieve was 404; max_tokens past the model's limit was refused by the model
    under its internal name with param null; HEAD on the playground was 405."""
    import openai

    api = openai_client(gateway)
    assert api.models.retrieve("generate").id == "generate"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("nothing")
    status, answer = post(gateway, "/chat/completions", {"model": "generate", "messages": ASK, "max_tokens": 3001})
    assert status == 400 and answer["error"]["param"] == "max_tokens" and "1..3000" in answer["error"]["message"], answer
    head = urllib.request.Request(base_url(gateway).removesuffix("/v1") + "/playground/", method="HEAD")
    with urllib.request.urlopen(head, timeout=10) as response:  # noqa: S310 - our gateway on loopback
        assert response.status == 200


def test_async_client_and_embeddings_equal_tritons(gateway):
    import tritonclient.http as httpclient
    from openai import AsyncOpenAI

    texts = ["hello there", "a second, longer sentence about serving models", "你好"]
    http = client.http_client(gateway.settings().url())
    first, second = (http.infer("embed", client.build_inputs(httpclient, part)) for part in (texts[:2], texts[2:]))
    direct = np.concatenate([first.as_numpy("embedding"), second.as_numpy("embedding")])
    tokens = int(first.as_numpy("prompt_tokens").sum() + second.as_numpy("prompt_tokens").sum())

    async def ask():
        api = AsyncOpenAI(base_url=base_url(gateway), api_key="unused", max_retries=0)
        floats = await api.embeddings.create(model="embed", input=texts)
        packed = await api.embeddings.create(model="embed", input="hello there", encoding_format="base64")
        await api.close()
        return floats, packed

    floats, packed = asyncio.run(ask())
    served = np.array([d.embedding for d in floats.data], dtype=np.float32)
    assert served.shape == direct.shape and np.allclose(served, direct, atol=1e-6)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == tokens, "usage = the tokens the model saw (not padded)"
    assert tokens < 3 * 16, "the tokenizer's fixed padding is not counted"
    status, raw = post(gateway, "/embeddings", {"model": "embed", "input": "hello there", "encoding_format": "base64"})
    assert status == 200 and np.allclose(
        np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype=np.float32), direct[0], atol=1e-6
    )
    assert packed.data[0].embedding is not None


def test_text_classification_predict_equals_tritons_labels_and_scores(gateway):
    """POST /v1/models/classify:predict (KServe's V1 protocol): per text the label and score Triton answers."""
    import tritonclient.http as httpclient

    texts = ["I loved this film.", "Terrible service, never again.", "<b>markup</b> stays text"]
    result = client.http_client(gateway.settings().url()).infer("classify", client.build_inputs(httpclient, texts))
    labels, scores = result.as_numpy("label").reshape(-1), result.as_numpy("score").reshape(-1)
    status, answer = post(gateway, "/models/classify:predict", {"instances": texts})
    direct = [{"label": label.decode(), "score": float(score)} for label, score in zip(labels, scores)]
    assert status == 200 and answer == {"predictions": direct}, answer
    status, refused = post(gateway, "/models/classify:predict", {"instances": texts, "top_k": 2})
    assert status == 400 and refused["error"]["param"] == "top_k", refused


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/chat/completions", {"model": "nope", "messages": ASK}, 404, "not served here"),
        ("/chat/completions", {"model": "generate", "messages": ASK, "n": 9}, 400, "'n' = 9 is out of range (1..8)"),
        (
            "/chat/completions",
            {"model": "generate", "messages": ASK, "tools": [{"type": "function"}]},
            400,
            "'tools'",
        ),
        ("/chat/completions", {"model": "generate", "messages": []}, 400, "'messages'"),
        ("/chat/completions", {"model": "generate", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0]"),
        ("/chat/completions", {"model": "generate", "messages": ASK, "max_tokens": 0}, 400, "max_tokens"),
        (
            "/chat/completions",
            {"model": "generate", "messages": ASK, "temperature": "hot"},
            400,
            "temperature",
        ),
        ("/chat/completions", {"model": "generate", "messages": ASK, "max_tokens": 5000}, 400, "out of range (1..3000)"),
        ("/chat/completions", {"model": "embed", "messages": ASK}, 400, "feature-extraction"),
        ("/embeddings", {"model": "embed", "input": [1, 2, 3]}, 400, "check_embedding_ctx_length=False"),
        ("/embeddings", {"model": "embed", "input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
        ("/embeddings", {"model": "embed", "input": "x" * 70000}, 413, "max_input_bytes"),
        ("/completions", {"model": "generate", "prompt": ""}, 400, "'prompt'"),
    ],
)
def test_bad_requests_get_openai_errors_never_a_500(gateway, path, body, status, words):
    got, answer = post(gateway, path, body)
    assert got == status and words in answer["error"]["message"], (got, answer)
    assert set(answer["error"]) == {"message", "type", "param", "code"}


def test_a_closed_stream_frees_its_generation_slot_and_a_full_queue_is_429(gateway):
    # max_sequences 1, max_queue 1: a long stream holds the slot; one more waits; the third is refused
    body = {"model": "generate", "messages": [{"role": "user", "content": "Tell me a story"}], "stream": True, "max_tokens": 2000}
    body.update(temperature=1.0, seed=1)  # sampled: runs its 2000 tokens (seconds on the tiny model)
    request = urllib.request.Request(f"{base_url(gateway)}/chat/completions", data=json.dumps(body).encode(), method="POST")  # noqa: S310
    request.add_header("Content-Type", "application/json")
    holder = urllib.request.urlopen(request, timeout=60)  # noqa: S310 - loopback
    assert holder.readline().startswith(b"data:"), "the stream started"
    waiting: list = []
    queued = threading.Thread(target=lambda: waiting.append(urllib.request.urlopen(request, timeout=60)))  # noqa: S310
    queued.start()  # waits for the slot (its response starts with its first token)
    time.sleep(1.0)
    status, answer = post(gateway, "/chat/completions", {**body, "stream": False, "max_tokens": 4})
    assert status == 429 and answer["error"]["code"] == "busy", answer
    holder.close()  # the client goes away: the queued one gets the slot at once
    queued.join(timeout=30)
    assert waiting, "the queued stream started when the first one's client left"
    waiting[0].close()
    time.sleep(1.0)
    started = time.monotonic()
    status, answer = post(gateway, "/chat/completions", {**body, "stream": False, "max_tokens": 4})
    assert status == 200 and time.monotonic() - started < 10, "the slot was freed"


def test_fuzzed_requests_never_get_a_5xx_and_the_server_stays_ready(gateway):
    """Property-based (hypothesis): bodies of known keys with values of any JSON shape, raw bytes that are not
    JSON, any path; bounded to 150 examples. Every answer is < 500 with an OpenAI error object when it fails."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
    values = st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6
    )
    known = st.sampled_from(["generate", "embed", [{"role": "user", "content": "hi"}], "hi", 4, 0.5, True, "base64"])
    keys = st.sampled_from(
        ["model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
         "stream", "stream_options", "n", "encoding_format", "tools", "logprobs", "top_logprobs", "echo", "dimensions", "user"]
    )  # fmt: skip
    bodies = st.dictionaries(keys, values | known, max_size=6)
    paths = st.sampled_from(["/chat/completions", "/completions", "/embeddings", "/models", "/nothing"])

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(path=paths, body=bodies | st.binary(max_size=40))
    def answers_without_a_server_error(path, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(f"{base_url(gateway)}{path}", data=data, method="POST")  # noqa: S310
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - loopback
                response.read()
                status = response.status
        except urllib.error.HTTPError as err:
            status, answer = err.code, err.read()
            assert status < 500, (path, body, answer[:300])
            assert b'"error"' in answer or status in (404, 405), answer[:300]  # unknown paths / methods: FastAPI's own
        assert status < 500

    answers_without_a_server_error()
    assert openai_client(gateway).models.list().data, "the gateway still answers"
    assert client.model_ready(gateway.settings().url(), "generate")


def hf2triton_cli(workflow, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    settings = workflow.settings()
    urls = ["--http", settings.url(), "--grpc", settings.url("grpc_port")]
    command = [sys.executable, "-m", "hf2triton", args[0], *urls, *args[1:]]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


def test_client_command_for_each_task(gateway):
    models = hf2triton_cli(gateway, "models")
    assert models.returncode == 0 and "generate" in models.stdout and "(streaming)" in models.stdout, models.stderr
    embedded = json.loads(hf2triton_cli(gateway, "embed", "embed", "hello", "world").stdout)
    assert np.asarray(embedded["embeddings"]).shape == (2, 32)
    assert "[32 dims]" in hf2triton_cli(gateway, "infer", "embed", "hello").stdout
    labels = json.loads(hf2triton_cli(gateway, "infer", "classify", "great", "awful", "--json").stdout)
    assert set(labels["labels"]) <= {"negative", "positive"} and len(labels["scores"]) == 2
    direct = client.stream_generate(gateway.settings().url("grpc_port"), "generate", QUESTION, {"max_new_tokens": 8})["text"]
    streamed = hf2triton_cli(gateway, "infer", "generate", QUESTION, "--stream", "--max-tokens", "8")
    assert streamed.returncode == 0 and streamed.stdout.strip() == direct.strip(), streamed.stderr
    answer = json.loads(hf2triton_cli(gateway, "infer", "generate", QUESTION, "--json", "--max-tokens", "8").stdout)
    assert answer["text"] == direct and answer["finish_reason"] in ("stop", "length")
    chat = hf2triton_cli(gateway, "chat", "generate", "--max-tokens", "4", stdin="Hi\nAnd again?\n")
    assert chat.returncode == 0 and chat.stdout.count("generate> ") == 2 and "Traceback" not in chat.stderr, chat.stderr
    unknown = hf2triton_cli(gateway, "infer", "nope", "x")
    assert unknown.returncode == 1 and "model 'nope' is not served" in unknown.stderr
    assert "use one of: classify, embed, generate" in unknown.stderr
    too_long = hf2triton_cli(gateway, "infer", "generate", "x", "--max-tokens", "5000")
    assert too_long.returncode == 1 and "max_new_tokens=5000" in too_long.stderr and "Traceback" not in too_long.stderr


def test_key_status_restore_and_stop(gateway):
    pid = json.loads(state_file(gateway.settings()).read_text())["pid"]
    status = json.loads(gateway.run("status").stdout)
    assert status["openai"]["running"] and status["openai"]["healthy"] and status["openai"]["current"]
    # the key: set in the environment, the gateway restarts with it and refuses requests without it
    gateway.env["HF2TRITON_TEST_KEY"] = KEY
    gateway.run("serve")
    keyed = json.loads(state_file(gateway.settings()).read_text())["pid"]
    assert keyed != pid
    got, answer = post(gateway, "/models", {})  # POST: 405 is fine too, but never without the key
    assert got in (401, 405)
    request = urllib.request.Request(f"{base_url(gateway)}/models")  # noqa: S310
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310
    assert info.value.code == 401
    assert [m.id for m in openai_client(gateway, KEY).models.list().data]
    assert KEY not in (gateway.work / "server" / "gateway.log").read_text(), "the key is never logged"
    # killed: the next serve restores it
    os.kill(keyed, signal.SIGKILL)
    time.sleep(0.5)
    result = gateway.run("serve")
    assert "gateway started" in result.stderr
    restored = json.loads(state_file(gateway.settings()).read_text())["pid"]
    assert restored != keyed and openai_client(gateway, KEY).models.list().data
    gateway.env.pop("HF2TRITON_TEST_KEY")
    # a non-loopback host without a key is refused before anything running is touched
    assert "stopped the gateway" in gateway.run("stop").stderr
    assert host.process_gone(restored)


def test_embedding_json_is_the_same_with_and_without_orjson(monkeypatch):
    from hf2triton.gateway import responses as gateway_app

    rows = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    body = {"object": "list", "data": [{"index": i, "embedding": row} for i, row in enumerate(rows)], "model": "m"}
    fast = json.loads(gateway_app.ArrayJSONResponse(body).body)
    monkeypatch.setattr(gateway_app, "orjson", None)
    plain = json.loads(gateway_app.ArrayJSONResponse(body).body)
    for answer in (fast, plain):
        values = np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)
        assert np.array_equal(values, rows), "float32 values read back exactly"
    assert fast["model"] == plain["model"] == "m"
