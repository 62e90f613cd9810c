"""text2text-generation without a server: the encoder-decoder continuous batcher (encoder once per request, decoding
steps batched) gives each request exactly the tokens transformers' generate() gives it alone -- requests of
different lengths joining mid-way, on T5 (relative positions) and BART (absolute positions, per row) -- seeds
reproduce, stop strings cut, cancellation frees the place; the engine's request checks; the config's task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from hf2triton import host
from hf2triton.config import validate_config
from hf2triton.errors import UserError
from hf2triton.serving import interface
from hf2triton.serving.batching.seq2seq import Seq2SeqBatcher
from hf2triton.serving.batching.sequences import Sampling, Sequence
from hf2triton.serving.inputs import RequestError
from hf2triton.serving.interface import DEFAULTS
from hf2triton.serving.tasks.text2text import Text2TextEngine
from hf2triton.triton import client
from tests.helpers import ROOT, make_workflow, passed_checks, tiny_bart, tiny_t5
from tests.test_continuous_batching import Collector

PROMPTS = [
    "translate English to German: the house is wonderful.",
    "summarize: the dragon met the knight",
    "What is the capital of France?",
    "studies have shown that owning a dog is good for you, and cats are fine too, in the old castle until the sun went down.",
]


@pytest.fixture(scope="module", params=["t5", "bart"])
def engine(request, tmp_path_factory) -> Text2TextEngine:
    build = {"t5": tiny_t5, "bart": tiny_bart}[request.param]
    # plain decoding: these tests compare the batcher with generate() alone (test_text2text_settings.py: the checkpoint's)
    return Text2TextEngine(str(build(tmp_path_factory.mktemp(request.param))), checkpoint_defaults=False)


def new_batcher(engine: Text2TextEngine, **limits) -> Seq2SeqBatcher:
    limits = {
        "max_sequences": DEFAULTS.max_sequences,
        "max_queue": DEFAULTS.max_queue,
        "context": engine.max_length,
        **engine.batcher_options,
        **limits,
    }
    return Seq2SeqBatcher(engine.model, engine.tokenizer, "cpu", **limits)


def submit(batcher: Seq2SeqBatcher, engine: Text2TextEngine, prompt: str, cancelled=lambda: False, **options) -> Collector:
    collector = Collector()
    batcher.submit(Sequence(engine.token_ids(prompt), Sampling(**options), collector, cancelled=cancelled))
    return collector


def drain(batcher: Seq2SeqBatcher) -> None:
    while not batcher.idle:
        batcher.step()


def answer_tokens(engine: Text2TextEngine, prompt: str, max_new_tokens: int) -> list[int]:
    ids = engine._generate_torch([prompt], max_new_tokens, 0.0)[0]
    eos = engine.tokenizer.eos_token_id
    return ids[: ids.index(eos)] if eos in ids else ids


def test_batched_requests_joining_midway_equal_generate_alone(engine):
    batcher = new_batcher(engine, max_sequences=3)
    lengths = [12, 20, 7, 16]
    sequences = []

    def add(prompt: str, count: int) -> Collector:
        collector = Collector()
        sequence = Sequence(engine.token_ids(prompt), Sampling(max_new_tokens=count), collector)
        batcher.submit(sequence)
        sequences.append(sequence)
        return collector

    first = [add(p, n) for p, n in zip(PROMPTS[:2], lengths)]
    for _ in range(3):
        batcher.step()
    assert batcher.running, "still decoding when the others join"
    later = [add(p, n) for p, n in zip(PROMPTS[2:], lengths[2:])]
    drain(batcher)
    for prompt, count, sequence, collector in zip(PROMPTS, lengths, sequences, first + later):
        expected = answer_tokens(engine, prompt, count)
        assert sequence.generated == expected, prompt
        assert collector.text.strip() == engine.run([prompt], max_new_tokens=count)[interface.TEXT_OUTPUT][0].decode()
        assert collector.finish.completion_tokens == len(expected)
        assert collector.finish.reason == ("length" if len(expected) == count else "stop")
        assert collector.finish.prompt_tokens == len(engine.token_ids(prompt))
    assert batcher.encoder_states is None and not batcher.cross, "the encoder side is freed with the last row"


def test_same_seed_same_text(engine):
    batcher = new_batcher(engine)
    options = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.9}
    runs = [submit(batcher, engine, PROMPTS[1], seed=s, **options) for s in (7, 7, 8)]
    drain(batcher)
    again = submit(batcher, engine, PROMPTS[1], seed=7, **options)  # alone this time
    drain(batcher)
    assert runs[0].text == runs[1].text == again.text and runs[0].text != runs[2].text


def test_stop_string_ends_and_is_cut(engine):
    batcher = new_batcher(engine)
    full = submit(batcher, engine, PROMPTS[0], max_new_tokens=20)
    drain(batcher)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
    cut = submit(batcher, engine, PROMPTS[0], max_new_tokens=20, stop=(stop,))
    drain(batcher)
    assert cut.finish.reason == "stop" and cut.text == full.text[: full.text.index(stop)]


def test_cancelled_request_leaves_and_frees_its_place(engine):
    client_gone = threading.Event()
    batcher = new_batcher(engine, max_sequences=1)
    leaving = submit(batcher, engine, PROMPTS[3], max_new_tokens=200, cancelled=client_gone.is_set)
    waiting = submit(batcher, engine, PROMPTS[2], max_new_tokens=5)
    batcher.step()
    assert (len(batcher.running), len(batcher.waiting)) == (1, 1)
    client_gone.set()
    batcher.step()
    assert (leaving.finish.reason, leaving.finish.completion_tokens <= 2) == ("cancelled", True)
    drain(batcher)
    assert waiting.text.strip() == engine.run([PROMPTS[2]], max_new_tokens=5)[interface.TEXT_OUTPUT][0].decode()


def test_a_long_input_is_encoded_whole_and_joins_at_once(engine):
    batcher = new_batcher(engine, max_prefill_tokens=16)
    prompt = " ".join(PROMPTS)
    assert len(engine.token_ids(prompt)) > 16
    collector = submit(batcher, engine, prompt, max_new_tokens=6)
    batcher.step()
    assert batcher.partial is None and len(batcher.running) + (collector.finish is not None) == 1
    drain(batcher)
    assert collector.text.strip() == engine.run([prompt], max_new_tokens=6)[interface.TEXT_OUTPUT][0].decode()


def test_request_checks(engine):
    assert engine.chat_prompt(['[{"role": "system", "content": "be brief"}, {"role": "user", "content": "a"}, '
                               '{"role": "assistant", "content": "b"}, {"role": "user", "content": "last"}]']) == "last"  # fmt: skip
    with pytest.raises(RequestError, match="no user message"):
        engine.chat_prompt(['[{"role": "system", "content": "be brief"}]'])
    with pytest.raises(RequestError, match=f"input of .* tokens exceeds the model's context of {engine.max_length}"):
        engine.check_length(engine.max_length + 1, 8)
    with pytest.raises(RequestError, match=f"max_new_tokens={engine.max_length + 1} exceeds"):
        engine.check_length(4, engine.max_length + 1)


def config_with(task: str, **model) -> dict:
    return validate_config({"models": [{"name": "t2t", "source": "t5-small", "task": task, **model}]})


@pytest.mark.parametrize("task", ["text2text-generation", "summarization", "translation"])
def test_config_aliases_are_one_task_that_streams_by_default(task):
    model = config_with(task)["models"][0]
    assert model["task"] == interface.TEXT2TEXT and model["generation"]["streaming"] is True


@pytest.mark.parametrize("backend", ["onnx", "tensorrt", "vllm"])
def test_config_refuses_other_backends_with_the_fix(backend):
    with pytest.raises(UserError, match="backend") as caught:
        config_with("summarization", backend=backend, device="gpu")
    assert "backend: python" in str(caught.value)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny T5 served streaming and a tiny BART served static (summarization: the alias), with the gateway."""
    models = tmp_path_factory.mktemp("t2t-models")
    entries = [
        {"name": "t5", "source": str(tiny_t5(models / "t5")), "task": "text2text-generation"},
        {"name": "bart", "source": str(tiny_bart(models / "bart")), "task": "summarization", "generation": {"streaming": False}},
    ]
    workflow = make_workflow(tmp_path_factory.mktemp("t2t-workflow"), entries)
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield workflow
    workflow.stop()


def _cli(workflow, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hf2triton", "infer", "--grpc", workflow.settings().url("grpc_port"), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF2TRITON_CONFIG": ""}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)  # noqa: S603


@pytest.mark.integration
def test_served_text2text_validates_streams_and_the_gateway_and_cli_answer_as_triton(served):
    checks = passed_checks(served, "t5", {"grpc stream", "stream equals generate", "served equals in-process"})
    assert checks["grpc stream"]["detail"].count("responses") == 1
    passed_checks(served, "bart", {"http equals grpc", "served equals in-process"})
    gateway = json.loads((served.directory / "results" / "validation" / "gateway.json").read_text())
    assert gateway["ok"] and {"t5: chat equals Triton", "t5: streamed chat equals Triton"} <= {c["name"] for c in gateway["checks"]}
    prompt = PROMPTS[1]
    greedy = {interface.MAX_NEW_TOKENS: 12, interface.TEMPERATURE: 0.0}
    direct = client.stream_generate(served.settings().url("grpc_port"), "t5", prompt, greedy)
    assert len(direct["pieces"]) > 1 and direct["finish_reason"] in ("stop", "length")
    base = f"http://127.0.0.1:{served.config['openai']['port']}/v1"
    body = {"model": "t5", "max_tokens": 12, "temperature": 0}
    status, text = client.http_post(f"{base}/completions", body={**body, "prompt": prompt}, timeout=60)
    assert status == 200 and json.loads(text)["choices"][0]["text"] == direct["text"], text
    events = client.http_post_events(f"{base}/completions", {}, {**body, "prompt": prompt, "stream": True})
    assert "".join(c.get("text") or "" for e in events for c in e.get("choices", [])) == direct["text"]
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": prompt}]  # the last user message is the input
    status, text = client.http_post(f"{base}/chat/completions", body={**body, "messages": chat}, timeout=60)
    answer = json.loads(text)
    assert status == 200 and answer["choices"][0]["message"]["content"] == direct["text"], text
    assert answer["usage"]["completion_tokens"] == direct["completion_tokens"]
    events = client.http_post_events(f"{base}/chat/completions", {}, {**body, "messages": chat, "stream": True})
    assert "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", [])) == direct["text"]
    status, text = client.http_post(f"{base}/chat/completions", body={**body, "messages": chat, "logprobs": True}, timeout=60)
    content = json.loads(text)["choices"][0]["logprobs"]["content"]
    assert status == 200 and "".join(e["token"] for e in content).replace("\u2581", " ").strip().startswith(direct["text"][:3]), text
    status, text = client.http_post(f"{base}/completions", body={**body, "prompt": prompt, "echo": True}, timeout=60)
    assert status == 400 and json.loads(text)["error"]["param"] == "echo", "an encoder's input has no log-probabilities"
    status, text = client.http_post(f"{base}/completions", body={"model": "bart", "prompt": prompt}, timeout=60)
    assert status == 400 and "streaming" in text, text  # the static one is Triton's own, not the gateway's
    # the CLI: the whole answer, and streamed piece by piece
    for flags in ((), ("--stream",)):
        printed = _cli(served, *flags, "--max-tokens", "12", "t5", prompt)
        assert printed.returncode == 0 and printed.stdout.strip() == direct["text"].strip(), printed.stdout + printed.stderr
    printed = _cli(served, "--max-tokens", "12", "bart", prompt)
    reference = Text2TextEngine(served.config["models"][1]["source"]).run([prompt], max_new_tokens=12)[interface.TEXT_OUTPUT][0]
    assert printed.returncode == 0 and printed.stdout.strip() == reference.decode(), printed.stdout + printed.stderr


def test_chosen_tokens_log_probabilities_are_the_decoders_own(engine):
    """Issue 44 #1: a text2text row that asks gets its chosen tokens' log-softmax (raw logits) with alternatives,
    the same as one forward of the model over its answer; a row that does not ask gets none."""
    import torch

    batcher = new_batcher(engine)
    plain = submit(batcher, engine, PROMPTS[0], max_new_tokens=5)
    asked = Sequence(engine.token_ids(PROMPTS[0]), Sampling(max_new_tokens=5, logprobs=2), Collector())
    batcher.submit(asked)
    drain(batcher)
    assert asked.emit.text == plain.text and asked.logprobs and len(asked.logprobs) >= len(asked.generated)
    start = engine.model.config.decoder_start_token_id
    decoder = [start, *(item.id for item in asked.logprobs)][:-1]
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([asked.prompt_ids]), decoder_input_ids=torch.tensor([decoder])).logits[0]
    expected = logits.float().log_softmax(-1)
    for step, item in enumerate(asked.logprobs):
        assert abs(item.logprob - float(expected[step, item.id])) < 1e-4 and len(item.top) == 2 and item.top[0][0] == item.id
