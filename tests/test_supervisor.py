"""Issue 42 #1: what `serve` starts comes back by itself. A real tritonserver, gateway and supervisor; the
failures are real signals: a stub stopped with SIGSTOP while a stream runs, tritonserver killed, the gateway
killed. No command is typed between the failure and the check that both models serve again."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from hf2triton import host
from hf2triton.serving import interface
from hf2triton.triton import client
from hf2triton.triton.cleanup import find_ours
from hf2triton.triton.state import read_state
from hf2triton.triton.supervisor import log_file, state_file, stub_model, supervisor_status
from tests.helpers import long_context_copy, make_workflow, tiny_model_entries

pytestmark = pytest.mark.integration
BACK_WITHIN_S = 90  # the bar is a minute (measured: 41 s); 90 here, for a CI machine running the suite twice over


@pytest.fixture(scope="module")
def supervised(tmp_path_factory, tiny_models):
    models = {
        "feature-extraction": tiny_models["feature-extraction"],
        "text-generation": long_context_copy(tiny_models["text-generation"], tmp_path_factory.mktemp("long")),
    }
    entries = tiny_model_entries(models)
    entries[1]["generation"] = {"max_new_tokens": 8, "max_new_tokens_limit": 3000, "temperature": 1.0}
    workflow = make_workflow(tmp_path_factory.mktemp("supervised"), entries)
    workflow.config["server"]["supervise"] = True
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0]}
    workflow.run("serve")
    yield workflow
    workflow.stop()


def gateway_url(workflow) -> str:
    return f"http://127.0.0.1:{workflow.config['openai']['port']}"


def serving_again(workflow, since: float) -> float:
    """Seconds from `since` until both models answer a request through Triton and the gateway says ready."""
    settings = workflow.settings()
    while time.monotonic() - since < BACK_WITHIN_S:
        try:
            body = {"inputs": [{"name": interface.TEXT, "shape": [1, 1], "datatype": "BYTES", "data": ["hello"]}]}
            embedded = client.http_post(f"http://{settings.url()}/v2/models/embed/infer", body=body, timeout=10)[0] == 200
            generated = client.stream_generate(settings.url("grpc_port"), "generate", "Hi", {"max_new_tokens": 2}, timeout_s=10)
            health, _ = client.http_get(f"{gateway_url(workflow)}/health", timeout=2)
            if embedded and generated["completion_tokens"] >= 1 and health == 200:
                return time.monotonic() - since
        except Exception:  # noqa: BLE001 - not back yet
            pass
        time.sleep(0.5)
    log = log_file(workflow.settings()).read_text(errors="replace")[-3000:]
    raise AssertionError(f"not serving again within {BACK_WITHIN_S} s; supervisor log:\n{log}")


def recorded_restart(settings, what: str) -> list[dict]:
    """The supervisor's records once one names `what`: a record is written when its repair is done (the gateway
    checked after the server), which may be a moment after both models serve again."""
    deadline = time.monotonic() + 30
    while True:
        records = json.loads(state_file(settings).read_text()).get("restarts", [])
        if any(what in record["what"] for record in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"no restart record names {what!r}: {records}\n{log_file(settings).read_text()[-3000:]}")
        time.sleep(0.5)


def stream_events(workflow, events: list[dict], done: threading.Event) -> None:
    """A long streamed chat through the gateway; every SSE event (or the read's failure) is kept."""
    body = {"model": "generate", "stream": True, "max_tokens": 3000, "messages": [{"role": "user", "content": "A story"}]}
    request = urllib.request.Request(
        f"{gateway_url(workflow)}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - our gateway on loopback
            for line in response:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    events.append(json.loads(line[6:]))
    except Exception as err:  # noqa: BLE001 - a dropped connection is what must NOT happen silently
        events.append({"read_failed": repr(err)})
    finally:
        done.set()


def test_serve_starts_the_supervisor_and_status_says_so(supervised):
    status = json.loads(supervised.run("status").stdout)
    assert status["supervisor"]["running"] and status["supervisor"]["restarts"] == 0, status["supervisor"]
    assert status["openai"]["healthy"] is True, "the gateway's own /health says 200"


def test_a_stopped_stub_ends_the_running_stream_with_an_error_and_both_models_come_back(supervised):
    settings = supervised.settings()
    events, done = [], threading.Event()
    threading.Thread(target=stream_events, args=(supervised, events, done), daemon=True).start()
    deadline = time.monotonic() + 60
    while not events and time.monotonic() < deadline:
        time.sleep(0.1)
    assert events, "the stream started"
    (stub,) = [pid for pid in find_ours(settings).stubs if stub_model(settings, pid) == "generate"]
    os.kill(stub, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert done.wait(45), "the stream got neither an end nor an error after its stub was stopped"
    finally:
        if host.process_state(stub) is not None:
            os.kill(stub, signal.SIGCONT)
    errors = [event for event in events if "error" in event or "read_failed" in event]
    assert errors and "read_failed" not in errors[-1], events[-3:]
    took = serving_again(supervised, stopped)
    assert host.process_state(stub) is None, "the stopped stub was killed, not resumed"
    restarts = recorded_restart(settings, "stopped")
    print(f"stopped stub: stream ended with {errors[-1]}; serving again {took:.1f} s after SIGSTOP; supervisor: {restarts[-1]}")


def chat_status(workflow) -> tuple[int, str | None]:
    """(HTTP status, Retry-After) of one short chat through the gateway."""
    body = {"model": "generate", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    request = urllib.request.Request(
        f"{gateway_url(workflow)}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - our gateway on loopback
            return response.status, response.headers.get("Retry-After")
    except urllib.error.HTTPError as err:
        print(f"chat answered {err.code}: {err.read()[:300]!r}")  # shown with a failure: which words a 400 had
        return err.code, err.headers.get("Retry-After")


def test_a_killed_tritonserver_is_started_again_and_clients_meanwhile_get_503_with_retry_after(supervised):
    """Issue 42 #3: during a restart a chat got 400 ('has no available versions') for about 4 s: SDKs do not retry it."""
    settings = supervised.settings()
    before = read_state(settings)["pid"]
    os.kill(int(before), signal.SIGKILL)
    killed, answers = time.monotonic(), []
    while time.monotonic() - killed < BACK_WITHIN_S:
        answers.append(chat_status(supervised))
        if answers[-1][0] == 200 and read_state(settings)["pid"] != before:
            break
        time.sleep(0.2)
    assert answers[-1][0] == 200, answers[-5:]
    assert {status for status, _ in answers} <= {200, 503} and all(retry == "2" for status, retry in answers if status == 503), answers
    took = serving_again(supervised, killed)
    print(f"killed tritonserver: serving again after {took:.1f} s; answers meanwhile: {sorted(set(answers))}")


def test_a_stopped_stub_resumed_at_once_aborts_tritonserver_and_it_comes_back(supervised):
    """The hostile pass's exact steps: SIGSTOP the generation stub, one chat, SIGCONT within the supervisor's 5 s
    (tritonserver then aborted with boost::interprocess::lock_exception, and nothing brought it back)."""
    settings = supervised.settings()
    (stub,) = [pid for pid in find_ours(settings).stubs if stub_model(settings, pid) == "generate"]
    os.kill(stub, signal.SIGSTOP)
    stopped = time.monotonic()
    asked = threading.Thread(target=chat_status, args=(supervised,), daemon=True)
    asked.start()
    time.sleep(1.0)
    os.kill(stub, signal.SIGCONT)
    took = serving_again(supervised, stopped)
    print(f"SIGSTOP, a chat, SIGCONT: serving again {took:.1f} s after SIGSTOP")


def test_a_killed_gateway_is_started_again(supervised):
    from hf2triton.gateway.process import _read_state as gateway_state

    settings = supervised.settings()
    before = gateway_state(settings)["pid"]
    os.kill(int(before), signal.SIGKILL)
    took = serving_again(supervised, time.monotonic())
    deadline = time.monotonic() + 30  # the state file is written once the new gateway has answered
    while (gateway_state(settings) or {}).get("pid", before) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gateway_state(settings)["pid"] != before
    print(f"killed gateway: serving again after {took:.1f} s")


def test_a_serve_of_other_settings_takes_over_and_the_old_supervisor_steps_aside(supervised):
    """Another config in the same directory (one model fewer): its validation restarts the server while the first
    serve's supervisor still runs. That supervisor must not count the new server's stubs against its own models
    ("the stub process of embed is gone") and restart its own settings under the validation (as on an H100,
    2026-12-06): it steps aside, and the new serve's supervisor takes over."""
    settings = supervised.settings()
    old = supervisor_status(settings)["pid"]
    supervised.config["models"] = [entry for entry in supervised.config["models"] if entry["name"] != "embed"]
    supervised.run("serve")
    assert host.process_gone(old), "the first supervisor exited"
    status = supervisor_status(supervised.settings())
    assert status["running"] and status["pid"] != old and status["restarts"] == 0, status
    assert "replaced the one supervised here" in log_file(settings).read_text(), log_file(settings).read_text()[-2000:]
    generated = client.stream_generate(settings.url("grpc_port"), "generate", "Hi", {"max_new_tokens": 2}, timeout_s=30)
    assert generated["completion_tokens"] >= 1
    assert read_state(supervised.settings())["models"] == ["generate"]


def test_stop_stops_the_supervisor_first_and_nothing_comes_back(supervised):
    settings = supervised.settings()
    supervisor = supervisor_status(settings)["pid"]
    supervised.run("stop")
    time.sleep(3 * 1.0 + 1)
    assert host.process_gone(supervisor) and not find_ours(settings).servers, "stopped for good"
    assert not supervisor_status(settings)["running"]
