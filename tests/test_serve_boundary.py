"""The serving boundary and `serve` never breaking what serves (issues 24, 28, 32), on a real server with tiny
models and the gateway: Triton's client APIs need the per-user key (health open, whatever the Host header); a
gateway beyond loopback without an API key, a changed key, a taken openai.port, an unusable openai.host; two
starts at once after a crash; one `serve` restores a killed tritonserver or gateway and the other keeps serving."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import stat
import threading
import time
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from hf2triton import host
from hf2triton.gateway.process import log_file, state_file
from hf2triton.triton import client
from hf2triton.triton.cleanup import find_ours
from hf2triton.triton.process import ensure_server
from tests.helpers import make_workflow, tiny_model_entries
from tests.test_never_break import status

pytestmark = pytest.mark.integration

KEY_ENV = "HF2TRITON_BOUNDARY_KEY"  # the gateway's API key variable in these tests (never the user's)
CHAT = {"model": "generate", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    entries = [e for e in tiny_model_entries(tiny_models) if e["name"] in ("embed", "generate")]
    workflow = make_workflow(tmp_path_factory.mktemp("boundary"), entries)
    workflow.config["openai"] = {"enabled": True, "port": host.free_ports(1)[0], "api_key_env": KEY_ENV}
    try:  # a failed first serve may still have started the server
        workflow.run("serve")
        workflow.original_config = copy.deepcopy(workflow.config)
        yield workflow
    finally:
        workflow.stop()


@pytest.fixture
def workflow(served):
    """Served and current with the original config (gateway on loopback, no API key) before every test."""
    served.config = copy.deepcopy(served.original_config)
    served.env.pop(KEY_ENV, None)
    served.run("serve")
    yield served
    served.config = copy.deepcopy(served.original_config)
    served.env.pop(KEY_ENV, None)


def gateway_pid(workflow) -> int:
    return json.loads(state_file(workflow.settings()).read_text())["pid"]


def gateway_base(workflow) -> str:
    return f"http://127.0.0.1:{workflow.config['openai']['port']}/v1"


def gateway_get(workflow, path: str, key: str | None = None, base: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"{base or gateway_base(workflow)}{path}", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def chat(workflow, key: str | None = None) -> tuple[int, str]:
    return client.http_post(f"{gateway_base(workflow)}/chat/completions", {"Authorization": f"Bearer {key}"} if key else {}, CHAT)


def triton(url: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    """Status of a raw request to Triton's HTTP port (no client helper: it would add the key)."""
    request = urllib.request.Request(f"http://{url}{path}", data=body, headers=headers or {}, method="POST" if body else "GET")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


# ---------------------------------------------------------------- the boundary (issue 24 #1-#3, issue 32 #2)


def test_a_gateway_beyond_loopback_without_an_api_key_is_refused_before_anything_is_touched(workflow):
    server, gateway = workflow.state()["pid"], gateway_pid(workflow)
    workflow.config["openai"]["host"] = "0.0.0.0"  # noqa: S104
    result = workflow.run("serve", check=False)
    assert result.returncode == 1 and "openai.host = '0.0.0.0'" in result.stderr, result.stderr[-3000:]
    assert f"export {KEY_ENV}=" in result.stderr and "nothing running was touched" in result.stderr
    assert "Traceback" not in result.stderr
    assert workflow.jobs_run(result) == ["preflight"], "refused by preflight, the run's first job, before any download"
    workflow.config["openai"].pop("host")
    workflow.config["server"]["host"] = "0.0.0.0"  # noqa: S104 - the gateway follows server.host: refused by preflight too
    result = workflow.run("serve", check=False)
    assert result.returncode == 1 and "server.host = '0.0.0.0' (openai.host unset" in result.stderr, result.stderr[-3000:]
    assert workflow.jobs_run(result) == ["preflight"]
    assert workflow.state()["pid"] == server and workflow.state()["host"] == "127.0.0.1" and host.process_cmdline(server)
    cmd = host.process_cmdline(gateway)
    assert gateway_pid(workflow) == gateway and cmd and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert gateway_get(workflow, "/models") == 200, "the old gateway keeps serving on loopback"


def test_a_changed_api_key_restarts_the_gateway(workflow):
    workflow.env[KEY_ENV] = "first-key-not-a-secret"
    workflow.run("serve")
    first = gateway_pid(workflow)
    assert gateway_get(workflow, "/models") == 401 and gateway_get(workflow, "/models", "first-key-not-a-secret") == 200
    workflow.env[KEY_ENV] = "second-key-not-a-secret"
    assert not status(workflow)["openai"]["current"], "status sees the key changed"
    result = workflow.run("serve")
    assert "gateway started" in result.stderr and gateway_pid(workflow) != first and host.process_gone(first)
    assert gateway_get(workflow, "/models", "first-key-not-a-secret") == 401
    assert gateway_get(workflow, "/models", "second-key-not-a-secret") == 200 and chat(workflow, "second-key-not-a-secret")[0] == 200
    assert status(workflow)["openai"]["current"]
    saved = state_file(workflow.settings())
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    for secret in ("first-key-not-a-secret", "second-key-not-a-secret"):
        assert secret not in saved.read_text() and secret not in log_file(workflow.settings()).read_text()


def test_moving_the_gateway_to_a_taken_port_or_an_unusable_host_keeps_the_old_one_serving(workflow):
    pid, old_base = gateway_pid(workflow), gateway_base(workflow)
    with socket.socket() as foreign:  # another program holds the port the new config asks for
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        taken = foreign.getsockname()[1]
        workflow.config["openai"]["port"] = taken
        result = workflow.run("serve", check=False)
    refused = f"openai.port {taken} on 127.0.0.1 is in use by another program"
    assert result.returncode == 1 and refused in result.stderr, result.stderr[-3000:]
    assert "the running gateway keeps serving" in result.stderr and "Traceback" not in result.stderr
    assert gateway_pid(workflow) == pid and gateway_get(workflow, "/models", base=old_base) == 200
    workflow.config["openai"]["port"] = workflow.original_config["openai"]["port"]
    workflow.config["openai"]["host"] = "203.0.113.7"  # TEST-NET-3: not an address of this machine
    workflow.env[KEY_ENV] = "a-key-not-a-secret"  # beyond loopback: a key is needed first
    result = workflow.run("serve", check=False)
    assert result.returncode == 1 and "openai.host = '203.0.113.7': this machine cannot listen" in result.stderr, result.stderr[-3000:]
    assert gateway_pid(workflow) == pid and gateway_get(workflow, "/models", base=old_base) == 200


# ---------------------------------------------------------------- one start at a time (issue 24 #6)


def test_two_starts_at_once_after_a_crash_start_one_server(workflow):
    settings = workflow.settings()
    os.killpg(workflow.state()["pid"], signal.SIGKILL)  # a crash: the server and its stubs
    time.sleep(1)
    results: list[dict] = []
    ready = threading.Barrier(2)

    def serve() -> None:
        ready.wait()
        results.append(ensure_server(settings))

    starts = [threading.Thread(target=serve) for _ in range(2)]
    for thread in starts:
        thread.start()
    for thread in starts:
        thread.join()
    assert sorted(r["action"] for r in results) == ["keep", "start"], [(r["action"], r["reason"]) for r in results]
    pid = results[0]["pid"]
    assert results[1]["pid"] == pid == workflow.state()["pid"] and find_ours(settings).servers == (pid,)
    assert os.readlink(f"/proc/{pid}/fd/1") == str(settings.log_file), "the log file belongs to the live server"
    assert client.is_ready(settings.url())


# ---------------------------------------------------------------- one serve restores (issue 28)


def test_one_serve_restores_tritonserver_killed_under_a_running_gateway(workflow):
    gateway, server = gateway_pid(workflow), workflow.state()["pid"]
    os.killpg(server, signal.SIGKILL)  # as the OOM killer would
    time.sleep(1)
    result = workflow.run("serve")  # its gateway check waits for the surviving gateway to see the new Triton
    assert "gateway kept" in result.stderr and "gateway checked" in result.stderr, result.stderr[-3000:]
    assert gateway_pid(workflow) == gateway and workflow.state()["pid"] != server
    got, answer = chat(workflow)
    assert got == 200 and json.loads(answer)["choices"][0]["message"]["content"] is not None, answer


def test_one_serve_restores_a_killed_gateway(workflow):
    gateway, server = gateway_pid(workflow), workflow.state()["pid"]
    os.kill(gateway, signal.SIGKILL)
    time.sleep(0.5)
    result = workflow.run("serve")
    assert "gateway started" in result.stderr and "gateway checked" in result.stderr, result.stderr[-3000:]
    assert gateway_pid(workflow) != gateway and workflow.state()["pid"] == server, "Triton kept"
    assert chat(workflow)[0] == 200


def test_triton_beyond_loopback_answers_its_client_apis_only_with_the_key(workflow):
    """server.host 0.0.0.0 with the gateway kept on loopback (openai.host): no API key needed, and Triton's
    metadata, inference, config and statistics routes refuse anyone without the per-user key, whatever the Host
    header (DNS rebinding) or content type; health stays open for probes. (Last in this module: it moves the server
    off loopback, and a test after it would first wait for a restart back.)"""
    workflow.config["server"]["host"] = "0.0.0.0"  # noqa: S104
    workflow.config["openai"]["host"] = "127.0.0.1"
    workflow.run("serve")
    settings = workflow.settings()
    assert workflow.state()["host"] == "0.0.0.0"  # noqa: S104
    gateway_cmd = host.process_cmdline(gateway_pid(workflow))
    assert gateway_cmd[gateway_cmd.index("--host") + 1] == "127.0.0.1", "the gateway binds its own host, not Triton's"
    assert status(workflow)["openai"]["url"] == f"{gateway_base(workflow)}"
    url, key = settings.url(), {client.KEY_HEADER: client.client_key()}
    infer = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["hi"]}]}).encode()
    for foreign in ({}, {"Host": f"evil.example:{settings.server.http_port}"}):
        for path in ("/v2/health/ready", "/v2/health/live", "/v2/models/embed/ready"):
            assert triton(url, path, headers=foreign) == 200, (path, foreign)
        for path in ("/v2", "/v2/models/embed", "/v2/models/embed/config", "/v2/models/embed/stats"):
            assert triton(url, path, headers=foreign) == 403, (path, foreign)
            assert triton(url, path, headers={**foreign, **key}) == 200, (path, foreign)
        for kind in ("application/json", "text/plain"):
            assert triton(url, "/v2/models/embed/infer", infer, {**foreign, "Content-Type": kind}) == 403, (kind, foreign)
        assert triton(url, "/v2/models/embed/infer", infer, {**foreign, **key, "Content-Type": "application/json"}) == 200
    unkeyed = grpcclient.InferenceServerClient(settings.url("grpc_port"))
    assert unkeyed.is_server_ready() and unkeyed.is_model_ready("embed"), "gRPC health is open"
    for call in (lambda: unkeyed.get_model_metadata("embed"), lambda: unkeyed.infer("embed", client.build_inputs(grpcclient, ["hi"]))):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.status() == "StatusCode.UNAVAILABLE" and "restricted" in str(info.value), str(info.value)
    keyed = client.grpc_client(settings.url("grpc_port"))
    assert keyed.infer("embed", client.build_inputs(grpcclient, ["hi"])).as_numpy("embedding").shape[0] == 1
