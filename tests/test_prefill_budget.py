"""Issue 24 #11 and #12 on a real server (the tiny generation model, 4096-token context): prefill under
generation.max_prefill_tokens = 16, so a long prompt goes in as chunks between decoding steps and gives the
model's own greedy text, while a running stream keeps receiving tokens; whitespace stop strings ("\\n", " ")
end generation at their first occurrence, an empty one is refused naming `stop` (gRPC stream and HTTP
/generate)."""

from __future__ import annotations

import threading
import time

import pytest

from hf2triton.serving import inputs as serving
from hf2triton.triton import client
from tests.helpers import long_context_copy, make_workflow, tiny_model_entries

pytestmark = pytest.mark.integration

BUDGET = 16
LONG_PROMPT = " ".join(f"chapter {i}: the dragon met the knight again." for i in range(10))  # 110 tokens: 7 chunks
RUNNING = {"max_new_tokens": 300, "temperature": 1.0, "seed": 1}  # sampled: a random model's greedy text may end at once


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    long_context = long_context_copy(tiny_models["text-generation"], tmp_path_factory.mktemp("long-context"))
    entries = tiny_model_entries({"text-generation": long_context})
    # no chat template: the prompt is the text, so the reference is generate() on its tokens
    entries[0]["generation"] = {"max_new_tokens": 16, "max_prefill_tokens": BUDGET, "chat_template": False, "max_new_tokens_limit": 2000}
    workflow = make_workflow(tmp_path_factory.mktemp("prefill-budget"), entries)
    workflow.run("serve")
    yield workflow
    workflow.stop()


@pytest.fixture(scope="module")
def alone(served):
    """Greedy text of the served model's saved weights run by transformers alone (unchunked, one prompt)."""
    import transformers

    pretrained = served.work / "models" / "generate" / "pretrained"
    tokenizer = transformers.AutoTokenizer.from_pretrained(pretrained)
    model = transformers.AutoModelForCausalLM.from_pretrained(pretrained).eval()

    # an untemplated prompt is encoded as transformers' pipeline and vLLM encode it: with the tokenizer's BOS
    def generate(prompt: str, max_new_tokens: int) -> str:
        ids = tokenizer(prompt, return_tensors="pt")
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).rstrip("\ufffd")

    generate.tokens = lambda prompt: len(tokenizer(prompt)["input_ids"])
    return generate


def urls(workflow) -> tuple[str, str]:
    settings = workflow.settings()
    return settings.url(), settings.url("grpc_port")


def test_the_budget_is_rendered_into_the_model(served):
    config = (served.directory / "model_repository" / "generate" / "config.pbtxt").read_text()
    assert 'key: "max_prefill_tokens"\n  value {\n    string_value: "16"' in config


def test_long_prompt_in_chunks_gives_the_models_own_greedy_text(served, alone):
    http, grpc = urls(served)
    assert alone.tokens(LONG_PROMPT) > 6 * BUDGET
    streamed = client.stream_generate(grpc, "generate", LONG_PROMPT, {"max_new_tokens": 24})
    assert streamed["text"] == alone(LONG_PROMPT, 24) and streamed["prompt_tokens"] == alone.tokens(LONG_PROMPT)
    status, answer = client.http_generate(http, "generate", {"text": LONG_PROMPT, "max_new_tokens": 24, "stream": False})
    assert status == 200 and answer["text_output"] == streamed["text"]


def test_running_stream_keeps_receiving_tokens_while_a_long_prompt_is_prefilled(served, alone):
    """A 2,000-token prompt is 125 chunks: unchunked it would be one step, in which the running stream gets
    nothing; chunked, every chunk comes with a decoding step of the running stream. Counted in tokens (the text's
    re-tokenized), not responses: tokens made while a response is being sent go out together in the next one, and on
    a loaded machine one response carries several."""
    _, grpc = urls(served)
    long_prompt = " ".join([LONG_PROMPT] * 18)
    assert 1900 < alone.tokens(long_prompt) < 2100
    arrivals: list[tuple[float, str]] = []
    started = threading.Event()

    def on_piece(text: str) -> None:
        arrivals.append((time.monotonic(), text))
        started.set()

    running = threading.Thread(target=lambda: client.stream_generate(grpc, "generate", "Hi", RUNNING, on_piece=on_piece))
    running.start()
    assert started.wait(60)
    sent = time.monotonic()
    answer = client.stream_generate(grpc, "generate", long_prompt, {"max_new_tokens": 4})
    first = sent + answer["first_piece_s"]
    running.join(120)
    during = [t for t, _ in arrivals if sent <= t <= first]
    tokens = alone.tokens("".join(text for t, text in arrivals if sent <= t <= first))
    assert tokens >= 60, f"the running stream got {tokens} tokens ({len(during)} responses) during a 125-chunk prefill"
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert max(gaps) < 2.0, f"the running stream stalled {max(gaps):.2f} s"
    assert answer["text"] == alone(long_prompt, 4)


def test_whitespace_stop_strings_end_generation_at_their_first_occurrence(served, alone):
    http, grpc = urls(served)
    full = alone(LONG_PROMPT, 40)
    assert " " in full.strip(), full
    cut = client.stream_generate(grpc, "generate", LONG_PROMPT, {"max_new_tokens": 40, "stop": [" "]})
    assert cut["finish_reason"] == "stop" and cut["text"] == full[: full.index(" ")]
    # "\n", the most common stop string: a seeded sample that holds one
    sampled = {"max_new_tokens": 200, "temperature": 1.0}
    seed, text = next(
        (s, t) for s in range(40) if "\n" in (t := client.stream_generate(grpc, "generate", "Hi", {**sampled, "seed": s})["text"])
    )
    cut = client.stream_generate(grpc, "generate", "Hi", {**sampled, "seed": seed, "stop": ["\n"]})
    assert cut["finish_reason"] == "stop" and cut["text"] == text[: text.index("\n")]
    body = {"text": "Hi", **sampled, "seed": seed, "stop": ["\n"], "stream": False}
    status, answer = client.http_generate(http, "generate", body)
    assert status == 200 and answer["finish_reason"] == "stop" and answer["text_output"] == cut["text"]


def test_an_empty_stop_string_is_refused_naming_stop(served):
    http, grpc = urls(served)
    expected = "'stop' holds an empty string"
    with pytest.raises(Exception, match=expected):
        client.stream_generate(grpc, "generate", "Hi", {"max_new_tokens": 4, "stop": ["\n", ""]})
    status, answer = client.http_generate(http, "generate", {"text": "Hi", "max_new_tokens": 4, "stop": [""], "stream": False})
    assert status == 400 and expected in answer["error"]


def test_stop_strings_are_parsed_apart_from_prompt_text():
    import numpy as np

    assert serving.stop_strings(np.array([b"\n", b" ", "\u00e9".encode()], dtype=np.object_)) == ("\n", " ", "\u00e9")
    with pytest.raises(serving.RequestError, match="stop string of 1025 bytes exceeds 1024 bytes"):
        serving.stop_strings(np.array([b"x" * 1025], dtype=np.object_))
    with pytest.raises(serving.RequestError, match="text is empty"):
        serving.decode_texts(np.array([b"\n"], dtype=np.object_), 100)
