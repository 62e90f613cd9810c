"""Review findings on the server's lifecycle, each on real processes (no tritonserver: a stand-in process tree whose
stubs carry the stub's name and a model's path, as Triton's do, or a stand-in program named tritonserver that answers
health checks): the supervisor never kills a healthy server, backs off from a crash loop and gives up on it, is kept
(and replaced) as it should be; a killed gateway's workers do not outlive it; terminate does not wait on a zombie; logs
are rotated; the MPS daemon holds no hub token; a run of another work directory takes the repository over, and `make
stop` stops every supervisor of it, also when the config no longer loads."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf2triton import host, logs
from hf2triton.errors import UserError
from hf2triton.gateway.process import ensure_gateway, gateway_alive, stop_gateway
from hf2triton.gateway.process import log_file as gateway_log
from hf2triton.pipeline.serve import stop_step
from hf2triton.specs import OpenAISpec, ServerSpec, to_param
from hf2triton.triton import mps, supervisor
from hf2triton.triton.cleanup import find_ours, find_supervisors, group_members, terminate
from hf2triton.triton.process import ensure_server
from hf2triton.triton.settings import Settings
from hf2triton.triton.state import dead_stub_models, read_state, record_loaded, write_state
from hf2triton.triton.supervisor import RestartWindow, Supervisor, ensure_supervisor, kill_group, stop_supervisor, supervisor_status
from tests.helpers import ROOT, fake_mps_control

STUB = "/opt/tritonserver/backends/python/triton_python_backend_stub"


@pytest.fixture
def settings(tmp_path) -> Settings:
    ports = host.free_ports(3)
    spec = ServerSpec(http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2])
    return Settings.of(spec, ["m"], str(tmp_path / "work"), str(tmp_path / "repo"))


def render(settings: Settings, instances: int) -> None:
    """The model as `serve` renders it: config.pbtxt (with `instances` instances) and a model.py (here: one that waits)."""
    model = Path(settings.repository) / "m"
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "1" / "model.py").write_text("import time\ntime.sleep(300)\n")
    (model / "config.pbtxt").write_text(f'name: "m"\nbackend: "python"\ninstance_group [{{ count: {instances}, kind: KIND_CPU }}]\n')


def stubs_of(pid: int) -> list[int]:
    return [child for child in host.descendants(pid) if (host.process_cmdline(child) or [""])[0] == STUB]


@pytest.fixture
def fake_server(settings):
    """Start a stand-in tritonserver (its own session, as start_server's) with `stubs` stub processes of model m,
    rendered with `rendered` instances, and its state file as start_server writes it once ready."""
    started: list[subprocess.Popen] = []

    def start(stubs: int, rendered: int, ready: bool = True) -> subprocess.Popen:
        render(settings, rendered)
        stub = f"(exec -a {STUB} {sys.executable} {settings.repository}/m/1/model.py) &"
        process = subprocess.Popen(["bash", "-c", f"{' '.join([stub] * stubs)} sleep 300 & wait"], start_new_session=True)
        started.append(process)
        deadline = time.monotonic() + 10
        while len(stubs_of(process.pid)) < stubs and time.monotonic() < deadline:
            time.sleep(0.05)
        cmdline = host.process_cmdline(process.pid)
        state = {"pid": process.pid, "boot_id": host.boot_id(), "cmdline": cmdline, "started_at": time.time(), "ready": ready}
        record_loaded(settings, state, settings.models)
        write_state(settings, state)
        return process

    yield start
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# ---------------------------------------------------------------- 1: a healthy server is never killed


def test_stubs_are_counted_against_what_the_server_loaded_not_a_later_render(settings, fake_server):
    """`make serve OVERLAY=...` (or a config whose validation then fails) renders more instances; the running server
    still has the ones it loaded, and nothing is gone."""
    server = fake_server(stubs=1, rendered=1)
    render(settings, 3)
    assert dead_stub_models(settings, read_state(settings)) == []
    assert Supervisor(settings, OpenAISpec()).problems() == []
    os.kill(stubs_of(server.pid)[0], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while stubs_of(server.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Supervisor(settings, OpenAISpec()).problems() == ["the stub process of m is gone"]


def test_a_server_still_starting_has_no_stubs_to_miss(settings, fake_server):
    """start_server writes the state file before a stub exists (ready: false until the server is ready)."""
    fake_server(stubs=0, rendered=2, ready=False)
    assert Supervisor(settings, OpenAISpec()).problems() == []


def test_a_repair_looks_again_under_the_lock_and_leaves_a_healthy_server_alone(settings, fake_server, monkeypatch):
    """The supervisor saw a stub gone, then waited for the lock while a `validate` restarted the server: the server it
    finds then is healthy and must survive (it was SIGKILLed, and restarted with the unvalidated repository)."""
    server = fake_server(stubs=2, rendered=2)
    monkeypatch.setattr(supervisor, "ensure_server", lambda _settings, **_: pytest.fail("a healthy server was restarted"))
    assert Supervisor(settings, OpenAISpec()).repair(["the stub process of m is gone"]) is False
    assert server.poll() is None and len(stubs_of(server.pid)) == 2
    assert not supervisor.state_file(settings).exists(), "nothing was recorded"


def test_kill_group_kills_only_the_server_the_state_names(settings, fake_server):
    server = fake_server(stubs=1, rendered=1)
    state = read_state(settings)
    assert kill_group({**state, "cmdline": ["another", "program"]}) is False and server.poll() is None
    assert kill_group(state) is True
    server.wait(timeout=10)


# ---------------------------------------------------------------- 3: a crash loop backs off, then the supervisor gives up


def test_restarts_back_off_by_how_many_there_were_lately():
    window = RestartWindow()
    assert window.delay_s(0.0) == 0.0, "the first restart is at once"
    window.add(0.0)
    assert window.delay_s(0.25) == 0.75, "1 s after the one before"
    for at in (1.0, 3.0):
        window.add(at)
    assert window.delay_s(3.0) == 4.0 and window.delay_s(10.0) == 0.0
    assert window.delay_s(3.0 + supervisor.RESTART_WINDOW_S) == 0.0 and window.recent(3.0 + supervisor.RESTART_WINDOW_S) == 0
    for at in range(supervisor.MAX_RESTARTS - 1):
        window.add(float(at))
    assert not window.exhausted(10.0) and window.delay_s(10.0) == supervisor.MAX_BACKOFF_S - 4.0, "at most MAX_BACKOFF_S apart"
    window.add(10.0)
    assert window.exhausted(10.0) and not window.exhausted(10.0 + supervisor.RESTART_WINDOW_S)


def test_a_server_that_crashes_after_every_restart_is_given_up_on(settings, monkeypatch):
    """Restarts that worked count too: the server starts (a real process), then dies again."""
    cmdline = [sys.executable, "-c", "import time; time.sleep(0.2)"]  # a server that crashes 0.2 s after its start
    starts = []

    def start_crashing(_settings: Settings, **_) -> dict:
        process = subprocess.Popen(cmdline)
        starts.append(process)
        state = {"pid": process.pid, "boot_id": host.boot_id(), "cmdline": cmdline, "started_at": time.time(), "ready": True}
        write_state(settings, {**state, "instances": {"m": 0}})
        return {"action": "start", "reason": "server process is gone"}

    start_crashing(settings)
    monkeypatch.setattr(supervisor, "ensure_server", start_crashing)
    monkeypatch.setattr(supervisor, "MAX_BACKOFF_S", 0.0)  # the waits themselves: test_restarts_back_off_...
    watcher = Supervisor(settings, OpenAISpec())
    with pytest.raises(SystemExit):
        for _ in range(3 * supervisor.MAX_RESTARTS):
            time.sleep(0.4)
            watcher.step()
    assert len(starts) == 1 + supervisor.MAX_RESTARTS
    status = supervisor_status(settings)
    assert status["restarts"] == supervisor.MAX_RESTARTS and "gave up after" in status["gave_up"]["what"], status
    for process in starts:
        process.wait()


# ---------------------------------------------------------------- 4 and 6: a supervisor kept, or replaced for a new API key


def test_serve_keeps_a_running_supervisor_unless_the_api_key_changed(settings, fake_server, tmp_path, monkeypatch):
    server = fake_server(stubs=1, rendered=1)  # healthy: the supervisor only watches it
    spec = {  # as the Snakefile passes serve's params: to_param keeps tuples, the spec file reads back lists
        "server": to_param(settings.server), "models": ["m"], "work": str(settings.work), "repository": str(settings.repository),
        "openai": to_param(OpenAISpec(allowed_hosts=("models.example.test",))),
    }  # fmt: skip
    monkeypatch.setenv("HF2TRITON_API_KEY", "old-key")
    (tmp_path / "bin").mkdir()  # a wrong repair by the supervisor fails (and is recorded) instead of starting a real server
    (tmp_path / "bin" / "tritonserver").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "tritonserver").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(logs, "LOG_ROTATE_BYTES", 10)
    supervisor.log_file(settings).parent.mkdir(parents=True, exist_ok=True)
    supervisor.log_file(settings).write_text("an old supervisor's lines\n")
    try:
        assert ensure_supervisor(settings, spec).startswith("started")
        first = supervisor_status(settings)["pid"]
        assert Path(f"{supervisor.log_file(settings)}.1").read_text() == "an old supervisor's lines\n"
        time.sleep(2)  # it watches the stand-in server: it stays
        assert ensure_supervisor(settings, spec) == f"kept (pid {first})"
        monkeypatch.setenv("HF2TRITON_API_KEY", "new-key")
        assert ensure_supervisor(settings, spec).startswith("started")
        assert supervisor_status(settings)["pid"] != first and host.process_gone(first)
        assert server.poll() is None and supervisor_status(settings)["restarts"] == 0, supervisor.log_file(settings).read_text()
    finally:
        stop_supervisor(settings)


# ---------------------------------------------------------------- 2 and 6: the gateway's workers end with it


def test_a_killed_gateways_workers_are_replaced_and_stopped(settings, monkeypatch):
    """uvicorn's workers (`python -B -c ...`) outlive a killed gateway and keep its port: `serve` and the supervisor
    then found the port "in use by another program" for ever, and `make stop` left them serving."""
    openai = OpenAISpec(enabled=True, host="127.0.0.1", port=host.free_ports(1)[0], workers=2)
    monkeypatch.delenv("HF2TRITON_API_KEY", raising=False)
    monkeypatch.setattr(logs, "LOG_ROTATE_BYTES", 10)
    gateway_log(settings).parent.mkdir(parents=True, exist_ok=True)
    gateway_log(settings).write_text("an old gateway's lines\n")
    leaders: list[int] = []

    def kill_leader() -> list[int]:
        """SIGKILL the gateway itself (its parent waits for it, as a finished `serve` or the supervisor does)."""
        leader = leaders[-1]
        deadline = time.monotonic() + 30
        while len(group_members(leader)) < 3 and time.monotonic() < deadline:  # itself and its 2 workers
            time.sleep(0.1)
        os.kill(leader, signal.SIGKILL)
        os.waitpid(leader, 0)
        return group_members(leader)

    try:
        leaders.append(ensure_gateway(settings, openai)["pid"])
        assert Path(f"{gateway_log(settings)}.1").read_text() == "an old gateway's lines\n"
        assert len(kill_leader()) >= 2 and not host.port_is_free("127.0.0.1", openai.port), "its workers live on, on its port"
        leaders.append(ensure_gateway(settings, openai)["pid"])
        assert group_members(leaders[0]) == []
        workers = kill_leader()
        assert "workers left by a dead one" in stop_gateway(settings)
        assert not any(map(host.process_cmdline, workers)) and host.port_is_free("127.0.0.1", openai.port)
    finally:
        stop_gateway(settings)
        for leader in leaders:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGKILL)


# ---------------------------------------------------------------- 5, 6, 7


def test_terminate_does_not_wait_on_a_zombie():
    """A zombie (ended; its parent has not waited) has an empty command line, not none: terminate waited 35 s."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time; print(subprocess.Popen(['true']).pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        zombie = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while host.process_state(zombie) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.process_cmdline(zombie) in ([], None) and host.process_gone(zombie)  # (None: reaped meanwhile)
        started = time.monotonic()
        terminate(zombie, None)
        assert time.monotonic() - started < 2
    finally:
        parent.kill()
        parent.wait()


def test_logs_rotate_above_their_size_or_at_every_start(tmp_path):
    log = tmp_path / "gateway.log"
    logs.rotate(log)  # nothing to rotate
    log.write_text("small")
    logs.rotate(log)
    assert log.read_text() == "small" and not (tmp_path / "gateway.log.1").exists()
    logs.rotate(log, above_bytes=4)
    assert (tmp_path / "gateway.log.1").read_text() == "small" and not log.exists()
    log.write_text("")
    logs.rotate(log, above_bytes=0)  # tritonserver.log: one per start
    assert (tmp_path / "gateway.log.1").read_text() == "" and not log.exists()


def test_the_mps_daemon_gets_no_hub_token(tmp_path, monkeypatch):
    """It runs as long as the server: HF_TOKEN must not live on in it (logs.without_secrets, as tritonserver's)."""
    bin_dir = fake_mps_control(tmp_path, monkeypatch, 'env > "$(dirname "$0")/daemon.env"\nexit 1').parent
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 20)
    plan = mps.plan("auto", 2, tmp_path / "server")
    assert "-d failed" in mps.start(plan)
    environment = dict(line.split("=", 1) for line in (bin_dir / "daemon.env").read_text().splitlines() if "=" in line)
    assert "HF_TOKEN" not in environment and environment["CUDA_MPS_PIPE_DIRECTORY"] == plan.pipe_dir
    assert json.dumps(environment).count("hf_xxx") == 0


# ---------------------------------------------------------------- 8: another work directory of the same project

# A stand-in tritonserver: a real program at a path ending in /tritonserver (as /proc shows Triton's), so serve's own code
# starts, finds (by repository) and stops it; it answers every HTTP request on its --http-port with 200 (live, ready).
STAND_IN_TRITONSERVER = r"""
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *address = "127.0.0.1";
    int port = 0, on = 1;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--http-port=", 12)) port = atoi(argv[i] + 12);
        if (!strncmp(argv[i], "--http-address=", 15)) address = argv[i] + 15;
    }
    int server = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in where = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, address, &where.sin_addr);
    if (bind(server, (struct sockaddr *)&where, sizeof where) || listen(server, 16)) return 1;
    static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    char request[4096];
    for (;;) {
        int client = accept(server, NULL, NULL);
        if (client < 0) continue;
        if (read(client, request, sizeof request) > 0 && write(client, ok, sizeof ok - 1) < 0) return 1;
        close(client);
    }
}
"""


@pytest.fixture(scope="module")
def stand_in_bin(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("bin")
    (directory / "tritonserver.c").write_text(STAND_IN_TRITONSERVER)
    subprocess.run(["cc", "-o", str(directory / "tritonserver"), str(directory / "tritonserver.c")], check=True)
    return directory


@pytest.fixture
def work_dir(tmp_path, stand_in_bin, monkeypatch):
    """Settings of one project (tmp_path, its model_repository, one set of ports) in work directory `name`, as a config
    with that paths.work gives them; the stand-in tritonserver first on PATH, for the supervisors started meanwhile too.
    Afterwards every process of this project is killed, whatever the code under test left behind."""
    monkeypatch.setenv("PATH", f"{stand_in_bin}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "model_repository").mkdir()
    ports = host.free_ports(3)
    spec = ServerSpec(http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2], startup_timeout_s=30)
    made: list[Settings] = []

    def of(name: str) -> Settings:
        made.append(Settings.of(spec, [], str(tmp_path / name), str(tmp_path / "model_repository")))
        return made[-1]

    yield of
    for pid in host.pids():  # supervisors (their spec file) and servers (their repository) name the project directory
        if any(str(tmp_path) in part for part in host.process_cmdline(pid) or []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for settings in made:
        stop_gateway(settings)


def spec_of(settings: Settings, openai: OpenAISpec | None = None) -> dict:
    """serve's params, as it passes them to its supervisor."""
    return {
        "server": to_param(settings.server), "models": settings.models, "work": settings.work, "repository": settings.repository,
        "openai": to_param(openai or OpenAISpec()),
    }  # fmt: skip


def test_a_run_of_another_work_directory_takes_the_repository_over(work_dir):
    """`make serve` with another paths.work (troubleshooting's fix for "not enough disk") while serving: its validate's
    ensure_server replaced the server under its own lock; the old supervisor (its work directory's lock free) found the new
    server by repository, replaced it, the new supervisor replaced that one, and so on for ever."""
    old, new = work_dir("work-a"), work_dir("work-b")
    ensure_server(old)
    gateway = ensure_gateway(old, OpenAISpec(enabled=True, host="127.0.0.1", port=host.free_ports(1)[0]))["pid"]
    ensure_supervisor(old, spec_of(old))
    watching = supervisor_status(old)["pid"]
    server = ensure_server(new)  # validate's, under work-b's lock
    assert server["action"] == "start" and host.process_gone(watching), "the old supervisor is stopped before its server"
    assert host.process_gone(gateway) and "taken_over" not in server, "the old gateway (503 for ever, found by nothing) too"
    assert ensure_supervisor(new, spec_of(new)).startswith("started")
    time.sleep(3 * supervisor.POLL_S + 1)
    state = read_state(new)
    assert state["pid"] == server["pid"] and host.process_cmdline(state["pid"]) == state["cmdline"], "the new server serves on"
    assert find_ours(new).servers == (server["pid"],)
    assert supervisor_status(new)["running"] and supervisor_status(new)["restarts"] == 0, supervisor.log_file(new).read_text()


def test_a_supervisor_steps_aside_for_the_server_of_another_work_directory(work_dir):
    """Belt and braces, for a supervisor no run stopped (started by an older hf2triton): the server another work
    directory's state file describes is not its to replace."""
    old, new = work_dir("work-a"), work_dir("work-b")
    ensure_server(old)
    watcher = Supervisor(old, OpenAISpec())
    server = ensure_server(new)  # no supervisor process to stop: this one runs in the test
    assert watcher.superseded() == f"the server of {new.work} (pid {server['pid']}) serves {old.repository} now"
    with pytest.raises(UserError, match="serves"):
        ensure_server(old, take_over=False)  # a repair that looked before the new server started
    with pytest.raises(SystemExit) as exited:
        watcher.step()
    assert exited.value.code == 0 and host.process_cmdline(server["pid"]) == server["cmdline"]


def test_stop_stops_the_supervisors_of_every_work_directory(work_dir):
    """`make stop` of a config with another paths.work stopped its own (none) and the server (found by repository):
    the supervisor of the first work directory started it again."""
    old, new = work_dir("work-a"), work_dir("work-b")
    ensure_server(old)
    ensure_supervisor(old, spec_of(old))
    message = stop_step(to_param(new.server), new.models, new.work, new.repository)
    assert f"{old.work}: stopped the supervisor" in message and "stopped tritonserver" in message, message
    time.sleep(3 * supervisor.POLL_S + 1)
    assert find_supervisors(old.repository) == [] and find_ours(old).servers == ()


def test_make_stop_stops_everything_whatever_the_config_says(work_dir, tmp_path, monkeypatch):
    """A typo in config.yaml made while serving: snakemake's stop failed parsing it, and the supervisor kept everything
    running. Its paths.work is unknown now: what runs is found from the supervisor's spec file and the server's place."""
    settings = work_dir("elsewhere")
    openai = OpenAISpec(enabled=True, host="127.0.0.1", port=host.free_ports(1)[0])
    monkeypatch.delenv("HF2TRITON_API_KEY", raising=False)
    ensure_server(settings)
    ensure_gateway(settings, openai)
    ensure_supervisor(settings, spec_of(settings, openai))
    (tmp_path / "Snakefile").write_text((ROOT / "Snakefile").read_text())  # a copy: its directory's config.yaml is read
    for name in ("rules", "scripts", "envs"):  # the rest of the project, as a checkout has it
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "config.yaml").write_text("paths: {work: elsewhere}\nserver: {http_port: 8000\n")
    environment = {name: value for name, value in os.environ.items() if name != "HF2TRITON_CONFIG"}
    command = ["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "-C", str(tmp_path), "stop", f"VENV={ROOT / '.venv'}"]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hf2triton: error:" in result.stderr and "snakemake's stop failed" in result.stderr, result.stderr
    for what in ("stopped the supervisor", "stopped the gateway", "stopped tritonserver"):
        assert what in result.stdout, result.stdout
    time.sleep(3 * supervisor.POLL_S + 1)
    assert find_supervisors(settings.repository) == [] and find_ours(settings).servers == () and not gateway_alive(settings)
    assert host.port_is_free("127.0.0.1", openai.port) and host.port_is_free("127.0.0.1", settings.server.http_port)
