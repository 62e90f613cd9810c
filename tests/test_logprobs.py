"""Issue 44: log-probabilities, echo and n through the real gateway in front of a real tritonserver serving the tiny
Llama on the torch continuous batcher -- lm-evaluation-harness's own local-completions client scores a multiple-choice
task exactly as its in-process `hf` model does on the same saved model, and the official `openai` client gets chat
log-probabilities (streamed and not) and n samples; every value is checked against the model's own log-softmax. On the
same serve, the other clients issue 44 names: lm-eval's local-chat-completions generates as its hf model does, guidellm
benchmarks the gateway, and the playground shows each token's log-probability on hover (headless Chromium)."""

from __future__ import annotations

import json

import pytest

from hf2triton import host
from hf2triton.triton import client
from tests.helpers import ROOT, TEST_BACKEND, make_workflow, on_test_backend, tiny_model_entries

pytestmark = pytest.mark.integration

MAX_N = 3
# served log-probabilities vs the model's own log_softmax on the CPU: the torch engine on the CPU runs the reference's
# kernels; float32 GPU kernels sum in another order (vLLM's: 1.4e-4 apart at log-probabilities near -10 on an H100)
LOGPROB_TOLERANCE = 1e-4 if TEST_BACKEND == "python" else 1e-3
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    entries = [e for e in tiny_model_entries(tiny_models) if e["name"] == "generate"]
    entries[0]["generation"] = {"max_new_tokens": 6, "max_sequences": 8, "max_queue": 16, "max_n": MAX_N}
    workflow = make_workflow(tmp_path_factory.mktemp("logprobs"), on_test_backend(entries))
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield workflow
    workflow.stop()


@pytest.fixture(scope="module")
def llm(tiny_models):
    import transformers

    path = tiny_models["text-generation"]
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval(), transformers.AutoTokenizer.from_pretrained(path)


def base_url(workflow) -> str:
    return f"http://127.0.0.1:{workflow.config['openai']['port']}/v1"


def reference(llm, ids: list[int]):
    """The model's own log_softmax over `ids` ([tokens, vocabulary]; row i predicts token i + 1)."""
    import torch

    with torch.inference_mode():
        return llm[0](torch.tensor([ids])).logits[0].float().log_softmax(-1)


def post(workflow, body: dict) -> tuple[int, dict]:
    status, text = client.http_post(f"{base_url(workflow)}/completions", body=body, timeout=60)
    return status, json.loads(text)


def test_lm_eval_local_completions_scores_as_its_hf_model_does(served, tiny_models, monkeypatch):
    """Issue 44 #2: lm-eval's loglikelihood requests (token ids, echo, logprobs 1; 4 prompts per request) against the
    gateway give the accuracy and, sample by sample, the log-likelihoods of lm-eval's in-process hf model."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(ROOT)  # the task's data_files are relative to the repository
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = str(tiny_models["text-generation"])
    tasks = TaskManager(include_path=str(ROOT / "tests" / "data" / "lm_eval"), include_defaults=False)
    # lm-eval 0.4.13's hf model encodes with the tokenizer's BOS (this Llama tokenizer adds one), local-completions
    # without unless told: both told, so both score the same token ids
    remote = f"model=generate,base_url={base_url(served)}/completions,tokenizer_backend=huggingface,tokenizer={path},max_retries=1"
    remote += ",add_bos_token=True"
    local = f"pretrained={path},dtype=float32,device=cpu,add_bos_token=True"
    runs = {
        name: lm_eval.simple_evaluate(
            model=kind, model_args=args, tasks=["hf2triton_mini_mc"], task_manager=tasks, batch_size=4, log_samples=True
        )
        for name, kind, args in (("served", "local-completions", remote), ("hf", "hf", local))
    }
    accuracy = {name: run["results"]["hf2triton_mini_mc"]["acc,none"] for name, run in runs.items()}
    samples = {name: sorted(run["samples"]["hf2triton_mini_mc"], key=lambda s: s["doc_id"]) for name, run in runs.items()}
    likelihoods = {name: [ll for s in found for ll, _ in s["filtered_resps"]] for name, found in samples.items()}
    difference = max(abs(a - b) for a, b in zip(likelihoods["served"], likelihoods["hf"]))
    print(f"lm-eval accuracy {accuracy}, {len(likelihoods['hf'])} log-likelihoods, max difference {difference:.2e}")
    assert accuracy["served"] == accuracy["hf"] and len(likelihoods["served"]) == len(likelihoods["hf"]) == 12
    assert difference < 1e-3, (likelihoods, difference)


def test_lm_eval_local_chat_completions_generates_as_its_hf_model_does(served, tiny_models, monkeypatch):
    """Issue 44 #4: lm-eval's generate_until task through local-chat-completions (the gateway applies the model's chat
    template; greedy, lm-eval's stop strings) gives, answer by answer, what its in-process hf model generates with
    --apply_chat_template on the same saved model, and the same exact-match score."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = str(tiny_models["text-generation"])
    tasks = TaskManager(include_path=str(ROOT / "tests" / "data" / "lm_eval"), include_defaults=False)
    runs = {
        name: lm_eval.simple_evaluate(
            model=kind,
            model_args=args,
            tasks=["hf2triton_mini_gen"],
            task_manager=tasks,
            batch_size=1,
            log_samples=True,
            apply_chat_template=True,
        )  # fmt: skip
        for name, kind, args in (
            ("served", "local-chat-completions", f"model=generate,base_url={base_url(served)}/chat/completions,max_retries=1"),
            ("hf", "hf", f"pretrained={path},dtype=float32,device=cpu"),
        )
    }
    score = {name: run["results"]["hf2triton_mini_gen"]["exact_match,none"] for name, run in runs.items()}
    answers = {
        name: [s["resps"][0][0] for s in sorted(run["samples"]["hf2triton_mini_gen"], key=lambda s: s["doc_id"])]
        for name, run in runs.items()
    }
    print(f"lm-eval generate_until exact_match {score}, answers {answers}")
    assert len(answers["served"]) == 6 and answers["served"] == answers["hf"] and score["served"] == score["hf"]
    assert len(set(answers["hf"])) > 1, "the answers depend on the question (the prompt reached the model)"
    assert not any("patent" in answer for answer in answers["served"]), "ended before the stop string, which is left out"


def test_echo_of_token_prompts_with_nothing_generated_is_the_models_log_softmax(served, llm):
    """Issue 44 #2: echo + max_tokens 0 answers each prompt's tokens with their log-probabilities (the first null),
    one choice per prompt in order; max_tokens 0 without echo and echo for a text2text model are 400s."""
    tokenizer = llm[1]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("The dragon met", "1, 2, 3, 4")]
    status, answer = post(served, {"model": "generate", "prompt": prompts, "echo": True, "max_tokens": 0, "logprobs": 2})
    assert status == 200, answer
    assert [c["index"] for c in answer["choices"]] == [0, 1] and answer["usage"]["completion_tokens"] == 0
    for ids, choice in zip(prompts, answer["choices"]):
        found, expected = choice["logprobs"], reference(llm, ids)
        assert choice["text"] == tokenizer.decode(ids) and choice["finish_reason"] == "length"
        assert found["tokens"] == [tokenizer.decode([i]) for i in ids] and found["token_logprobs"][0] is None
        assert found["top_logprobs"][0] is None and found["text_offset"][0] == 0
        for position in range(1, len(ids)):
            assert abs(found["token_logprobs"][position] - float(expected[position - 1, ids[position]])) < LOGPROB_TOLERANCE
            assert len(found["top_logprobs"][position]) in (2, 3), "2 alternatives and the token itself"
    status, answer = post(served, {"model": "generate", "prompt": "x", "max_tokens": 0})
    assert status == 400 and answer["error"]["param"] == "max_tokens"
    status, answer = post(served, {"model": "generate", "prompt": [[1, 10**9]], "echo": True, "max_tokens": 0})
    assert status == 400 and "not a token of this model" in answer["error"]["message"], answer


def test_completion_logprobs_streamed_and_not_agree(served, llm):
    """Issue 44 #1: completions' logprobs for generated tokens (greedy: each token is its own top alternative), the
    same whole and streamed (the chunks' lists concatenated)."""
    tokenizer = llm[1]
    ids = tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    body = {"model": "generate", "prompt": ids, "max_tokens": 5, "logprobs": 1, "temperature": 0}
    status, whole = post(served, body)
    assert status == 200, whole
    found = whole["choices"][0]["logprobs"]
    assert len(found["tokens"]) == whole["usage"]["completion_tokens"] + (whole["choices"][0]["finish_reason"] == "stop"), "EOS too"
    first = float(reference(llm, ids)[-1].max())
    assert abs(found["token_logprobs"][0] - first) < LOGPROB_TOLERANCE, "the first, from the prefill's logits"
    assert all(max(top.values()) == logprob for logprob, top in zip(found["token_logprobs"], found["top_logprobs"])), "greedy"
    assert "".join(found["tokens"]).startswith(whole["choices"][0]["text"]) and found["text_offset"][0] == 0
    events = client.http_post(f"{base_url(served)}/completions", body={**body, "stream": True}, timeout=60)[1]
    chunks = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: {")]
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert [t for item in streamed for t in item["tokens"]] == found["tokens"]
    assert [v for item in streamed for v in item["token_logprobs"]] == found["token_logprobs"]
    assert [v for item in streamed for v in item["text_offset"]] == found["text_offset"]


def test_openai_client_chat_logprobs_and_n(served, llm):
    """Issue 44 #1/#3 with the official client: chat logprobs with top_logprobs, streamed and not; n samples of one
    prompt (distinct when sampled), each its own choice; n above generation.max_n is a 400 naming n."""
    import openai

    api = openai.OpenAI(base_url=base_url(served), api_key="unused", max_retries=0, timeout=60)
    chat = api.chat.completions.create(model="generate", messages=QUESTION, logprobs=True, top_logprobs=3, max_tokens=5)
    content = chat.choices[0].logprobs.content
    prompt = llm[1].apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    first = reference(llm, llm[1](prompt, add_special_tokens=False)["input_ids"])[-1]
    assert abs(content[0].logprob - float(first.max())) < LOGPROB_TOLERANCE, "the first token's, from the model's own logits"
    for item in content:  # greedy: each token the most likely, its alternatives most likely first
        assert len(item.top_logprobs) == 3 and item.top_logprobs[0].token == item.token and bytes(item.bytes).decode() == item.token
        assert item.top_logprobs[0].logprob == item.logprob >= item.top_logprobs[1].logprob >= item.top_logprobs[2].logprob
    stream = api.chat.completions.create(model="generate", messages=QUESTION, logprobs=True, top_logprobs=3, max_tokens=5, stream=True)
    streamed = [entry for event in stream if event.choices and event.choices[0].logprobs for entry in event.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    samples = api.chat.completions.create(model="generate", messages=QUESTION, n=MAX_N, temperature=1.5, max_tokens=6, seed=5)
    assert [c.index for c in samples.choices] == list(range(MAX_N)) and len({c.message.content for c in samples.choices}) > 1
    again = api.chat.completions.create(model="generate", messages=QUESTION, n=MAX_N, temperature=1.5, max_tokens=6, seed=5)
    assert [c.message.content for c in again.choices] == [c.message.content for c in samples.choices], "seeded: the same n samples"
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(model="generate", messages=QUESTION, n=MAX_N + 1)
    assert info.value.body["param"] == "n"
    stream = api.completions.create(model="generate", prompt="Hello", n=2, max_tokens=4, temperature=1.0, stream=True)
    indexes = {choice.index for event in stream for choice in event.choices}
    assert indexes == {0, 1}


@pytest.fixture(scope="module")
def browser():
    from tests.browser import start_chromium

    driver = start_chromium()
    yield driver
    driver.quit()


def test_the_playground_shows_each_tokens_logprob_on_hover(served, browser, tmp_path):
    """Issue 44 (playground): with "log-probabilities" on, a chat answer is spans of its text whose hover titles give
    each token's log-probability and its top alternatives: the spans read as the API's answer, their log-probabilities
    are the API's for the same greedy request, token by token; no console errors."""
    import openai

    from tests.browser import console_errors, fill, screenshot, text_of, wait_for

    port = served.config["openai"]["port"]
    browser.get(f"http://127.0.0.1:{port}/playground/")
    wait_for(browser, lambda: browser.execute_script("return !document.getElementById('tabs').hidden"))
    fill(browser, "chat-max-tokens", "6")
    browser.find_element("id", "chat-logprobs").click()
    fill(browser, "chat-input", QUESTION[0]["content"])
    browser.find_element("id", "chat-send").click()
    wait_for(browser, lambda: "finish:" in (text_of(browser, "#chat-log .message.assistant .stats") or ""))
    spans = browser.execute_script(
        "return [...document.querySelectorAll('#chat-log .message.assistant .text span.token')]"
        ".map(s => [s.textContent, JSON.parse(s.dataset.logprobs), s.title]);"
    )
    api = openai.OpenAI(base_url=base_url(served), api_key="unused", max_retries=0, timeout=60)
    chat = api.chat.completions.create(model="generate", messages=QUESTION, logprobs=True, top_logprobs=5, max_tokens=6, temperature=0)
    content = chat.choices[0].logprobs.content
    assert spans and "".join(text for text, _, _ in spans) == chat.choices[0].message.content == text_of(
        browser, "#chat-log .message.assistant .text"
    )
    assert [value for _, values, _ in spans for value in values] == [entry.logprob for entry in content], (spans, content)
    titles = "\n\n".join(title for _, _, title in spans).split("\n\n")
    quoted = lambda token: json.dumps(token, ensure_ascii=False)  # noqa: E731 -- as JavaScript's JSON.stringify
    for title, entry in zip(titles, content, strict=True):  # the token, its logprob, then its 5 alternatives
        lines = title.split("\n")
        assert lines[0].startswith(f"{quoted(entry.token)} logprob {entry.logprob:.4f} ") and lines[1] == "top alternatives:"
        assert lines[2:] == [f"  {quoted(alt.token)} {alt.logprob:.4f}" for alt in entry.top_logprobs], title
    assert not console_errors(browser)
    screenshot(browser, "chat-logprobs", tmp_path)
