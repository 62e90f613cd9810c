"""Streaming generation (generation.streaming: a decoupled model with continuous batching) on a real server:
streamed text joined = one-answer text = in-process greedy text; HTTP generate_stream sends pieces as server-sent
events; staggered streams each equal their solo result; a cancelled stream frees its place; a full queue is
refused at once while running streams finish; stop strings and seeds; the chat form; the per-request cap.
Streaming is the default for a text-generation model on the python backend (the fixture does not ask for it). Every
test runs on the torch engine and on the ONNX Runtime decoder behind the same batcher (backend onnx, the GenAI
builder's export: issue 46 #3), or on the engine HF2TRITON_TEST_BACKEND names (backend vllm on a GPU host). The ONNX
run's validation streams its parity prompts at once: with this fixture's max_queue of 2 it was "busy" before
validation sent no more than the queue holds."""

from __future__ import annotations

import copy
import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from hf2triton.triton import client
from tests.helpers import STREAMING_ENGINES, long_context_copy, make_workflow, on_test_backend, staggered, tiny_model_entries

pytestmark = pytest.mark.integration

# sampled (seeded): a random tiny model's greedy answer may end at once; a sampled one runs its 2000 tokens
# (the fixture's copy of the tiny model has a 4096-token context, so a long stream lasts seconds, not 0.6 s)
LONG = {"max_new_tokens": 2000, "temperature": 1.0, "seed": 1}
PROMPTS = ["What is the capital of France?", "Hi", "Tell me a very long story about a dragon and a knight", "你好，介绍一下你自己"]


@pytest.fixture(scope="module", params=STREAMING_ENGINES)
def streaming(request, tmp_path_factory, tiny_models):
    long_context = long_context_copy(tiny_models["text-generation"], tmp_path_factory.mktemp("long-context"))
    entries = tiny_model_entries({"text-generation": long_context})
    # 4 response threads, as a 16-core GPU host gets by default (this machine's default would be 1)
    generation = {"max_new_tokens": 16, "max_sequences": 2, "max_queue": 2, "max_new_tokens_limit": 3000, "response_threads": 4}
    entries[0]["generation"] = generation
    workflow = make_workflow(tmp_path_factory.mktemp("streaming"), on_test_backend(entries, request.param, max_model_len=4096))
    workflow.run("serve")
    workflow.original_config = copy.deepcopy(workflow.config)
    yield workflow
    workflow.stop()


def urls(workflow) -> tuple[str, str]:
    settings = workflow.settings()
    return settings.url(), settings.url("grpc_port")


def test_validation_checks_the_stream(streaming):
    checks = {c["name"]: c for c in streaming.report()["models"]["generate"]["checks"]}
    for name in ("grpc stream", "http generate (one answer)", "stream equals generate", "served equals in-process"):
        assert checks[name]["ok"], checks[name]


def test_stream_equals_one_answer_and_arrives_in_pieces(streaming):
    http, grpc = urls(streaming)
    # pieces join while the response thread is busy: on 2 loaded cores a tiny model's 24 tokens once came as one piece.
    # The first piece now always goes alone (sequences.take_pending), so two pieces at least, whatever the load.
    streamed = client.stream_generate(grpc, "generate", PROMPTS[3], {"max_new_tokens": 48})
    status, answer = client.http_generate(http, "generate", {"text": PROMPTS[3], "max_new_tokens": 48, "stream": False})
    assert status == 200 and answer["text_output"] == streamed["text"]
    assert len(streamed["pieces"]) > 1 and streamed["finish_reason"] in ("length", "stop")
    assert "\ufffd" not in "".join(streamed["pieces"])
    assert answer["finish_reason"] == streamed["finish_reason"] and answer["completion_tokens"] == streamed["completion_tokens"]


def test_http_generate_stream_sends_server_sent_events(streaming):
    http, _ = urls(streaming)
    body = json.dumps({"text": PROMPTS[0], "max_new_tokens": 12}).encode()
    url = f"http://{http}/v2/models/generate/generate_stream"
    request = urllib.request.Request(url, data=body, headers=client.key_headers(), method="POST")  # noqa: S310
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
        events = [json.loads(line[5:]) for line in response.read().decode().splitlines() if line.startswith("data:")]
    # one event per piece, the last with the finish reason. How many pieces depends on the load: a piece waiting while
    # the response thread sends the one before joins the next (on 2 busy cores a tiny model's 12 tokens were once one
    # piece); that answers arrive in pieces is test_stream_equals_one_answer_and_arrives_in_pieces's
    assert len(events) >= 2 and events[-1]["finish_reason"] in ("length", "stop")
    assert not any(e.get("finish_reason") for e in events[:-1])
    assert (
        "".join(e["text_output"] for e in events)
        == client.stream_generate(urls(streaming)[1], "generate", PROMPTS[0], {"max_new_tokens": 12})["text"]
    )


def test_a_client_leaving_the_http_event_stream_frees_its_place(streaming):
    """Triton cancels a running generate_stream request when its HTTP client leaves (its docs promise that of the gRPC
    client only): two long streams fill the running batch, their clients leave after one event, and a new stream is
    answered at once -- kept open, it waited 19 s for theirs to end (2026-12-06, the torch engine). Triton notices the
    disconnect when it writes the next piece: a request still waiting in the model's queue keeps its place until it
    starts (a gateway reading this stream failed tests/test_gateway_boundary.py's queued-clients test for that)."""
    http, grpc = urls(streaming)
    url = f"http://{http}/v2/models/generate/generate_stream"
    streams = [client.http_post_events(url, body={"text": PROMPTS[2], **LONG, "max_new_tokens": 3000}) for _ in range(2)]
    for events in streams:
        assert "text_output" in next(events)
    for events in streams:
        events.close()  # the connection closes
    time.sleep(0.5)  # the cancellations reach the batcher
    started = time.monotonic()
    answer = client.stream_generate(grpc, "generate", PROMPTS[1], {"max_new_tokens": 4}, timeout_s=60)
    assert answer["completion_tokens"] >= 1 and time.monotonic() - started < 10, "the places were freed"


def test_a_prompt_that_fits_is_answered_in_what_the_context_leaves_when_no_max_new_tokens_is_sent(streaming):
    """generation.max_new_tokens (16 here) is a default, cut to what the context leaves (vLLM's rule for an unset
    max_tokens): a prompt 3 tokens short of the 4096-token context gets 3 tokens at most, not an error naming a
    max_new_tokens its client never sent; one that is sent and does not fit is still refused, naming the context."""
    http, _ = urls(streaming)
    url = f"http://{http}/v2/models/generate/generate_stream"
    ids = [10 + i % 200 for i in range(4096 - 3)]
    events = list(client.http_post_events(url, body=client.generate_body([], {"prompt_ids": ids})))
    final = events[-1]
    assert final.get("finish_reason") in ("length", "stop") and 0 <= final["completion_tokens"] <= 3, final
    too_long = client.generate_body([], {"prompt_ids": ids, "max_new_tokens": 4, "stream": False})
    status, answer = client.http_generate(http, "generate", too_long)
    assert status == 400 and "exceeds the context of 4096 tokens" in json.dumps(answer), answer


def test_http_generate_stream_takes_every_option_as_the_grpc_stream_does(streaming):
    """client.generate_body: Triton's generate extension maps a JSON array to an [n] input, so a prompt as token ids,
    a list of stop strings, chat messages and sampling options streamed over HTTP answer as over gRPC (what a client of
    Triton's HTTP stream sends, the gateway's next upstream)."""
    http, grpc = urls(streaming)
    url = f"http://{http}/v2/models/generate/generate_stream"

    def text_and_final(texts: list[str], options: dict) -> tuple[str, dict]:
        events = list(client.http_post_events(url, body=client.generate_body(texts, options)))
        return "".join(e["text_output"] for e in events), events[-1]

    ids = [1, 2, 3, 4, 5, 6, 7]
    whole, final = text_and_final([], {"prompt_ids": ids, "max_new_tokens": 12})
    assert final["prompt_tokens"] == len(ids) and final["finish_reason"] == "length", final
    stop = whole[len(whole) // 2 :][:3]  # three characters from the answer's middle: it ends before them
    cut, final = text_and_final([], {"prompt_ids": ids, "max_new_tokens": 12, "stop": ["never-generated", stop]})
    assert whole.startswith(cut) and stop not in cut and final["finish_reason"] == "stop", (whole, cut, stop)
    sampled = {"max_new_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 7, "stop": ["never-generated"]}
    messages = [{"role": "user", "content": PROMPTS[3]}]
    for texts, prompt in (([PROMPTS[0]], PROMPTS[0]), ([], messages)):
        options = sampled if texts else {**sampled, "messages": messages}
        assert text_and_final(texts, options)[0] == client.stream_generate(grpc, "generate", prompt, sampled)["text"], prompt


def test_staggered_streams_each_equal_their_solo_result(streaming):
    _, grpc = urls(streaming)
    lengths = [12, 20, 7, 16]
    solo = [client.stream_generate(grpc, "generate", p, {"max_new_tokens": n})["text"] for p, n in zip(PROMPTS, lengths)]
    together: dict[int, str] = {}

    def run(index):
        # 2 run and 2 may wait (the fixture's limits): on a busy machine a stream can arrive before an earlier one
        # was admitted, and is refused with "busy ... retry later" -- which a client does
        for _ in range(50):
            try:
                together[index] = client.stream_generate(grpc, "generate", PROMPTS[index], {"max_new_tokens": lengths[index]})["text"]
                return
            except Exception as err:  # noqa: BLE001 - only "busy" is retried
                if "busy" not in str(err):
                    raise
                time.sleep(0.1)

    staggered(run, 4, 0.05)
    assert [together[i] for i in range(4)] == solo


def test_stop_string_and_seed(streaming):
    _, grpc = urls(streaming)
    full = client.stream_generate(grpc, "generate", PROMPTS[0], {"max_new_tokens": 20})["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = client.stream_generate(grpc, "generate", PROMPTS[0], {"max_new_tokens": 20, "stop": [stop]})
    assert cut["finish_reason"] == "stop" and cut["text"] == full[: full.index(stop)]
    sampled = [
        client.stream_generate(grpc, "generate", PROMPTS[1], {"max_new_tokens": 16, "temperature": 1.0, "seed": seed})["text"]
        for seed in (3, 3, 4)
    ]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]


def test_cancelled_stream_frees_its_place_and_full_queue_is_busy(streaming):
    import tritonclient.grpc as grpcclient

    _, grpc = urls(streaming)
    # two long streams fill the running batch (max_sequences 2), two more fill the queue (max_queue 2); the probe is
    # sent only once two streams run, so it cannot overtake a stream still on its way (it would queue, not be refused)
    streams, first_pieces, errors = [], threading.Semaphore(0), []

    def on_event(result, error):
        if error is not None:
            errors.append(str(error))
        else:
            first_pieces.release()

    for _ in range(4):
        triton = client.grpc_client(grpc)
        triton.start_stream(callback=on_event)
        triton.async_stream_infer("generate", client.build_inputs(grpcclient, [PROMPTS[2]], LONG, one_prompt=True))
        streams.append(triton)
    assert first_pieces.acquire(timeout=120), "the long streams produce pieces"
    time.sleep(1.0)  # the other streams were sent before: they have reached the server's queue
    refusal = next((error for error in errors if "busy" in error), "")
    if not refusal:
        try:
            client.stream_generate(grpc, "generate", PROMPTS[1], {"max_new_tokens": 4}, timeout_s=60)
        except Exception as err:  # noqa: BLE001 - the refusal is what is tested
            refusal = str(err) or repr(err)
    assert "busy" in refusal, refusal
    for triton in streams:  # clients go away: their sequences leave within a step
        triton.stop_stream(cancel_requests=True)
        triton.close()
    time.sleep(0.5)  # the cancellations reach the server
    started = time.monotonic()
    answer = client.stream_generate(grpc, "generate", PROMPTS[1], {"max_new_tokens": 4})
    assert answer["completion_tokens"] >= 1 and time.monotonic() - started < 10, "the places were freed"


def test_bad_request_among_running_streams_disturbs_none(streaming):
    _, grpc = urls(streaming)
    expected = client.stream_generate(grpc, "generate", PROMPTS[0], {"max_new_tokens": 16})["text"]
    result: dict[str, str] = {}
    thread = threading.Thread(
        target=lambda: result.update(text=client.stream_generate(grpc, "generate", PROMPTS[0], {"max_new_tokens": 16})["text"])
    )
    thread.start()
    with pytest.raises(Exception, match="max_new_tokens"):
        client.stream_generate(grpc, "generate", PROMPTS[1], {"max_new_tokens": 5000})
    thread.join()
    assert result["text"] == expected


def test_chat_messages_use_the_template_in_the_server(streaming):
    _, grpc = urls(streaming)
    as_text = client.stream_generate(grpc, "generate", PROMPTS[0], {"max_new_tokens": 12})
    as_chat = client.stream_generate(grpc, "generate", [{"role": "user", "content": PROMPTS[0]}], {"max_new_tokens": 12})
    assert as_chat["text"] == as_text["text"] and as_chat["prompt_tokens"] == as_text["prompt_tokens"], "text is templated as one user turn"
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": PROMPTS[0]},
    ]
    longer = client.stream_generate(grpc, "generate", conversation, {"max_new_tokens": 4})
    assert longer["prompt_tokens"] > as_text["prompt_tokens"]
    for bad, expected in (([{"role": "robot", "content": "x"}], r"messages\[0\] must be"), ([], "non-empty JSON list")):
        with pytest.raises(Exception, match=expected):
            client.stream_generate(grpc, "generate", bad, {"max_new_tokens": 4})
    with pytest.raises(Exception, match="send one of 'text', 'messages'"):
        client.stream_generate(grpc, "generate", PROMPTS[0], {"max_new_tokens": 4, "messages": conversation})


def test_per_request_cap_is_a_clear_error(streaming):
    http, _ = urls(streaming)
    status, answer = client.http_generate(http, "generate", {"text": PROMPTS[1], "max_new_tokens": 3100, "stream": False})
    assert status == 400 and "max_new_tokens=3100 exceeds generation.max_new_tokens_limit=3000" in answer["error"]


def test_frontends_share_one_engine_and_every_stream_fails_fast_when_it_dies(streaming):
    """backend vllm with vllm.frontends > 1 (HF2TRITON_TEST_VLLM_EXTRA='{"frontends": 2}' on the GPU host; the other
    tests above then run across the frontends too): one EngineCore serves them; killed, the streams of every frontend
    end with an error within seconds (none hangs) and a new request fails at once. Last: it leaves the fixture's
    engine dead."""
    import glob
    import signal

    from hf2triton.triton.state import read_state
    from tests.helpers import TEST_BACKEND, TEST_VLLM_EXTRA

    if TEST_BACKEND != "vllm" or TEST_VLLM_EXTRA.get("frontends", 1) < 2:
        pytest.skip("needs backend vllm with vllm.frontends >= 2 (a GPU host: HF2TRITON_TEST_VLLM_EXTRA)")
    _, grpc = urls(streaming)
    states = [json.loads(Path(path).read_text()) for path in glob.glob("/dev/shm/h2t-*/rendezvous.json")]
    server_pid = (read_state(streaming.settings()) or {}).get("pid")  # another server (a benchmark's) may be running
    ours = [s for s in states if s.get("state") == "ready" and s.get("server_pid") == server_pid]
    ours = [s for s in ours if Path(f"/proc/{s['engine_pid']}").exists()]
    assert len(ours) == 1, states
    outcomes: list[str] = []

    def outcome(prompt: str, options: dict) -> str:
        try:
            return client.stream_generate(grpc, "generate", prompt, options, timeout_s=60)["finish_reason"]
        except Exception as err:  # noqa: BLE001 - the engine's death is the expected outcome
            return f"error: {err}"

    longest = dict(LONG, max_new_tokens=3000)  # a GPU streams 2,000 tokens in under 3 s
    threads = [threading.Thread(target=lambda: outcomes.append(outcome(PROMPTS[2], longest))) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the four streams are open (two places, two waiting: both frontends hold some)
    os.kill(ours[0]["engine_pid"], signal.SIGKILL)
    killed = time.monotonic()
    for thread in threads:
        thread.join(timeout=30)
    assert time.monotonic() - killed < 15 and len(outcomes) == 4, outcomes
    assert all(o.startswith("error") for o in outcomes), outcomes
    started = time.monotonic()
    after = [outcome(PROMPTS[1], {"max_new_tokens": 4}) for _ in range(3)]  # whichever frontend takes them
    assert all(o.startswith("error") for o in after) and time.monotonic() - started < 15, after
