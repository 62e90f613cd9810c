"""A failed or careless change never takes down what is serving; built artifacts are verified before they are
served; work per request is bounded; our own dead processes are cleaned up. Real server, tiny models; this
module has its own served workflow (its tests tamper with files and kill processes)."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hf2triton import host
from hf2triton.errors import UserError
from hf2triton.triton import client
from hf2triton.triton.cleanup import find_ours
from hf2triton.triton.process import reload_models
from tests.helpers import make_workflow, tiny_model_entries

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    # the encoder and the generator (no classifier: nothing here needs a third model's stub in every restart)
    entries = [entry for entry in tiny_model_entries(tiny_models) if entry["name"] in ("embed", "generate")]
    # an unbatched copy of the encoder: the texts cap must bound it too
    entries.append({**entries[0], "name": "unbatched", "max_batch_size": 0, "max_texts_per_request": 4, "max_request_bytes": 4096})
    workflow = make_workflow(tmp_path_factory.mktemp("never-break"), entries)
    try:  # a failed first serve may still have started the server
        workflow.run("serve")
        workflow.original_config = copy.deepcopy(workflow.config)
        yield workflow
    finally:
        workflow.stop()


@pytest.fixture
def workflow(served, request):
    """Served and current with the original config before every test, whatever the previous one did. A test marked
    serves_its_own_config gets the original config unserved: its own first serve converges the server in one step
    (a restoring serve first would reload or restart it for nothing). The tests that replace, kill or move the server
    come last, so no restoring serve restarts it after them (a restart loads every model again)."""
    served.config = copy.deepcopy(served.original_config)
    if request.node.get_closest_marker("serves_its_own_config") is None:
        served.run("serve")
    yield served
    served.config = copy.deepcopy(served.original_config)


def generate_entry(workflow) -> dict:
    """The generation model's entry in the config the next run writes."""
    return next(entry for entry in workflow.config["models"] if entry["name"] == "generate")


def embed_ok(workflow, model: str = "embed", settings=None) -> bool:
    http = client.http_client((settings or workflow.settings()).url())
    try:
        return http.infer(model, client.build_inputs(httpclient, ["still serving"])).as_numpy("embedding").shape[0] == 1
    except InferenceServerException:
        return False


def status(workflow) -> dict:
    result = workflow.run("status")
    return json.loads(result.stdout[result.stdout.index("{") : result.stdout.rindex("}") + 1])


def test_deleted_model_py_is_rendered_again_and_the_dry_run_says_so(workflow):
    model_py = workflow.directory / "model_repository" / "embed" / "1" / "model.py"
    model_py.unlink()
    pid = workflow.state()["pid"]
    assert not status(workflow)["current"] and "embed" in status(workflow)["changed_since_rendered"]
    dry = workflow.run("-n", "serve")
    assert "model_repository/embed changed since it was built (1/model.py is missing)" in dry.stderr
    assert "repository" in workflow.jobs_run(dry) and "Forced execution" in dry.stdout
    result = workflow.run("serve")
    assert model_py.is_file() and workflow.state()["pid"] == pid, "re-rendered and reloaded, server kept"
    assert embed_ok(workflow) and status(workflow)["current"]
    assert "Traceback" not in result.stderr


def test_hand_edits_are_detected_and_replaced_while_the_model_keeps_serving(workflow):
    config = workflow.directory / "model_repository" / "embed" / "config.pbtxt"
    rendered = config.read_text()
    config.write_text(rendered.replace("max_batch_size: 4", "max_batch_size: 1000"))  # valid, but not what was rendered
    assert not status(workflow)["current"]
    config.write_text(rendered.replace("max_batch_size: 4", "max_batch_size: 4\n}}}"))  # a syntax error
    assert embed_ok(workflow), "nothing reloads a hand edit by itself"
    workflow.run("serve")
    assert config.read_text() == rendered and embed_ok(workflow) and status(workflow)["current"]


def test_truncated_weights_are_rebuilt_before_they_are_served(workflow):
    weights = workflow.directory / ".hf2triton" / "models" / "embed" / "pretrained" / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size // 2)
    changed = status(workflow)
    assert not changed["current"] and any("model.safetensors changed size" in p for p in sum(changed["changed_since_built"].values(), []))
    dry = workflow.run("-n", "serve")
    assert "pretrained changed since it was built (model.safetensors changed size" in dry.stderr
    assert {"pretrained", "repository"} <= set(workflow.jobs_run(dry))
    workflow.run("serve")
    assert weights.stat().st_size == size and embed_ok(workflow) and workflow.report()["ok"]
    assert status(workflow)["current"] and "changed_since_built" not in status(workflow)


def test_failed_load_keeps_the_previous_version_serving(workflow):
    """Triton's explicit load replaces a loaded model only on success: no unload first."""
    settings, state = workflow.settings(), workflow.state()
    config = workflow.directory / "model_repository" / "embed" / "config.pbtxt"
    rendered = config.read_text()
    config.write_text(rendered.replace("max_batch_size: 4", "max_batch_size: 4\n}}}"))
    try:
        with pytest.raises(UserError) as info:
            reload_models(settings, state, ("embed",))
        assert "the previous version keeps serving" in info.value.render()
        assert embed_ok(workflow)
    finally:
        config.write_text(rendered)


def test_unusable_host_or_taken_port_leaves_the_old_server_serving(workflow):
    pid, serving = workflow.state()["pid"], workflow.settings()
    workflow.config["server"]["host"] = "203.0.113.7"  # TEST-NET-3: not an address of this machine
    result = workflow.run("serve", check=False)
    assert result.returncode == 1 and "server.host = '203.0.113.7': this machine cannot listen" in result.stderr
    assert "Traceback" not in result.stderr
    assert workflow.state()["pid"] == pid and host.process_cmdline(pid) and embed_ok(workflow, settings=serving)
    workflow.config["server"]["host"] = serving.host
    with socket.socket() as foreign:  # another program holds the port the new config asks for
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        taken = foreign.getsockname()[1]
        workflow.config["server"]["http_port"] = taken
        result = workflow.run("serve", check=False)
    assert result.returncode == 1 and f"{taken}" in result.stderr and "in use by another program" in result.stderr, result.stderr[-1500:]
    assert "Traceback" not in result.stderr
    assert workflow.state()["pid"] == pid and embed_ok(workflow, settings=serving)


def test_texts_and_bytes_per_request_are_bounded_also_without_batching(workflow):
    """An unbatched model took one request of 2,000 texts for 133 s (9 GB): the caps refuse it before
    any text is decoded."""
    http = client.http_client(workflow.settings().url())
    assert http.infer("unbatched", client.build_inputs(httpclient, ["a"] * 4)).as_numpy("embedding").shape[0] == 4
    began = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        http.infer("unbatched", client.build_inputs(httpclient, ["a long enough text " * 5] * 2000))
    assert "2000 texts exceed max_texts_per_request=4" in str(info.value) and info.value.status() == "400"
    assert time.monotonic() - began < 10, "refused, not computed"
    with pytest.raises(InferenceServerException) as info:
        http.infer("unbatched", client.build_inputs(httpclient, ["x" * 3000] * 2))
    assert "6000 bytes of text exceed max_request_bytes=4096" in str(info.value) and info.value.status() == "400"


def burst(url: str, requests: int = 12) -> list[str]:
    """`requests` generation requests at once: "ok", or "refused after N s: <error>" each."""
    outcomes: list[str] = []

    def one():
        grpc = client.grpc_client(url)
        started = time.monotonic()
        try:
            grpc.infer("generate", client.build_inputs(grpcclient, ["tell me a long story"], {"max_new_tokens": 48}), client_timeout=120)
            outcomes.append("ok")
        except InferenceServerException as err:
            outcomes.append(f"refused after {time.monotonic() - started:.1f} s: {err}")

    threads = [threading.Thread(target=one) for _ in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.serves_its_own_config
def test_queue_bound_and_timeout_refuse_instead_of_queueing(workflow, tiny_models):
    # the static generation model's queue (a streaming one has generation.max_queue: tests/test_streaming.py)
    generate = generate_entry(workflow)
    generate.update(max_batch_size=1, queue={"max_size": 1, "timeout_s": 30}, generation={"streaming": False})
    workflow.run("serve")
    assert "max_queue_size: 1" in (workflow.directory / "model_repository" / "generate" / "config.pbtxt").read_text()
    outcomes = burst(workflow.settings().url("grpc_port"))
    refused = [o for o in outcomes if o != "ok"]
    assert refused and "ok" in outcomes, outcomes
    assert all("Exceeds maximum queue size" in o for o in refused), refused
    # a queue timeout: a request that waited longer is refused, not computed later
    generate["queue"] = {"max_size": 0, "timeout_s": 0.05}
    workflow.run("serve")
    outcomes = burst(workflow.settings().url("grpc_port"))
    refused = [o for o in outcomes if o != "ok"]
    assert refused and "ok" in outcomes, outcomes
    assert all("timeout expired" in o.lower() for o in refused), refused


@pytest.mark.serves_its_own_config
def test_sampling_config_validates_and_an_impossible_default_is_refused_first(workflow):
    generate = generate_entry(workflow)
    generate["generation"] = {"max_new_tokens": 8, "temperature": 0.7, "streaming": False}  # the static model (as reported)
    workflow.run("serve")
    checks = {c["name"]: c for c in workflow.report()["models"]["generate"]["checks"]}
    assert all(c["ok"] for c in checks.values()) and "configured sampling (temperature 0.7)" in checks, checks
    generate["generation"] = {"max_new_tokens": 8, "temperature": 0.7}  # streaming, the default
    workflow.run("serve")
    checks = {c["name"]: c for c in workflow.report()["models"]["generate"]["checks"]}
    assert checks["stream equals generate"]["ok"] and checks["configured sampling (temperature 0.7)"]["ok"]
    pid = workflow.state()["pid"]
    generate["generation"] = {"max_new_tokens": 8192}
    result = workflow.run("serve", check=False)
    assert result.returncode == 1 and "generation.max_new_tokens = 8192 does not fit its context of 256 tokens" in result.stderr
    assert workflow.state()["pid"] == pid
    rendered = workflow.directory / "model_repository" / "generate" / "config.pbtxt"
    assert rendered.is_file(), "the refused value lost nothing: the rendered model is kept for the next restart"
    answer = client.stream_generate(workflow.settings().url("grpc_port"), "generate", "hello", {"max_new_tokens": 4})
    assert answer["completion_tokens"] >= 1, "the previous version still answers"


@pytest.mark.serves_its_own_config
def test_request_whose_client_gave_up_is_not_computed(workflow):
    """A queued request whose client is gone (here: its gRPC deadline passed) gets no compute: Triton or
    model.py (request.is_cancelled) drops it, so only the one that waited is computed.
    (The static generation model; a streaming one's cancellation: tests/test_streaming.py.)"""
    generate_entry(workflow).update(max_batch_size=1, generation={"streaming": False})
    workflow.run("serve")
    url = workflow.settings().url("grpc_port")
    grpc = client.grpc_client(url)
    story_client = client.grpc_client(url)
    story = client.build_inputs(grpcclient, ["a long story, please"], {"max_new_tokens": 200})
    story_client.infer("generate", story)  # warm
    began = time.monotonic()
    story_client.infer("generate", story)  # alone first: how long the story takes on this machine
    story_seconds = time.monotonic() - began
    ended = {}

    def ask_for_a_long_story() -> None:
        story_client.infer("generate", story, client_timeout=120)
        ended["at"] = time.monotonic()

    time.sleep(0.5)  # Triton counts a success after the response went out
    log = workflow.work / "server" / "tritonserver.log"
    skipped_before = log.read_text().count("cancelled by its client before compute")
    before = grpc.get_inference_statistics("generate", as_json=True)["model_stats"][0]["inference_stats"]["success"].get("count", "0")
    long_request = threading.Thread(target=ask_for_a_long_story)
    long_request.start()
    time.sleep(story_seconds / 5)
    deadline = story_seconds / 5  # passes while the story is still being written
    sent = time.monotonic()
    try:
        grpc.infer("generate", client.build_inputs(grpcclient, ["waits behind it"], {"max_new_tokens": 8}), client_timeout=deadline)
        queued = False
    except InferenceServerException as err:
        assert "Deadline" in str(err), str(err)
        queued = True
    long_request.join()
    # Only a request that was still queued when its deadline passed must be dropped; if the story ended
    # before that (the tiny model may stop early), the second one started in time and was rightly computed.
    if not queued or ended["at"] < sent + deadline + 0.05:
        pytest.skip(f"the story ({story_seconds:.2f} s alone) ended before the deadline: nothing was queued on this machine")
    time.sleep(1)
    after = grpc.get_inference_statistics("generate", as_json=True)["model_stats"][0]["inference_stats"]["success"].get("count", "0")
    answered = int(after) - int(before)
    timeline = f"story {story_seconds:.2f} s alone; ended {ended['at'] - sent - deadline:.2f} s after the deadline"
    # Dropped in Triton's queue (not answered), or -- prefetched into the next batch before its deadline, as
    # Triton does without a queue policy -- answered "cancelled" by model.py without computing (Triton counts
    # that response as a success, so the log says which).
    skipped = log.read_text().count("cancelled by its client before compute") - skipped_before
    assert answered - skipped == 1, f"only the waiting client's request computed: {answered} answered, {skipped} skipped ({timeline})"


def test_server_is_recognised_without_its_state_file(workflow):
    settings, state = workflow.settings(), workflow.state()
    settings.state_file.write_text("{ corrupt")
    result = workflow.run("serve")
    assert "in use by another program" not in result.stderr
    new = workflow.state()
    assert new["pid"] != state["pid"] and host.process_gone(state["pid"]), "replaced, to regain control"
    workflow.config["paths"] = {"work": ".elsewhere"}  # a changed paths.work: no state file describes our server
    ran = workflow.jobs_run(workflow.run("results/preflight.json", "--forcerun", "preflight"))  # the target before --forcerun's list
    assert ran == ["preflight"], ran
    ports = {c["name"]: c for c in json.loads((workflow.directory / "results" / "preflight.json").read_text())["checks"]}
    assert ports["port:http_port"]["ok"] and "held by our tritonserver" in ports["port:http_port"]["detail"], ports
    workflow.config["paths"] = workflow.original_config.get("paths", {"work": ".hf2triton"})
    settings.state_file.unlink()
    stopped = workflow.run("stop").stderr
    assert f"stopped tritonserver (pid {new['pid']})" in stopped, stopped[-3000:]
    assert host.process_gone(new["pid"])


def crash_leaving_a_stub(settings, state) -> list[str]:
    """Kill the server as a crash would, with one stub that outlives it; the stubs' shared-memory regions."""
    stubs = find_ours(settings).stubs
    regions = [(host.process_cmdline(pid) or ["", "", ""])[2] for pid in stubs]
    assert stubs and all(Path("/dev/shm", r).exists() for r in regions)
    # A busy stub does not notice its server die (seen during a soak: they outlived `make stop`, ignoring
    # SIGTERM); a stopped one stands in for it here.
    os.kill(stubs[0], signal.SIGSTOP)
    os.kill(state["pid"], signal.SIGKILL)  # the server only
    time.sleep(2)
    assert stubs[0] in find_ours(settings).orphans, "a stub outlives its server"
    return regions


def test_killed_server_leaves_no_stubs_or_shared_memory(workflow):
    settings = workflow.settings()
    regions = crash_leaving_a_stub(settings, workflow.state())
    workflow.run("serve")  # restores the server and ends what the dead one left
    assert not find_ours(settings).orphans and not any(Path("/dev/shm", r).exists() for r in regions) and embed_ok(workflow)
    regions = crash_leaving_a_stub(settings, workflow.state())
    message = workflow.run("stop").stderr
    assert "no server of ours is running; cleaned" in message
    assert not find_ours(settings).stubs and not any(Path("/dev/shm", r).exists() for r in regions)


@pytest.mark.serves_its_own_config
def test_ipv6_loopback_serves(workflow):
    workflow.config["server"]["host"] = "::1"
    workflow.run("serve")
    settings = workflow.settings()
    assert settings.url() == f"[::1]:{settings.server.http_port}"
    grpc = client.grpc_client(settings.url("grpc_port"))
    assert grpc.infer("embed", client.build_inputs(grpcclient, ["over IPv6"])).as_numpy("embedding").shape[0] == 1
    assert embed_ok(workflow)
